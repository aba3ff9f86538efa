-- +goose Up
-- A step that cannot get token capacity sends its task back to queued until the
-- capacity is expected ("parking"): wait_reason names the capacity it waits for
-- ('tokens_per_minute' or 'pool:<name>'), wait_until when it is expected, parked_at
-- when the wait began. waited_ms sums the task's waits: they are not charged to its
-- wall-clock budget. step_estimate is the tokens the waiting step asked for, so the
-- delivery that resumes the task asks for the same.
ALTER TABLE tasks
    ADD COLUMN wait_reason text,
    ADD COLUMN wait_until timestamptz,
    ADD COLUMN parked_at timestamptz,
    ADD COLUMN waited_ms bigint NOT NULL DEFAULT 0,
    ADD COLUMN step_estimate bigint;

-- +goose Down
ALTER TABLE tasks
    DROP COLUMN wait_reason,
    DROP COLUMN wait_until,
    DROP COLUMN parked_at,
    DROP COLUMN waited_ms,
    DROP COLUMN step_estimate;
