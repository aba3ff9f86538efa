package e2e_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/client"
)

// On the free plan usd_monthly is a limit of $0, not "off": a task whose steps cost
// money ends budget_exceeded after at most one step's cost, naming usd_monthly; tasks
// that cost nothing still run; /v1/usage shows 0 for a $0 limit and null for an
// unlimited one.
func TestZeroDollarPlanSpendsNothing(t *testing.T) {
	t.Parallel()
	h := start(t)
	ctx := context.Background()
	c, k := h.tenantClient("zf", "free", nil)
	var u struct {
		Limits map[string]struct {
			Limit     *float64 `json:"limit"`
			Remaining *float64 `json:"remaining"`
		} `json:"limits"`
	}
	if st, _ := h.do("GET", "/v1/usage", k.Key, nil, &u); st != 200 {
		t.Fatalf("usage: %d", st)
	}
	if l := u.Limits["usd_monthly"]; l.Limit == nil || *l.Limit != 0 || l.Remaining == nil || *l.Remaining != 0 {
		t.Fatalf("free usd_monthly in /v1/usage: limit %v remaining %v, want 0 and 0", l.Limit, l.Remaining)
	}
	if l := u.Limits["key_agent_rate"]; l.Limit != nil {
		t.Fatalf("unlimited key_agent_rate shows limit %v, want null", *l.Limit)
	}

	task, err := c.SubmitTask(ctx, client.SubmitTaskRequest{Agent: "sim", Input: map[string]any{"steps": 3, "step_ms": 5, "cost_usd_per_step": 0.01}})
	if err != nil {
		t.Fatal(err)
	}
	done := waitState(t, c, task.ID, "budget_exceeded", 20*time.Second)
	if done.Usage.CostUSD > 0.01+1e-9 || !strings.Contains(deref(done.Error), "usd_monthly") {
		t.Fatalf("a task spending money on a $0 plan spent %v USD, error %q", done.Usage.CostUSD, deref(done.Error))
	}
	free, err := c.SubmitTask(ctx, client.SubmitTaskRequest{Agent: "sim", Input: map[string]any{"steps": 2, "step_ms": 5}})
	if err != nil {
		t.Fatalf("a task that costs nothing after a $0 refusal: %v", err)
	}
	waitState(t, c, free.ID, "completed", 20*time.Second)

	// overrides carry "unlimited" in and out
	var ten struct {
		Overrides map[string]any `json:"overrides"`
	}
	if st, _ := h.do("POST", "/v1/admin/tenants", h.admin, `{"id":"zu","plan":"free","overrides":{"usd_monthly":"unlimited","tenant_rate":5}}`, &ten); st != 201 || ten.Overrides["usd_monthly"] != "unlimited" || ten.Overrides["tenant_rate"] != 5.0 {
		t.Fatalf("create with usd_monthly unlimited: %d %v", st, ten.Overrides)
	}
	got, err := h.adminClient().GetTenant(ctx, "zu")
	if err != nil || got.Overrides["usd_monthly"] != client.Unlimited {
		t.Fatalf("read back: %v %v", got, err)
	}
	if st, _ := h.do("PATCH", "/v1/admin/tenants/zu", h.admin, `{"overrides":{"usd_monthly":-1}}`, nil); st != 400 {
		t.Fatalf("a negative limit: %d, want 400", st)
	}
}

// A task that waits in its queue longer than a lease lives keeps its session lease:
// the janitor refreshes the leases of queued tasks.
func TestJanitorRefreshesQueuedTasksLeases(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.start(t, apiOnly)
	ctx := context.Background()
	c, _ := h.tenantClient("jq", "pro", nil)
	task, err := c.SubmitTask(ctx, sim(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	key := h.app.Keys().Sessions("jq")
	soon := float64(time.Now().Add(time.Minute).UnixMilli()) // about to expire
	h.app.Redis().ZAddXX(ctx, key, redis.Z{Score: soon, Member: task.ID})
	startJanitor(t, e)
	eventually(t, 10*time.Second, "the queued task's lease pushed forward", func() bool {
		return h.app.Redis().ZScore(ctx, key, task.ID).Val() > float64(time.Now().Add(5*time.Hour).UnixMilli())
	})
}

// queue_backlog counts tasks from admission on: concurrent submissions cannot all pass
// on the same queue length.
func TestQueueBacklogHoldsUnderConcurrentSubmissions(t *testing.T) {
	t.Parallel()
	h := start(t, apiOnly) // nothing dispatches: every admitted task stays queued
	c, _ := h.tenantClient("qb", "pro", map[string]client.Limit{"queue_backlog": 5})
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for range 40 {
		wg.Go(func() {
			if _, err := c.SubmitTask(context.Background(), sim(1, 1)); err == nil {
				admitted.Add(1)
			} else if st, code := statusOf(err); st != 429 || code != "CONCURRENCY_LIMIT_EXCEEDED" {
				t.Errorf("refusal %d %s", st, code)
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != 5 {
		t.Fatalf("%d of 40 concurrent submissions admitted with queue_backlog 5", n)
	}
	if n := h.app.Redis().ZCard(context.Background(), h.app.Keys().PendingQueue("qb")).Val(); n != 0 {
		t.Fatalf("%d admitted tasks still marked not yet queued after their push", n)
	}
}
