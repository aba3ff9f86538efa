-- +goose Up
-- The relays claim due deliveries endpoint by endpoint, a few of each at a time, so
-- that one endpoint's backlog cannot fill a claim: each claim reads the oldest due
-- pending deliveries of one endpoint from this index, however many it has.
CREATE INDEX webhook_deliveries_endpoint_due_idx ON webhook_deliveries (endpoint_id, next_attempt_at, id)
    WHERE state = 'pending';

-- The deliveries a relay holds under a lease, by endpoint: the claim counts an
-- endpoint's live leases, across every relay, against its in-flight cap. Only the
-- leased rows are in it, so it stays as small as the sends in flight.
CREATE INDEX webhook_deliveries_leased_idx ON webhook_deliveries (endpoint_id, locked_until)
    WHERE state = 'pending' AND locked_until IS NOT NULL;

-- +goose Down
DROP INDEX webhook_deliveries_leased_idx;
DROP INDEX webhook_deliveries_endpoint_due_idx;
