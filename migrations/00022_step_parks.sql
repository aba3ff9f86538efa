-- +goose Up
-- A step that waits for token capacity may park more than once before it runs:
-- park_step is the step count a task had when it last parked (its next step is the
-- one that waited), step_parks how many times it parked for that step. The worker
-- meters the parks of each step it runs, so that a step sent back again and again
-- (each time a round trip through Postgres) shows.
ALTER TABLE tasks ADD COLUMN park_step integer, ADD COLUMN step_parks integer NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE tasks DROP COLUMN park_step, DROP COLUMN step_parks;
