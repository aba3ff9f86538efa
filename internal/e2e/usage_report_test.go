package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/capacity"
)

// /v1/usage reports the live tasks with why they wait, the latest limit hits with
// their event ids, and the days; ?days= is bounded.
func TestUsageReportTasksHitsAndDays(t *testing.T) {
	t.Parallel()
	h := start(t)
	ctx := context.Background()
	// one task runs at a time; two more wait in the queue, and the backlog holds two
	c, key := h.tenantClient("ur", "pro", map[string]client.Limit{"running": 1, "queue_backlog": 2})
	var ids []string
	for i := range 3 {
		task, err := c.SubmitTask(ctx, client.SubmitTaskRequest{Agent: "sim", Input: map[string]any{"steps": 20, "step_ms": 3000}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, task.ID)
		t.Cleanup(func() { _, _ = c.CancelTask(context.Background(), task.ID) })
		if i == 0 {
			waitState(t, c, task.ID, "running", 10*time.Second)
		}
	}
	if _, err := c.SubmitTask(ctx, sim(1, 1)); err == nil {
		t.Fatal("a fourth task was admitted with queue_backlog 2")
	}
	u, err := c.GetUsage(ctx, client.UsageQuery{Days: 3})
	if err != nil {
		t.Fatal(err)
	}
	if u.Queue.Depth != 2 || u.Queue.Running != 1 || len(u.Tasks) != 3 {
		t.Fatalf("queue %+v, %d tasks; want 1 running, 2 queued", u.Queue, len(u.Tasks))
	}
	for i, tk := range u.Tasks {
		want := "queued"
		if i == 0 {
			want = "running"
		}
		if tk.ID != ids[i] || tk.State != want || tk.Agent != "sim" || (want == "queued") != (tk.WaitReason != nil) {
			t.Fatalf("task %d: %+v, want %s %s (queued ones with a wait reason)", i, tk, ids[i], want)
		}
		if want == "running" {
			continue
		}
		// the same logic as GET /v1/tasks/{id} (whose words may move on between reads)
		if got, _ := c.GetTask(ctx, tk.ID); got.WaitReason == nil || got.WaitReason.Reason == "" || tk.WaitReason.Reason == "" ||
			got.WaitReason.Position < 1 || tk.WaitReason.Position < 1 {
			t.Fatalf("usage says %s waits as %+v, GET /v1/tasks/{id} says %+v", tk.ID, *tk.WaitReason, got.WaitReason)
		}
	}
	today := time.Now().UTC().Format(time.DateOnly)
	if len(u.Days) != 3 || u.Days[2].Day != today || u.Days[0].Day != time.Now().UTC().AddDate(0, 0, -2).Format(time.DateOnly) {
		t.Fatalf("days %+v, want the 3 days ending %s", u.Days, today)
	}
	if def, _ := c.GetUsage(ctx, client.UsageQuery{}); len(def.Days) != 30 {
		t.Fatalf("%d days by default, want 30", len(def.Days))
	}
	for _, bad := range []string{"0", "91", "-1", "x", "1.5", ""} {
		var e errBody
		if st, _ := h.do("GET", "/v1/usage?days="+bad, key.Key, nil, &e); st != 400 || e.Error.Code != "INVALID_REQUEST" || !strings.Contains(e.Error.Message, "days") {
			t.Fatalf("?days=%s: %d %+v", bad, st, e)
		}
	}
	// The refusal's limit_hit shows once the flush wrote it, with the id the feed has.
	var hit client.LimitHit
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		u, err = c.GetUsage(ctx, client.UsageQuery{})
		if err != nil {
			t.Fatal(err)
		}
		if len(u.RecentLimitHits) > 0 {
			hit = u.RecentLimitHits[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no limit hit in /v1/usage 15 s after a refusal")
		}
	}
	// The feed shows an event once every older transaction on the server has ended
	// (its cursor never skips one): another test's open transaction can hold it back
	// a moment after the report has it.
	var page *client.EventPage
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if page, err = c.Events(ctx, client.EventsQuery{Type: client.EventLimitHit}); err != nil {
			t.Fatal(err)
		}
		if len(page.Events) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(page.Events) != 1 || page.Events[0].ID != hit.EventID || hit.LimitType != "queue_backlog" ||
		hit.SLAClassification != "enforced_limit" || hit.Enforcement != "refused" || time.Since(hit.Time) > time.Minute {
		t.Fatalf("usage hit %+v; feed %+v", hit, page.Events)
	}
}

// When a limit is exhausted /v1/usage says so (used == limit, remaining 0), and the
// next submission is refused by that limit: the report's numbers are admission's.
func TestUsageEqualsAdmissionAtEachExhaustedLimit(t *testing.T) {
	t.Parallel()
	h := start(t)
	q := start(t, apiOnly)
	ctx := context.Background()
	long := client.SubmitTaskRequest{Agent: "sim", Input: map[string]any{"steps": 20, "step_ms": 3000}}
	cases := []struct {
		limit    string
		h        *harness
		override map[string]client.Limit
		exhaust  func(t *testing.T, c *client.Client)
		status   int
	}{
		{"tenant_rate", h, map[string]client.Limit{"tenant_rate": 0.01, "tenant_rate_burst": 3}, func(t *testing.T, c *client.Client) {
			for range 3 {
				if _, err := c.SubmitTask(ctx, sim(1, 1)); err != nil {
					t.Fatal(err)
				}
			}
		}, 429},
		{"concurrent_sessions", h, map[string]client.Limit{"concurrent_sessions": 2}, func(t *testing.T, c *client.Client) {
			for range 2 {
				task, err := c.SubmitTask(ctx, long)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _, _ = c.CancelTask(context.Background(), task.ID) })
			}
		}, 429},
		{"queue_backlog", q, map[string]client.Limit{"queue_backlog": 3}, func(t *testing.T, c *client.Client) {
			for range 3 {
				if _, err := c.SubmitTask(ctx, sim(1, 1)); err != nil {
					t.Fatal(err)
				}
			}
		}, 429},
		{"agent_steps_daily", h, map[string]client.Limit{"agent_steps_daily": 3}, func(t *testing.T, c *client.Client) {
			run(t, c, sim(3, 1))
		}, 402},
		{"ai_tokens_monthly", h, map[string]client.Limit{"ai_tokens_monthly": 300}, func(t *testing.T, c *client.Client) {
			run(t, c, client.SubmitTaskRequest{Agent: "sim", Input: map[string]any{"steps": 3, "step_ms": 1, "tokens_per_step": 100}})
		}, 402},
		{"usd_monthly", h, map[string]client.Limit{"usd_monthly": 0.003}, func(t *testing.T, c *client.Client) {
			run(t, c, client.SubmitTaskRequest{Agent: "sim", Input: map[string]any{"steps": 3, "step_ms": 1, "cost_usd_per_step": 0.001}})
		}, 402},
	}
	for i, tc := range cases {
		t.Run(tc.limit, func(t *testing.T) {
			t.Parallel()
			id := fmt.Sprintf("ex%d", i)
			c, _ := tc.h.tenantClient(id, "pro", tc.override)
			tc.exhaust(t, c)
			u, err := c.GetUsage(ctx, client.UsageQuery{})
			if err != nil {
				t.Fatal(err)
			}
			lu := u.Limits[tc.limit]
			if lu.Limit == nil || lu.Remaining == nil {
				t.Fatalf("%s: %+v, want a limit", tc.limit, lu)
			}
			// A bucket's limit is its rate and used how far it is drained (its burst of
			// 3, less what refilled at 0.01/s); the others' used is their limit.
			want := *lu.Limit
			if tc.limit == "tenant_rate" {
				want = 3
			}
			if math.Abs(lu.Used-want) > 0.05 || *lu.Remaining != 0 {
				t.Fatalf("%s exhausted: used %v of %v, remaining %v; want used == limit, remaining 0", tc.limit, lu.Used, *lu.Limit, *lu.Remaining)
			}
			_, err = c.SubmitTask(ctx, sim(1, 1))
			var ae *client.Error
			if st, _ := statusOf(err); st != tc.status || !errors.As(err, &ae) || ae.LimitType != tc.limit {
				t.Fatalf("%s: the next submission: %v, want %d for %s", tc.limit, err, tc.status, tc.limit)
			}
		})
	}
}

// /v1/usage reports a tenant's ai_tokens_per_minute bucket, which the worker reserves
// each step's tokens from: its plan's limit, the tokens reserved and not yet
// refilled, what remains; off when overridden so, nothing when overridden to 0.
func TestUsageReportsTokensPerMinute(t *testing.T) {
	t.Parallel()
	h := start(t)
	ctx := context.Background()
	c, _ := h.tenantClient("tpm", "pro", nil) // 100,000 tokens a minute
	off, _ := h.tenantClient("tpm-off", "pro", map[string]client.Limit{"ai_tokens_per_minute": client.Unlimited})

	u, err := c.GetUsage(ctx, client.UsageQuery{})
	if err != nil {
		t.Fatal(err)
	}
	lu, ok := u.Limits["ai_tokens_per_minute"]
	if !ok || lu.Limit == nil || *lu.Limit != 100000 || lu.Used != 0 || lu.Remaining == nil || *lu.Remaining != 100000 ||
		lu.Unit != "tokens" || lu.WindowS == nil || *lu.WindowS != 60 {
		t.Fatalf("an untouched bucket: %+v", lu)
	}
	q := capacity.NewBuckets(h.app.Redis(), h.app.Keys(), nil)
	if a, err := q.ReserveTenantTokens(ctx, quotas.TenantTokensParams{Tenant: "tpm", PerMinute: 100000, Tokens: 30000}); err != nil || !a.Granted {
		t.Fatalf("reserve: %+v %v", a, err)
	}
	if u, err = c.GetUsage(ctx, client.UsageQuery{}); err != nil {
		t.Fatal(err)
	}
	lu = u.Limits["ai_tokens_per_minute"]
	// The bucket refills at 100,000 a minute meanwhile: a few tokens a millisecond.
	if lu.Used > 30000 || lu.Used < 25000 || *lu.Remaining < 70000 || *lu.Remaining > 75000 || lu.Used+*lu.Remaining > 100001 ||
		lu.ResetAt == nil || lu.ResetAt.Sub(u.AsOf) > 19*time.Second || lu.ResetAt.Sub(u.AsOf) < 14*time.Second {
		t.Fatalf("after a reservation: %+v (reset %v)", lu, lu.ResetAt)
	}
	if u, err = off.GetUsage(ctx, client.UsageQuery{}); err != nil || u.Limits["ai_tokens_per_minute"].Limit != nil {
		t.Fatalf("off: %+v %v", u.Limits["ai_tokens_per_minute"], err)
	}
	// A bucket that never fills could only keep steps waiting: 0 is refused.
	var e errBody
	if st, _ := h.do("POST", "/v1/admin/tenants", h.admin, map[string]any{"id": "tpm-zero", "plan": "pro",
		"overrides": map[string]any{"ai_tokens_per_minute": 0}}, &e); st != 400 || !strings.Contains(e.Error.Message, "ai_tokens_per_minute must be at least 1") {
		t.Fatalf("ai_tokens_per_minute 0: %d %+v; want 400 naming the limit", st, e)
	}
}
