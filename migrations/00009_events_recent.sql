-- +goose Up
-- The usage report and the tenant panel show a tenant's latest events of a type,
-- newest first; the feed index (tenant_id, xid, seq) does not serve that order.
CREATE INDEX events_tenant_recent_idx ON events (tenant_id, type, seq DESC);

-- +goose Down
DROP INDEX events_tenant_recent_idx;
