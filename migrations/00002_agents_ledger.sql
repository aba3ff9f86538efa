-- +goose Up
CREATE TABLE agents (
    name           text PRIMARY KEY CHECK (name ~ '^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$'),
    url            text NOT NULL,
    step_timeout_s double precision NOT NULL DEFAULT 30 CHECK (step_timeout_s > 0 AND step_timeout_s <= 3600),
    headers        jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- One row per (task, step, meter): recording a step twice writes nothing the second
-- time. Billing reads it; money is in integer micro-dollars.
CREATE TABLE usage_ledger (
    task_id     uuid NOT NULL REFERENCES tasks (id),
    step        integer NOT NULL,
    meter       text NOT NULL CHECK (meter IN ('steps', 'tokens', 'cost_micro_usd')),
    tenant_id   text NOT NULL,
    quantity    bigint NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, step, meter)
);
CREATE INDEX usage_ledger_tenant_time_idx ON usage_ledger (tenant_id, recorded_at);

-- +goose Down
DROP TABLE usage_ledger;
DROP TABLE agents;
