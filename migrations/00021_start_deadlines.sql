-- +goose Up
-- A task may be submitted with a start deadline (start_within_s): one not started by
-- then ends as 'expired' instead of running late. start_deadline is created_at plus
-- the seconds asked for; NULL for a task without one.
ALTER TABLE tasks ADD COLUMN start_deadline timestamptz;

-- The expiry pass runs every second on queued tasks past their deadline: the few
-- tasks that carry one and have not started yet, in deadline order.
CREATE INDEX tasks_start_deadline_idx ON tasks (start_deadline)
    WHERE state = 'queued' AND start_deadline IS NOT NULL AND started_at IS NULL;

-- 'expired' joins the states the check allows. The check is rebuilt from the one in
-- place, so that states other migrations allow stay allowed.
-- +goose StatementBegin
DO $$
DECLARE def text;
BEGIN
    SELECT pg_get_constraintdef(oid) INTO def FROM pg_constraint
    WHERE conrelid = 'tasks'::regclass AND conname = 'tasks_state_check';
    IF def IS NULL OR position('''expired''' IN def) > 0 THEN
        RETURN;
    END IF;
    ALTER TABLE tasks DROP CONSTRAINT tasks_state_check;
    EXECUTE 'ALTER TABLE tasks ADD CONSTRAINT tasks_state_check '
        || replace(def, '''abandoned''::text', '''abandoned''::text, ''expired''::text');
END $$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
DECLARE def text;
BEGIN
    SELECT pg_get_constraintdef(oid) INTO def FROM pg_constraint
    WHERE conrelid = 'tasks'::regclass AND conname = 'tasks_state_check';
    IF def IS NULL THEN
        RETURN;
    END IF;
    ALTER TABLE tasks DROP CONSTRAINT tasks_state_check;
    EXECUTE 'ALTER TABLE tasks ADD CONSTRAINT tasks_state_check '
        || replace(def, ', ''expired''::text', '');
END $$;
-- +goose StatementEnd
DROP INDEX tasks_start_deadline_idx;
ALTER TABLE tasks DROP COLUMN start_deadline;
