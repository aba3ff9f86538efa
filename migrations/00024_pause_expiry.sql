-- +goose Up
-- A paused task ends budget_exceeded once it has been paused for its plan's
-- pause_timeout_s. pause_expires_at is when, set with the pause from the timeout in
-- force then, so that the pause watcher ends every overdue pause in one statement on
-- an index, instead of reading every paused task and its plan. Pauses written before
-- this column take the default timeout (24 h) from their pause.
ALTER TABLE tasks ADD COLUMN pause_expires_at timestamptz;
UPDATE tasks SET pause_expires_at = paused_at + interval '24 hours' WHERE state = 'paused';
CREATE INDEX tasks_pause_expiry_idx ON tasks (pause_expires_at) WHERE state = 'paused';
-- The tenants with tasks paused by a period quota, which the watcher looks at when
-- something that could lift the quota changed.
CREATE INDEX tasks_quota_paused_idx ON tasks (tenant_id)
    WHERE state = 'paused' AND paused_reason IN ('agent_steps_daily', 'ai_tokens_monthly', 'usd_monthly');

-- +goose Down
DROP INDEX tasks_quota_paused_idx;
DROP INDEX tasks_pause_expiry_idx;
ALTER TABLE tasks DROP COLUMN pause_expires_at;
