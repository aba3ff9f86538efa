-- +goose Up
-- Ledger rows are written in the same statement as the task update they belong to
-- (the end) or in the transaction that locks the task row (a step), so they never
-- name a missing task. The foreign key re-checked that for each of a step's three
-- rows: three lookups and a row lock on the task per step, on the hottest statement.
-- Without it, deleting finished tasks leaves their ledger rows, which billing keeps.
ALTER TABLE usage_ledger DROP CONSTRAINT IF EXISTS usage_ledger_task_id_fkey;

-- +goose Down
ALTER TABLE usage_ledger ADD CONSTRAINT usage_ledger_task_id_fkey FOREIGN KEY (task_id) REFERENCES tasks (id) NOT VALID;
