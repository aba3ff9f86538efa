-- +goose Up
CREATE TABLE tenants (
    id          text PRIMARY KEY CHECK (id ~ '^[a-zA-Z0-9][a-zA-Z0-9_-]{0,62}$'),
    name        text NOT NULL,
    plan        text NOT NULL,
    weight      integer CHECK (weight IS NULL OR weight BETWEEN 1 AND 1000),
    overrides   jsonb NOT NULL DEFAULT '{}'::jsonb,
    status      text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'suspended')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    kid          text PRIMARY KEY,
    tenant_id    text NOT NULL REFERENCES tenants (id),
    secret_hash  bytea NOT NULL,
    scopes       jsonb NOT NULL DEFAULT '{}'::jsonb,
    limits       jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    rotated_at   timestamptz,
    revoked_at   timestamptz
);
CREATE INDEX api_keys_tenant_idx ON api_keys (tenant_id);

CREATE TABLE tasks (
    id               uuid PRIMARY KEY,
    tenant_id        text NOT NULL REFERENCES tenants (id),
    kid              text NOT NULL,
    agent            text NOT NULL,
    user_id          text NOT NULL DEFAULT '',
    input            jsonb NOT NULL DEFAULT '{}'::jsonb,
    budget           jsonb NOT NULL DEFAULT '{}'::jsonb,
    priority         smallint NOT NULL DEFAULT 5,
    idempotency_key  text,
    request_hash     bytea NOT NULL,
    state            text NOT NULL DEFAULT 'queued'
        CHECK (state IN ('queued', 'running', 'completed', 'failed', 'killed', 'budget_exceeded', 'abandoned')),
    agent_state      jsonb,
    output           jsonb,
    error            text,
    steps            integer NOT NULL DEFAULT 0,
    tokens           bigint NOT NULL DEFAULT 0,
    cost_micro_usd   bigint NOT NULL DEFAULT 0,
    attempt          integer NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    heartbeat_at     timestamptz
);
CREATE UNIQUE INDEX tasks_idempotency_idx ON tasks (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX tasks_tenant_list_idx ON tasks (tenant_id, id DESC);
CREATE INDEX tasks_tenant_state_idx ON tasks (tenant_id, state, id DESC);
CREATE INDEX tasks_live_idx ON tasks (state, created_at) WHERE state IN ('queued', 'running');

-- +goose Down
DROP TABLE tasks;
DROP TABLE api_keys;
DROP TABLE tenants;
