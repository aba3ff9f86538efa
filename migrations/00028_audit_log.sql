-- +goose Up
-- The audit log: one row per change an operator, a tenant's key, a signed link or the
-- command line made to the deployment's configuration or a tenant's spending power,
-- written in the transaction of the change, so the row and the change commit or roll
-- back together.
--
-- A hash chain. hash is the SHA-256 of the row's content (every column, the jsonb ones
-- in a canonical encoding; internal/audit says which) and of prev_hash, the hash of the
-- row before it. Appends take the one row of audit_head FOR UPDATE first, so they
-- follow one another: the chain's order is id order, and audit_head always names the
-- last row and its hash. A row altered, or removed from the middle, breaks the chain
-- at the next row; the last row removed leaves audit_head naming a row that is gone;
-- a tail cut off together with audit_head's row put back is caught against a head the
-- operator kept (`agentq admin audit verify --expect-head`).
--
-- No retention: rows are never updated or deleted (the triggers refuse it, TRUNCATE
-- too). Dropping old rows would cut the chain at its start; see docs/operations.md.
CREATE TABLE audit_log (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at            timestamptz NOT NULL,
    actor         jsonb NOT NULL,
    claimed_actor text NOT NULL DEFAULT '',
    reason        text NOT NULL DEFAULT '',
    action        text NOT NULL,
    object        jsonb NOT NULL,
    before        jsonb,
    after         jsonb,
    request_id    text NOT NULL DEFAULT '',
    -- reverts is the row a revert undid; null for every other change.
    reverts       bigint,
    prev_hash     text NOT NULL,
    hash          text NOT NULL UNIQUE
);
-- The filters of GET /v1/admin/audit, newest first.
CREATE INDEX audit_log_tenant_idx ON audit_log ((object ->> 'tenant'), id DESC);
CREATE INDEX audit_log_object_idx ON audit_log ((object ->> 'kind'), (object ->> 'id'), id DESC);
CREATE INDEX audit_log_actor_idx ON audit_log ((actor ->> 'name'), id DESC);

-- The chain's head: the last row's id and hash (0 and the genesis hash before the
-- first). Appends lock it, read it and move it; it only moves forward.
CREATE TABLE audit_head (
    one     boolean PRIMARY KEY DEFAULT true CHECK (one),
    last_id bigint NOT NULL,
    hash    text NOT NULL
);
INSERT INTO audit_head (last_id, hash) VALUES (0, repeat('0', 64));

-- +goose StatementBegin
CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();

-- +goose StatementBegin
CREATE FUNCTION audit_head_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'UPDATE' OR NEW.last_id <= OLD.last_id THEN
        RAISE EXCEPTION 'audit_head only moves forward: % refused', TG_OP;
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER audit_head_forward_only BEFORE UPDATE OR DELETE ON audit_head
    FOR EACH ROW EXECUTE FUNCTION audit_head_forward_only();
CREATE TRIGGER audit_head_no_truncate BEFORE TRUNCATE ON audit_head
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();

-- Events some readers must not see: a tenant.limits_changed is written twice, the
-- operators' copy (admin feed, operator endpoints) naming who made the change and why,
-- and the tenant's copy (its feed, its own endpoints) without them.
ALTER TABLE events ADD COLUMN audience text NOT NULL DEFAULT 'all'
    CHECK (audience IN ('all', 'operator', 'tenant'));

-- +goose Down
ALTER TABLE events DROP COLUMN audience;
DROP TABLE audit_head;
DROP FUNCTION audit_head_forward_only();
DROP TABLE audit_log;
DROP FUNCTION audit_log_append_only();
