-- +goose Up
-- Model pools: a shared token capacity (an upstream model's rate limit) every
-- tenant's steps draw on, and the agents whose steps draw on one. They are the
-- deployment's configuration, not a tenant's data: global, edited by the operator.
-- The live state of a pool (its bucket, effective rate, waiting tenants) lives in
-- Redis; these rows are what it is configured to. NULL burst_tokens is one minute's
-- worth; NULL requests_per_minute is no request limit.
CREATE TABLE pools (
    name                text PRIMARY KEY,
    tokens_per_minute   bigint NOT NULL CHECK (tokens_per_minute > 0),
    burst_tokens        bigint CHECK (burst_tokens > 0),
    requests_per_minute bigint CHECK (requests_per_minute > 0),
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- An agent's steps reserve tokens_per_step from its pool before they run (the
-- estimate a step settles against afterwards). Deleting a pool unbinds its agents.
CREATE TABLE agent_pools (
    agent           text PRIMARY KEY,
    pool            text NOT NULL REFERENCES pools (name) ON DELETE CASCADE,
    tokens_per_step bigint NOT NULL CHECK (tokens_per_step > 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- A pool's agents, for its answer and the cascade.
CREATE INDEX agent_pools_pool_idx ON agent_pools (pool, agent);

-- +goose Down
DROP TABLE agent_pools;
DROP TABLE pools;
