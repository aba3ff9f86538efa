-- +goose Up
-- What the janitor corrected, one row per pass run that corrected something (runs
-- that found nothing write nothing), so the operator view can show it whichever
-- process leads the janitor. corrections maps a kind of drift to how much was fixed
-- (the janitor's drift metric, by kind). Rows older than 30 days are deleted by the
-- insert that writes a new one.
CREATE TABLE janitor_runs (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pass        text NOT NULL,
    ran_at      timestamptz NOT NULL DEFAULT now(),
    corrections jsonb NOT NULL
);
CREATE INDEX janitor_runs_ran_at_idx ON janitor_runs (ran_at);

-- The operator view's worker-seconds of the last minutes read the tasks that ended
-- in the window; running and queued ones come from tasks_live_idx. Finish times only
-- grow, so each end appends to the right edge of this index.
CREATE INDEX tasks_finished_idx ON tasks (finished_at) WHERE finished_at IS NOT NULL;

-- The operator view counts each endpoint's failed deliveries; failures are rare, so
-- this index costs nothing on the deliveries that succeed.
CREATE INDEX webhook_deliveries_failed_idx ON webhook_deliveries (endpoint_id) WHERE state = 'failed';

-- +goose Down
DROP INDEX webhook_deliveries_failed_idx;
DROP INDEX tasks_finished_idx;
DROP TABLE janitor_runs;
