package tenants

import (
	"context"

	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/internal/store"
)

// Revert undoes audit row r of a tenant's change (an update, or a revert): it puts
// the tenant's configuration back as r found it, in one transaction with the revert's
// own row and, when the limits move, its tenant.limits_changed. A tenant changed
// since r is an *audit.ConflictError; a creation cannot be undone (it would delete
// the tenant with its keys and tasks), an *audit.NotRevertibleError.
func (s *Service) Revert(ctx context.Context, r audit.Row) (audit.Head, error) {
	if r.Action != audit.ActionTenantUpdate && r.Action != audit.ActionTenantRevert {
		return audit.Head{}, audit.NotRevertible(r, "")
	}
	b, err := audit.Decode[audit.TenantState](r.Before)
	if err != nil || b == nil {
		return audit.Head{}, audit.NotRevertible(r, "it records no earlier state")
	}
	if err := s.checkRestore(*b); err != nil {
		return audit.Head{}, err
	}
	_, head, err := s.change(ctx, r.Object.ID, &r, func(tx *store.Store) (Tenant, error) {
		return tx.ReplaceTenant(ctx, store.ReplaceTenantParams{
			ID: r.Object.ID, Name: b.Name, Plan: b.Plan, Weight: b.Weight, Overrides: b.Overrides, Status: b.Status,
			BillingDay: b.BillingDay, TimeZone: b.TimeZone,
		})
	})
	return head, err
}

// checkRestore applies today's rules to a state a revert would restore: a plan taken
// out of the catalogue since, say, is refused as an update would be.
func (s *Service) checkRestore(b audit.TenantState) error {
	if err := s.validateFields(&b.Name, &b.Plan, b.Weight, b.Overrides, &b.Status); err != nil {
		return err
	}
	if err := s.checkKeyLimits(b.Plan, b.Overrides); err != nil {
		return err
	}
	return validateAnchor(b.BillingDay, b.TimeZone)
}
