-- +goose Up
-- A task's tenant is checked where the task is made (its API key names an existing
-- tenant, and tenants are never deleted), so the foreign key from tasks to tenants
-- only cost: every insert took a KEY SHARE lock on its tenant's row, and a tenant's
-- concurrent submissions turned that lock into a multixact on one hot row.
ALTER TABLE tasks DROP CONSTRAINT IF EXISTS tasks_tenant_id_fkey;

-- +goose Down
ALTER TABLE tasks ADD CONSTRAINT tasks_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES tenants (id) NOT VALID;
