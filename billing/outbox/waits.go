package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// Waits writes the events of steps that wait for token capacity.
type Waits struct {
	Events Events
	// Limits returns a tenant's limits, as the worker enforces them
	// (tenants.Policy's Limits).
	Limits func(store.Tenant) (quotas.Limits, error)
}

// Parked writes, on tx (the transaction that parked task t), the usage.limit_hit of a
// step that waits for its tenant's own ai_tokens_per_minute, enforcement "delayed":
// the first such wait of the tenant in a minute writes it, the later ones of that
// minute share it (its window key). A wait for a shared model pool is not the
// tenant's limit and writes none here: it is counted per tenant and pool.
func (w Waits) Parked(ctx context.Context, tx *store.Store, t store.Task) error {
	if t.Wait.Reason == nil || agentqtype.WaitReason(*t.Wait.Reason) != agentqtype.WaitTokensPerMinute {
		return nil
	}
	tenant, err := tx.GetTenant(ctx, t.TenantID)
	if err != nil {
		return fmt.Errorf("billing: the tenant of a limit_hit: %w", err)
	}
	var limit int64
	if w.Limits != nil {
		if l, err := w.Limits(tenant); err == nil {
			limit = l.TokensPerMinute
		}
	}
	var asked int64
	if t.Wait.StepEstimate != nil {
		asked = *t.Wait.StepEstimate
	}
	ev, err := w.Events.LimitHit(Refusal{TenantID: t.TenantID, Plan: tenant.Plan, LimitType: quotas.AITokensPerMinute,
		Limit: limit, Used: asked, Enforcement: EnforcementDelayed, At: time.Now()})
	if err != nil {
		return err
	}
	_, err = WriteEvent(ctx, tx, ev)
	return err
}
