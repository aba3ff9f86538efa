package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// BudgetStop writes, on tx, the usage.limit_hit of task t just ended budget_exceeded
// by the limit stop names: tx is the transaction of that end, so the event commits or
// rolls back with it. The tenant's plan is read on tx. A stop already reported in its
// window writes nothing.
func (e Events) BudgetStop(ctx context.Context, tx *store.Store, t store.Task, stop *quotas.Stop) error {
	if t.State != agentqtype.TaskStateBudgetExceeded {
		return nil
	}
	tenant, err := tx.GetTenant(ctx, t.TenantID)
	if err != nil {
		return fmt.Errorf("billing: the tenant of a limit_hit: %w", err)
	}
	at := time.Now()
	if t.FinishedAt != nil {
		at = *t.FinishedAt
	}
	r := budgetRefusal(t, tenant, at, stop)
	if root := rootOf(t); root != "" { // a tree's stop names its task and root
		r.TaskID, r.RootID = t.ID.String(), root
	}
	ev, err := e.LimitHit(r)
	if err != nil {
		return err
	}
	_, err = WriteEvent(ctx, tx, ev)
	return err
}

// TreeRefusal writes, on tx, the usage.limit_hit of a spawn that parent's tree
// refused at the limit stop names (a tree budget's, quotas.TreeMax*): one per tree
// and limit, whatever the spawns refused after it. tx is the transaction of the
// spawning step's record. Nothing is paused or stopped: the refusal is reported to
// the parent, and this event tells finance and the tenant.
func (e Events) TreeRefusal(ctx context.Context, tx *store.Store, parent store.Task, stop quotas.Stop) error {
	tenant, err := tx.GetTenant(ctx, parent.TenantID)
	if err != nil {
		return fmt.Errorf("billing: the tenant of a limit_hit: %w", err)
	}
	at := time.Now()
	r := Refusal{TenantID: parent.TenantID, Plan: tenant.Plan, LimitType: stop.LimitType, Limit: stop.Limit, Used: stop.Used, At: at,
		TaskID: parent.ID.String(), RootID: parent.Root().String()}
	d, _, err := refusalData(r)
	if err != nil {
		return err
	}
	d.Window = nil // one per tree and limit, not per window
	ev, err := e.build(TypeLimitHit, TreeKey(parent.TenantID, parent.Root(), stop.LimitType), at, d)
	if err != nil {
		return err
	}
	_, err = WriteEvent(ctx, tx, ev)
	return err
}

// budgetRefusal is the refusal of the limit that ended t. A task stopped by one of
// its tenant's period quotas is that quota's refusal, so it shares the one limit_hit
// of the period (the day, for the daily steps) the stop was decided in
// (quotas.Stop.Period, At); a task stopped by its own budget is the budget field's, one per tenant
// and field per minute. An end that names no limit still reports that a budget
// stopped work.
func budgetRefusal(t store.Task, tenant store.Tenant, at time.Time, stop *quotas.Stop) Refusal {
	r := Refusal{TenantID: t.TenantID, Plan: tenant.Plan, Enforcement: EnforcementStopped, At: at}
	if stop == nil {
		r.LimitType = LimitTaskBudget
		return r
	}
	r.LimitType, r.Limit, r.Used = stop.LimitType, stop.Limit, stop.Used
	if IsPeriodQuota(stop.LimitType) {
		decided := at
		if !stop.At.IsZero() {
			decided = stop.At
		}
		span := DaySpan(decided)
		if stop.LimitType != quotas.AgentStepsDaily {
			// The period the refusal was decided in, not the one the end falls in: a
			// task stopped at a period's end shares that period's 100 % event.
			p := stop.Period
			if p.ID == "" {
				p = tenant.Anchor().PeriodAt(at)
			}
			span = Span{Start: p.Start, End: p.End}
		}
		r.Period = &span
	}
	return r
}

// rootOf is the root_id events show for t: its tree's root, "" outside a tree.
func rootOf(t store.Task) string {
	if t.ParentID == nil && t.Children == 0 {
		return ""
	}
	return t.Root().String()
}
