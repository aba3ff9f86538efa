package tenants

import (
	"context"
	"time"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/internal/store"
)

// RevokePanelLinks revokes every panel link of tenant id issued before at (the panel
// signer's clock, which stamps the links): they are refused from then on, on every
// process at once when an Invalidator is set (else within the cache TTL), while links
// issued afterwards work. Revoking again moves the mark forward, never back.
func (s *Service) RevokePanelLinks(ctx context.Context, id string, at time.Time) (Tenant, error) {
	if id == "" {
		return Tenant{}, agentqtype.ErrNotFound
	}
	var t Tenant
	err := s.store.InTx(ctx, func(tx *store.Store) error {
		old, err := tx.LockTenant(ctx, id)
		if err != nil {
			return err
		}
		t, err = tx.RevokePanelLinks(ctx, store.RevokePanelLinksParams{TenantID: id, At: at.UTC().Truncate(time.Millisecond)})
		if err != nil {
			return err
		}
		_, err = audit.Append(ctx, tx, audit.Entry{Action: "panel_links.revoke", Object: linksObject(id),
			Before: audit.PanelLinks(old), After: audit.PanelLinks(t)})
		return err
	})
	if err != nil {
		return Tenant{}, err
	}
	s.cache.Remove(t.ID)
	if s.inval != nil {
		if err := s.inval.InvalidateTenant(ctx, t.ID); err != nil {
			s.log.Warn("invalidating a tenant whose panel links were revoked failed; other processes catch up within the cache TTL", "tenant_id", t.ID, "err", err)
		}
	}
	return t, nil
}

// RecordPanelLink records that a panel link of tenant id, expiring at expires, was
// handed out (the link itself, a credential, is not recorded). A missing tenant is
// agentqtype.ErrNotFound.
func (s *Service) RecordPanelLink(ctx context.Context, id string, expires time.Time) error {
	if _, err := s.Get(ctx, id); err != nil {
		return err
	}
	_, err := audit.Record(ctx, s.store, audit.Entry{Action: "panel_links.create", Object: linksObject(id), After: audit.PanelLink(expires)})
	return err
}

func linksObject(id string) audit.Object {
	return audit.Object{Kind: audit.KindPanelLinks, ID: id, Tenant: id}
}

// PanelLinkRevoked reports whether a panel link of t issued at issued is revoked.
func PanelLinkRevoked(t Tenant, issued time.Time) bool {
	return t.PanelLinksValidAfter != nil && issued.Before(*t.PanelLinksValidAfter)
}
