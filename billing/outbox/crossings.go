package outbox

import (
	"context"

	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// Crossings writes the threshold events of the period quotas a recorded step crossed,
// on the step's transaction (Subscriber runs Step there).
type Crossings struct {
	Events Events
	// Limits returns a tenant's limits: its plan with its overrides applied, as
	// admission and the worker enforce them (tenants.Policy's Limits).
	Limits func(store.Tenant) (quotas.Limits, error)
}

// Step writes, on tx, the events of the period quotas step r crossed. The measures:
//
//   - agent_steps_daily: the steps of the 24 UTC hours ending with the step's hour,
//     the sliding day admission and the worker count; its events dedupe per UTC day
//     (DaySpan).
//   - ai_tokens_monthly, usd_monthly: the billing period's totals.
//
// In each, before is the total the step left less the step's own share: the rollup
// row of the period is updated (and so locked) by the step's transaction, so two
// steps of a tenant recorded at once see one another's totals in order (the sliding
// day's too, summed once the period row is held, so a step of an earlier hour that
// committed meanwhile is in it), and each threshold is crossed by exactly one step. The dedupe keys make each threshold one
// event per period besides. A tenant whose plan is no longer in the catalogue has no
// limits known here and no crossings.
func (c Crossings) Step(ctx context.Context, tx *store.Store, r store.RecordedStep) error {
	if c.Limits == nil {
		return nil
	}
	lim, err := c.Limits(r.Tenant)
	if err != nil {
		return nil //nolint:nilerr // no plan, no limits: nothing to cross (the worker refuses such a tenant's steps)
	}
	u := r.Usage
	day := DaySpan(u.RecordedAt)
	period := Span{Start: u.Period.Start, End: u.Period.End}
	checks := []struct {
		limitType     string
		limit         int64
		before, after int64
		span          Span
	}{
		{quotas.AgentStepsDaily, lim.StepsDaily, u.DaySteps - 1, u.DaySteps, day},
		{quotas.AITokensMonthly, lim.TokensMonthly, u.PeriodTokens - u.Tokens, u.PeriodTokens, period},
		{quotas.USDMonthly, lim.USDMonthlyMicro, u.PeriodCostMicro - u.CostMicro, u.PeriodCostMicro, period},
	}
	for _, ch := range checks {
		evs, err := c.Events.Crossings(Quota{
			TenantID: r.Tenant.ID, Plan: r.Tenant.Plan, LimitType: ch.limitType, Limit: ch.limit, Period: ch.span,
		}, ch.before, ch.after, u.RecordedAt)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			if _, err := WriteEvent(ctx, tx, ev); err != nil {
				return err
			}
		}
	}
	return nil
}
