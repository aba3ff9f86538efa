package billing

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// The worker records which limit ended a task in the task's error, in these forms
// (runtime/worker.go); the error is the only record of it that commits with the end.
const (
	budgetPrefix      = "budget exceeded: "
	tenantQuotaPrefix = budgetPrefix + "tenant "
)

// BudgetStop writes, on tx, the usage.limit_hit of task t just ended budget_exceeded:
// tx is the transaction of that end, so the event commits or rolls back with it. The
// tenant's plan is read on tx. A stop already reported in its window writes nothing.
func (e Events) BudgetStop(ctx context.Context, tx *store.Store, t store.Task) error {
	if t.State != store.StateBudgetExceeded {
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
	ev, err := e.LimitHit(budgetRefusal(t, tenant, at))
	if err != nil {
		return err
	}
	_, err = WriteEvent(ctx, tx, ev)
	return err
}

// budgetRefusal reads which limit ended t (its error) and what it had used. A task
// stopped by one of its tenant's period quotas is that quota's refusal, so it shares
// the period's one limit_hit; a task stopped by its own budget is the budget field's,
// one per tenant and field per minute.
func budgetRefusal(t store.Task, tenant store.Tenant, at time.Time) Refusal {
	r := Refusal{TenantID: t.TenantID, Plan: tenant.Plan, Enforcement: EnforcementStopped, At: at}
	var b quotas.TaskBudget
	_ = json.Unmarshal(t.Budget, &b)
	msg := ""
	if t.Error != nil {
		msg = *t.Error
	}
	switch {
	case strings.HasPrefix(msg, tenantQuotaPrefix):
		if q, ok := parseQuota(strings.TrimPrefix(msg, tenantQuotaPrefix)); ok {
			r.LimitType, r.Limit, r.Used = q.LimitType, q.limit, q.used
			span := DaySpan(at)
			if q.LimitType != quotas.AgentStepsDaily {
				p := quotas.PeriodAt(tenant.CreatedAt, at)
				span = Span{Start: p.Start, End: p.End}
			}
			r.Period = &span
			return r
		}
	case strings.HasPrefix(msg, budgetPrefix+"max_steps "):
		r.LimitType, r.Limit, r.Used = LimitTaskMaxSteps, int64(b.MaxSteps), int64(t.Usage.Steps)
		return r
	case strings.HasPrefix(msg, budgetPrefix+"max_cost_usd "):
		r.LimitType, r.Limit, r.Used = LimitTaskMaxCostUSD, int64(math.Round(b.MaxCostUSD*1e6)), t.Usage.CostMicroUSD
		return r
	case strings.HasPrefix(msg, budgetPrefix+"max_wallclock_s "):
		r.LimitType, r.Limit = LimitTaskMaxWallclock, int64(math.Round(b.MaxWallclockS))
		if t.StartedAt != nil {
			r.Used = int64(math.Round(at.Sub(*t.StartedAt).Seconds()))
		}
		return r
	}
	// An end this code does not recognise still reports that a budget stopped work.
	r.LimitType = LimitTaskBudget
	return r
}

type quotaHit struct {
	LimitType   string
	limit, used int64
}

// parseQuota reads a quotas.QuotaExceeded's message.
func parseQuota(s string) (quotaHit, bool) {
	typ, rest, ok := strings.Cut(s, " limit of ")
	if !ok || !IsPeriodQuota(typ) {
		return quotaHit{}, false
	}
	var limit, used float64
	format := "%f reached (used %f)"
	scale := 1.0
	if typ == quotas.USDMonthly {
		format, scale = "$%f reached (used $%f)", 1e6
	}
	if _, err := fmt.Sscanf(rest, format, &limit, &used); err != nil {
		return quotaHit{}, false
	}
	return quotaHit{LimitType: typ, limit: int64(math.Round(limit * scale)), used: int64(math.Round(used * scale))}, true
}
