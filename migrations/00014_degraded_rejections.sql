-- +goose Up
-- Admissions an API replica refused in process while Redis was unreachable (degraded
-- mode: the platform refused them, not the tenant's plan), counted per tenant, limit,
-- minute and replica. Each replica keeps its own counts in memory and copies them
-- here; a replica's count of a minute only grows, so a copy keeps the larger of the
-- two (GREATEST) and copying twice adds nothing twice, while the counts of several
-- replicas add up as rows of their own.
CREATE TABLE degraded_rejections (
    tenant_id  text NOT NULL,
    limit_type text NOT NULL,
    minute     timestamptz NOT NULL,
    replica    text NOT NULL,
    count      bigint NOT NULL CHECK (count >= 0),
    PRIMARY KEY (tenant_id, minute, limit_type, replica)
);

-- +goose Down
DROP TABLE degraded_rejections;
