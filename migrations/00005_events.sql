-- +goose Up
-- The events outbox: one row per event, written in the transaction of the change that
-- caused it, so a rolled-back change leaves none. Append-only: payload is the exact
-- bytes of the CloudEvent, and a resend sends them again, so no row is ever updated
-- (the trigger below refuses it). Delivery state belongs in tables of its own.
--
-- Feed order. seq is an identity, but identity values are taken when a row is
-- inserted, not when it commits: a reader that had passed seq 7 would never see a
-- seq 6 committed after it. So each row keeps the id of its writing transaction
-- (xid), and the feeds read only rows whose transaction is older than every one still
-- in flight (xid < pg_snapshot_xmin(pg_current_snapshot())), ordered by (xid, seq).
-- Behind that horizon nothing can be added: every transaction there has ended, and
-- a new transaction's id is above it.
CREATE TABLE events (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    xid        xid8 NOT NULL DEFAULT pg_current_xact_id(),
    id         text NOT NULL UNIQUE,
    tenant_id  text NOT NULL,
    type       text NOT NULL,
    dedupe_key text NOT NULL UNIQUE,
    payload    bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX events_feed_idx ON events (xid, seq);
CREATE INDEX events_tenant_feed_idx ON events (tenant_id, xid, seq);

-- +goose StatementBegin
CREATE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'events are append-only: a written event never changes';
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER events_append_only BEFORE UPDATE ON events
    FOR EACH ROW EXECUTE FUNCTION events_append_only();

-- +goose Down
DROP TABLE events;
DROP FUNCTION events_append_only();
