package e2e_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
)

// loseRedis deletes every key of the process's prefix: a FLUSHDB of its Redis state.
func (h *harness) loseRedis() {
	testenv.DeletePrefix(context.Background(), h.app.Redis(), h.app.Keys().Prefix())
}

// ledgerTotals sums a tenant's ledger rows of the last day.
func (h *harness) ledgerTotals(tenant string) (steps, tokens, costMicro int64) {
	h.t.Helper()
	err := h.app.Store().Pool().QueryRow(context.Background(), `
		SELECT COALESCE(sum(quantity) FILTER (WHERE meter = 'steps'), 0)::bigint,
			COALESCE(sum(quantity) FILTER (WHERE meter = 'tokens'), 0)::bigint,
			COALESCE(sum(quantity) FILTER (WHERE meter = 'cost_micro_usd'), 0)::bigint
		FROM usage_ledger WHERE tenant_id = $1 AND recorded_at > now() - interval '1 day'`, tenant).Scan(&steps, &tokens, &costMicro)
	if err != nil {
		h.t.Fatal(err)
	}
	return steps, tokens, costMicro
}

// A tenant that used up a period quota stays refused after Redis lost its data: the
// counters are rebuilt from the ledger before the next submission is decided.
func TestExhaustedQuotaStaysExhaustedAfterRedisLoss(t *testing.T) {
	t.Parallel()
	h := start(t)
	cases := []struct {
		limit string
		value client.Limit
		input map[string]any
	}{
		{"agent_steps_daily", 3, map[string]any{"steps": 10}},
		{"ai_tokens_monthly", 20, map[string]any{"steps": 10, "tokens_per_step": 10}},
		{"usd_monthly", 0.02, map[string]any{"steps": 10, "cost_usd_per_step": 0.01}},
	}
	for i, tc := range cases {
		tenant := fmt.Sprintf("ex%d", i)
		key := h.tenantWith(tenant, "pro_stop", map[string]client.Limit{tc.limit: tc.value}, nil)
		task := run(t, client.New(h.base, key), client.SubmitTaskRequest{Agent: "sim", Input: tc.input})
		if task.State != "budget_exceeded" {
			t.Fatalf("%s: the task ended %s (%s), want budget_exceeded", tc.limit, task.State, deref(task.Error))
		}
		refused := func(when string) {
			t.Helper()
			var r refusal
			st, _ := h.do("POST", "/v1/tasks", key, map[string]any{"agent": "sim", "input": tc.input}, &r)
			if st != 402 || r.Error.Code != "QUOTA_EXCEEDED" || r.Error.LimitType != tc.limit {
				t.Fatalf("%s, %s: %d %+v; want 402 naming %s", tc.limit, when, st, r, tc.limit)
			}
		}
		refused("before the loss")
		h.loseRedis()
		refused("after the loss")
		refused("again") // and the rebuilt counters stay
	}
}

// A tenant under its quotas is admitted after the loss, and its counters are the
// ledger's: the steps before the loss and those after.
func TestCountersEqualTheLedgerAfterRedisLoss(t *testing.T) {
	t.Parallel()
	h := start(t)
	key := h.tenantWith("ul", "pro", map[string]client.Limit{"agent_steps_daily": 100, "ai_tokens_monthly": 1000, "usd_monthly": 1}, nil)
	c := client.New(h.base, key)
	sim := client.SubmitTaskRequest{Agent: "sim", Input: map[string]any{"steps": 3, "tokens_per_step": 7, "cost_usd_per_step": 0.001}}
	if task := run(t, c, sim); task.State != "completed" {
		t.Fatalf("before the loss: %s", task.State)
	}
	h.loseRedis()
	if task := run(t, c, sim); task.State != "completed" {
		t.Fatalf("after the loss: %s (%s)", task.State, deref(task.Error))
	}
	steps, tokens, cost := h.ledgerTotals("ul")
	if steps != 6 || tokens != 42 || cost != 6000 {
		t.Fatalf("ledger: %d steps, %d tokens, %d µ$", steps, tokens, cost)
	}
	u := h.usage(key)
	if u["agent_steps_daily"]["used"] != float64(steps) || u["ai_tokens_monthly"]["used"] != float64(tokens) ||
		u["usd_monthly"]["used"] != float64(cost)/1e6 {
		t.Fatalf("counters after the loss: steps %v tokens %v usd %v; the ledger has %d, %d, %d µ$",
			u["agent_steps_daily"]["used"], u["ai_tokens_monthly"]["used"], u["usd_monthly"]["used"], steps, tokens, cost)
	}
}

// A restart with Redis intact rebuilds nothing: a second process on the same Redis
// reads the counters the first left, even ones the ledger does not hold (steps
// reserved and not recorded), under the same rebuild mark. (API-only processes: no
// janitor recounts meanwhile.)
func TestRestartWithRedisIntactRebuildsNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	first := e.start(t, apiOnly)
	key := first.tenantWith("rs", "pro", map[string]client.Limit{"agent_steps_daily": 100}, nil)
	tn, err := first.app.Store().GetTenant(ctx, "rs")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		err := first.app.Quotas().ReserveStep(ctx, quotas.StepParams{TenantID: "rs", Period: quotas.PeriodAt(tn.CreatedAt, time.Now()), Limits: quotas.NoLimits()})
		if err != nil {
			t.Fatal(err)
		}
	}
	mark := func() string { return e.rdb.HGet(ctx, e.keys.AdmissionState("rs"), "sd").Val() }
	before := mark()
	first.stop()
	second := e.start(t, apiOnly)
	if u := second.usage(key); u["agent_steps_daily"]["used"] != 3.0 {
		t.Fatalf("steps after a restart: %v, want the 3 Redis kept", u["agent_steps_daily"]["used"])
	}
	if after := mark(); before == "" || after != before {
		t.Fatalf("rebuild mark %q before the restart, %q after", before, after)
	}
}

// A task running when Redis loses its data goes on against counters rebuilt from the
// ledger: its next step's reservation rebuilds them, so it stops at the tenant's
// quota instead of starting the day afresh. (The step in flight at the loss may count
// late, by the recount: one step over at most.)
func TestRunningTaskMeetsTheRebuiltQuota(t *testing.T) {
	t.Parallel()
	h := start(t)
	key := h.tenantWith("rt", "pro_stop", map[string]client.Limit{"agent_steps_daily": 5}, nil)
	c := client.New(h.base, key)
	task, err := c.SubmitTask(context.Background(), client.SubmitTaskRequest{Agent: "sim", Input: map[string]any{"steps": 20, "step_ms": 100}})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "two steps recorded", func() bool {
		got, err := c.GetTask(context.Background(), task.ID)
		return err == nil && got.Usage.Steps >= 2
	})
	h.loseRedis()
	done := waitState(t, c, task.ID, "budget_exceeded", 20*time.Second)
	if done.Usage.Steps > 6 {
		t.Fatalf("the task ran %d steps under a daily limit of 5 across the loss", done.Usage.Steps)
	}
}
