-- +goose Up
-- A tenant may register endpoints of its own, for its own events, next to the
-- operator's. tenant_owned marks them: they always name their tenant (so the fan-out
-- gives them that tenant's events only), the tenant's API lists and changes only
-- them, and they count against the tenant's webhook_endpoints limit.
ALTER TABLE webhook_endpoints ADD COLUMN tenant_owned boolean NOT NULL DEFAULT false;
ALTER TABLE webhook_endpoints ADD CONSTRAINT webhook_endpoints_tenant_owned_check
    CHECK (NOT tenant_owned OR tenant_id IS NOT NULL);

-- A tenant's own endpoints, for its list and the count its limit is checked against.
CREATE INDEX webhook_endpoints_tenant_owned_idx ON webhook_endpoints (tenant_id, created_at, id)
    WHERE tenant_owned;

-- +goose Down
DROP INDEX webhook_endpoints_tenant_owned_idx;
ALTER TABLE webhook_endpoints DROP CONSTRAINT webhook_endpoints_tenant_owned_check;
ALTER TABLE webhook_endpoints DROP COLUMN tenant_owned;
