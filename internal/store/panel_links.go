package store

import (
	"context"
	"time"
)

// RevokePanelLinksParams revoke a tenant's panel links issued before At.
type RevokePanelLinksParams struct {
	TenantID string
	At       time.Time
}

// RevokePanelLinks moves the tenant's PanelLinksValidAfter to At (never back: a later
// revocation stays in force) and returns the tenant as stored; agentqtype.ErrNotFound
// when there is no such tenant, ErrNoTenant for an empty id.
func (s *Store) RevokePanelLinks(ctx context.Context, p RevokePanelLinksParams) (Tenant, error) {
	if p.TenantID == "" {
		return Tenant{}, ErrNoTenant
	}
	return scanTenant(s.db.QueryRow(ctx, `
		UPDATE tenants SET
			panel_links_valid_after = GREATEST(panel_links_valid_after, $2),
			updated_at = now()
		WHERE id = $1 RETURNING `+tenantCols, p.TenantID, p.At))
}
