-- +goose Up
-- Refused admissions, counted per tenant, limit and minute. Admission counts them in
-- Redis (no Postgres write per refusal); a janitor pass copies the counts here. The
-- counts it copies only grow within a minute, so a copy keeps the larger of the two
-- (GREATEST): copying twice, or a copy racing another, never adds anything twice.
CREATE TABLE limit_rejections (
    tenant_id  text NOT NULL,
    limit_type text NOT NULL,
    minute     timestamptz NOT NULL,
    count      bigint NOT NULL CHECK (count >= 0),
    PRIMARY KEY (tenant_id, minute, limit_type)
);

-- +goose Down
DROP TABLE limit_rejections;
