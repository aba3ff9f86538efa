-- +goose Up
-- Every start and end of a task moves it to another state, so neither update is
-- heap-only and each writes an entry in every index of tasks whose predicate holds.
-- tasks_tenant_list_idx (tenant_id, id DESC) only served the listing of a tenant's
-- tasks in every state; the listing reads tasks_tenant_state_idx instead, one scan a
-- state merged in id order, and each task writes three index entries fewer.
DROP INDEX IF EXISTS tasks_tenant_list_idx;

-- +goose Down
CREATE INDEX IF NOT EXISTS tasks_tenant_list_idx ON tasks (tenant_id, id DESC);
