package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/quotas"
)

// ledgerPeriodTokens sums the tokens of a tenant's ledger rows from its current
// billing period's start (the tenant's anchor as Postgres has it now).
func (h *harness) ledgerPeriodTokens(tenant string) int64 {
	h.t.Helper()
	ctx := context.Background()
	tn, err := h.app.Store().GetTenant(ctx, tenant)
	if err != nil {
		h.t.Fatal(err)
	}
	p := tn.Anchor().PeriodAt(time.Now())
	var n int64
	if err := h.app.Store().Pool().QueryRow(ctx, `
		SELECT COALESCE(sum(quantity), 0)::bigint FROM usage_ledger
		WHERE tenant_id = $1 AND meter = 'tokens' AND recorded_at >= $2 AND recorded_at < $3`, tenant, p.Start, p.End).Scan(&n); err != nil {
		h.t.Fatal(err)
	}
	return n
}

// Moving a tenant's billing day, either way, mid-period, keeps its monthly quota
// counters equal to the ledger's sum over the new period: /v1/usage shows it, the
// worker's steps book into it, and admission refuses once it is used up. The tenant's
// period starts today (its billing day is today's), so any other billing day starts
// its period earlier, with a smaller period id (the move "backwards"), and all of the
// test's use falls in both periods; moving back is the move "forwards".
func TestBillingDayMoveKeepsMonthlyQuotaCounters(t *testing.T) {
	t.Parallel()
	h := start(t)
	today := time.Now().UTC().Day()
	other := today%28 + 1
	key := h.tenantWith("bd", "pro", map[string]client.Limit{"ai_tokens_monthly": 60}, nil)
	setDay := func(day int) {
		t.Helper()
		var out map[string]any
		if st, _ := h.do("PATCH", "/v1/admin/tenants/bd", h.admin, map[string]any{"billing_day": day}, &out); st != 200 {
			t.Fatalf("PATCH billing_day %d: %d %v", day, st, out)
		}
	}
	setDay(today)
	c := client.New(h.base, key)
	sim := client.SubmitTaskRequest{Agent: "sim", Input: map[string]any{"steps": 3, "tokens_per_step": 10}}
	agree := func(when string, want int64) {
		t.Helper()
		if got := h.ledgerPeriodTokens("bd"); got != want {
			t.Fatalf("%s: the ledger holds %d tokens in the period, want %d", when, got, want)
		}
		if got := h.usage(key)["ai_tokens_monthly"]["used"]; got != float64(want) {
			t.Fatalf("%s: /v1/usage says %v tokens used, the ledger %d", when, got, want)
		}
	}
	if task := run(t, c, sim); task.State != "completed" {
		t.Fatalf("first task: %s", task.State)
	}
	agree("before any move", 30)

	setDay(other) // backwards: the new period's id is smaller than the counters'
	agree("after moving the billing day backwards", 30)
	if task := run(t, c, sim); task.State != "completed" {
		t.Fatalf("task after the backward move: %s (%s)", task.State, deref(task.Error))
	}
	agree("after a task under the moved anchor", 60)
	// A worker still holding the tenant as it was (a task started before the move)
	// works out the old period, whose id is the newer one: its reservation and its
	// settlement book into the new period all the same.
	ctx := context.Background()
	stale := quotas.StepParams{TenantID: "bd", Period: quotas.Anchor{Day: today}.PeriodAt(time.Now()), Limits: quotas.NoLimits(), Tokens: 5}
	if err := h.app.Quotas().ReserveStep(ctx, stale); err != nil {
		t.Fatal(err)
	}
	if got := h.usage(key)["ai_tokens_monthly"]["used"]; got != 65.0 {
		t.Fatalf("after a reservation under the old anchor: /v1/usage says %v tokens, want 65", got)
	}
	stale.Steps, stale.Tokens = -1, -5 // the step gives its reservation back
	if err := h.app.Quotas().SettleStep(ctx, nil, stale); err != nil {
		t.Fatal(err)
	}
	agree("after a step under the old anchor gave its reservation back", 60)
	var r refusal
	if st, _ := h.do("POST", "/v1/tasks", key, sim, &r); st != 402 || r.Error.LimitType != "ai_tokens_monthly" {
		t.Fatalf("submission with the period's tokens used up, after the backward move: %d %+v; want 402 ai_tokens_monthly", st, r)
	}

	setDay(today) // forwards: the new period's id is larger
	agree("after moving the billing day forwards", 60)
	if st, _ := h.do("POST", "/v1/tasks", key, sim, &r); st != 402 || r.Error.LimitType != "ai_tokens_monthly" {
		t.Fatalf("submission with the period's tokens used up, after the forward move: %d %+v; want 402 ai_tokens_monthly", st, r)
	}
}
