-- +goose Up
-- Tenant panel links are signed, not stored; an admin revokes a tenant's links by
-- moving this mark to now: a link issued before it is refused. NULL: no link of the
-- tenant was ever revoked. It sits on the tenant row so the panel reads it with the
-- tenant, through the tenant cache, at no extra query per request.
ALTER TABLE tenants ADD COLUMN panel_links_valid_after timestamptz;

-- +goose Down
ALTER TABLE tenants DROP COLUMN panel_links_valid_after;
