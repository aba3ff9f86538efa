-- +goose Up
-- A task that pauses or parks keeps what its next step is expected to take, so the
-- delivery that resumes it reserves the same and a resume is judged against it:
-- step_estimate (tokens) was kept for a parked task only; step_cost_estimate is the
-- step's cost in micro-dollars (what the previous step cost). A pause now writes
-- both. NULL: nothing kept (the delivery estimates afresh).
ALTER TABLE tasks ADD COLUMN step_cost_estimate bigint;

-- +goose Down
ALTER TABLE tasks DROP COLUMN step_cost_estimate;
