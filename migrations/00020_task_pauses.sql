-- +goose Up
-- A task whose next step would go past its budget or its tenant's period quota is
-- paused when its plan says so (on_limit: pause): it keeps its state and usage and
-- holds no worker, running slot or session until it is resumed. paused_reason is the
-- limit_type that paused it, paused_at when, pause_limit and pause_used the limit's
-- value and the use that met it (as the stop's event carries them), and pauses
-- counts the task's pauses: an approval link names the pause it was made for, so a
-- link of an earlier pause cannot resume a later one.
ALTER TABLE tasks DROP CONSTRAINT tasks_state_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_state_check
    CHECK (state IN ('queued', 'running', 'paused', 'completed', 'failed', 'killed', 'budget_exceeded', 'abandoned'));
ALTER TABLE tasks
    ADD COLUMN paused_reason text,
    ADD COLUMN paused_at timestamptz,
    ADD COLUMN pause_limit bigint,
    ADD COLUMN pause_used bigint,
    ADD COLUMN pauses integer NOT NULL DEFAULT 0;
-- The pause watcher reads paused tasks every second: resumes those whose quota
-- allows again, ends those paused too long.
CREATE INDEX tasks_paused_idx ON tasks (id) WHERE state = 'paused';

-- +goose Down
DROP INDEX tasks_paused_idx;
ALTER TABLE tasks
    DROP COLUMN paused_reason,
    DROP COLUMN paused_at,
    DROP COLUMN pause_limit,
    DROP COLUMN pause_used,
    DROP COLUMN pauses;
ALTER TABLE tasks DROP CONSTRAINT tasks_state_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_state_check
    CHECK (state IN ('queued', 'running', 'completed', 'failed', 'killed', 'budget_exceeded', 'abandoned'));
