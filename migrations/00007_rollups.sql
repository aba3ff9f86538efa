-- +goose Up
-- A tenant's billing anchor: the day of the month its billing periods start on (1 to
-- 31, clamped to the month's last day; NULL: the day of created_at, in UTC) and the
-- IANA time zone whose midnight starts them (NULL: UTC).
ALTER TABLE tenants
    ADD COLUMN billing_day smallint CHECK (billing_day BETWEEN 1 AND 31),
    ADD COLUMN time_zone text CHECK (time_zone <> '');

-- Rollups of the usage ledger, kept current by the transaction that records a step
-- (only when its ledger rows were inserted, so a retried step counts once) and
-- rebuildable from the ledger, which stays the truth. Money in integer micro-dollars.
--
-- Per UTC hour: the sliding day of the daily steps quota is the 24 hours ending with
-- the current one.
CREATE TABLE usage_rollup_hourly (
    tenant_id      text NOT NULL,
    hour           timestamptz NOT NULL,
    steps          bigint NOT NULL DEFAULT 0,
    tokens         bigint NOT NULL DEFAULT 0,
    cost_micro_usd bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, hour)
);

-- Per day of the tenant's own zone.
CREATE TABLE usage_rollup_daily (
    tenant_id      text NOT NULL,
    day            date NOT NULL,
    steps          bigint NOT NULL DEFAULT 0,
    tokens         bigint NOT NULL DEFAULT 0,
    cost_micro_usd bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, day)
);

-- Per billing period: period_id is the start date in the tenant's zone (yyyymmdd), the
-- quota counters' period id.
CREATE TABLE usage_rollup_period (
    tenant_id      text NOT NULL,
    period_start   timestamptz NOT NULL,
    period_end     timestamptz NOT NULL,
    period_id      text NOT NULL,
    steps          bigint NOT NULL DEFAULT 0,
    tokens         bigint NOT NULL DEFAULT 0,
    cost_micro_usd bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, period_start),
    CHECK (period_end > period_start)
);

-- +goose Down
DROP TABLE usage_rollup_period;
DROP TABLE usage_rollup_daily;
DROP TABLE usage_rollup_hourly;
ALTER TABLE tenants DROP COLUMN time_zone, DROP COLUMN billing_day;
