-- +goose Up
-- IF [NOT] EXISTS throughout: other migrations may add or drop indexes of these
-- tables, and this one must apply after them either way.
-- The operator view counts every tenant's usage.limit_hit events of the last 24 hours.
-- events_tenant_recent_idx orders a tenant's events of a type by seq, not time, so the
-- count read each tenant's whole history of that type, or the whole table; this one
-- reads the window alone, and holds the tenant, so the count never visits the table.
CREATE INDEX IF NOT EXISTS events_type_time_idx ON events (type, created_at) INCLUDE (tenant_id);

-- The operator view counts each endpoint's pending deliveries, and those of them that
-- are retrying: webhook_deliveries_due_idx holds every endpoint's pending deliveries
-- in due order, so each endpoint's count read them all. This one reads the endpoint's
-- own, and holds the columns the retrying count looks at, so neither visits the table.
CREATE INDEX IF NOT EXISTS webhook_deliveries_pending_idx ON webhook_deliveries (endpoint_id) INCLUDE (attempts, lease_id)
    WHERE state = 'pending';

-- The operator view looks for each endpoint's last failure among its last attempts.
-- With only the attempts' ids and results in this index that look never visits the
-- table, so Postgres no longer prefers walking every endpoint's attempts backwards by
-- id (the primary key), which for a quiet endpoint next to a busy one read all of the
-- busy one's. It also serves the attempts listing, as the index it replaces did.
CREATE INDEX IF NOT EXISTS webhook_attempts_endpoint_result_idx ON webhook_attempts (endpoint_id, id DESC) INCLUDE (result);
DROP INDEX IF EXISTS webhook_attempts_endpoint_idx;

-- The retention pass deletes finished deliveries oldest first, in small batches; a
-- pending delivery is never deleted, so it is not in this index.
CREATE INDEX IF NOT EXISTS webhook_deliveries_finished_idx ON webhook_deliveries (finished_at) WHERE state <> 'pending';

-- A delivery's attempts are deleted with it (ON DELETE CASCADE, and the retention
-- pass deletes them first): without an index on delivery_id each deleted delivery
-- scanned the attempts table.
CREATE INDEX IF NOT EXISTS webhook_attempts_delivery_idx ON webhook_attempts (delivery_id);

-- +goose Down
CREATE INDEX IF NOT EXISTS webhook_attempts_endpoint_idx ON webhook_attempts (endpoint_id, id DESC);
DROP INDEX IF EXISTS webhook_attempts_endpoint_result_idx;
DROP INDEX IF EXISTS webhook_attempts_delivery_idx;
DROP INDEX IF EXISTS webhook_deliveries_finished_idx;
DROP INDEX IF EXISTS webhook_deliveries_pending_idx;
DROP INDEX IF EXISTS events_type_time_idx;
