-- +goose Up
-- The late-start pass looks, tenant by tenant, at the queued tasks that never started:
-- first the tenants that have any (one index probe each, skipping from one tenant to
-- the next), then a committing tenant's tasks whose commitment lapsed, oldest first.
CREATE INDEX tasks_first_start_idx ON tasks (tenant_id, created_at)
    WHERE state = 'queued' AND started_at IS NULL;

-- +goose Down
DROP INDEX tasks_first_start_idx;
