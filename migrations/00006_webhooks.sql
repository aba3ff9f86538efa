-- +goose Up
-- Webhook delivery of the events outbox. An endpoint receives the events of its types
-- (of one tenant, or of every tenant when tenant_id is null) written after it was
-- created: those whose transaction got its id after the endpoint's did (start_xid), a
-- rule in the feed's own order. secret signs every request; after a rotation the
-- previous secret signs too until previous_secret_expires_at, so receivers can switch
-- without losing a delivery.
CREATE TABLE webhook_endpoints (
    id                         uuid PRIMARY KEY,
    url                        text NOT NULL,
    types                      text[] NOT NULL CHECK (cardinality(types) > 0),
    tenant_id                  text REFERENCES tenants (id),
    secret                     text NOT NULL,
    previous_secret            text,
    previous_secret_expires_at timestamptz,
    start_xid                  xid8 NOT NULL DEFAULT pg_current_xact_id(),
    disabled_at                timestamptz,
    disabled_reason            text,
    created_at                 timestamptz NOT NULL DEFAULT now(),
    updated_at                 timestamptz NOT NULL DEFAULT now()
);

-- The relays' shared position in the events feed: the fan-out locks it, reads the
-- events after it, writes one delivery per matching endpoint and moves it, all in one
-- transaction, so each event is fanned out once however many relays run. It starts at
-- this migration: no endpoint is older, so no earlier event has one to go to.
CREATE TABLE webhook_fanout_cursor (
    id  boolean PRIMARY KEY DEFAULT true CHECK (id),
    xid xid8 NOT NULL,
    seq bigint NOT NULL
);
INSERT INTO webhook_fanout_cursor (xid, seq) VALUES (pg_current_xact_id(), 0);

-- One event to one endpoint. A relay claims a due pending delivery by setting
-- lease_id and locked_until (under FOR UPDATE SKIP LOCKED), so no two relays send it
-- at once; a relay that dies mid-send leaves it to be claimed again once the lease
-- lapses (at least once). attempts counts claims, so a crash counts too.
CREATE TABLE webhook_deliveries (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id     uuid NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    event_seq       bigint NOT NULL REFERENCES events (seq),
    event_id        text NOT NULL,
    state           text NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'succeeded', 'failed', 'cancelled')),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    lease_id        uuid,
    locked_until    timestamptz,
    last_status     integer,
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    UNIQUE (endpoint_id, event_seq)
);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';

-- Every attempt to send a delivery, as the relay saw it: the answer's status, or the
-- error when there was none (never a secret), and what was decided.
CREATE TABLE webhook_attempts (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id  bigint NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    endpoint_id  uuid NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    event_id     text NOT NULL,
    attempt      integer NOT NULL,
    attempted_at timestamptz NOT NULL,
    status_code  integer,
    error        text,
    duration_ms  bigint NOT NULL,
    result       text NOT NULL CHECK (result IN ('succeeded', 'retrying', 'failed', 'gone'))
);
CREATE INDEX webhook_attempts_endpoint_idx ON webhook_attempts (endpoint_id, id DESC);

-- +goose Down
DROP TABLE webhook_attempts;
DROP TABLE webhook_deliveries;
DROP TABLE webhook_fanout_cursor;
DROP TABLE webhook_endpoints;
