package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/testenv"
)

// A quota reaching 100 % and three refusals after it in its window are one limit_hit,
// and the refusals are counted in /v1/usage; the refusals wrote nothing to Postgres
// on the request path (the janitor's flush copies the counts).
func TestQuotaHitAndRefusalsAreOneEventAndCounted(t *testing.T) {
	t.Parallel()
	h := start(t)
	ctx := context.Background()
	key := h.tenantWith("rj", "pro", map[string]client.Limit{"agent_steps_daily": 4}, nil)
	c := client.New(h.base, key)
	if task := run(t, c, client.SubmitTaskRequest{Agent: "sim", Input: map[string]any{"steps": 4}}); task.State != "completed" {
		t.Fatalf("the task ended %s", task.State)
	}
	for range 3 {
		var r refusal
		if st, _ := h.do("POST", "/v1/tasks", key, map[string]any{"agent": "sim", "input": map[string]any{"steps": 1}}, &r); st != 402 || r.Error.LimitType != "agent_steps_daily" {
			t.Fatalf("submission past the quota: %d %+v", st, r)
		}
	}
	if got := h.usage(key)["agent_steps_daily"]["rejected"]; got != float64(3) {
		t.Fatalf("/v1/usage agent_steps_daily rejected = %v, want 3", got)
	}
	// The flush runs every second on the janitor's leader; the event is there once it
	// did, and stays one.
	var hits []client.Event
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		page, err := c.Events(ctx, client.EventsQuery{Type: client.EventLimitHit})
		if err != nil {
			t.Fatal(err)
		}
		hits = page.Events
		var n int64
		if err := h.app.Store().Pool().QueryRow(ctx, `SELECT COALESCE(sum(count), 0)::bigint FROM limit_rejections WHERE tenant_id = 'rj'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if len(hits) > 0 && n == 3 {
			break
		}
	}
	if len(hits) != 1 || hits[0].Data.LimitType != "agent_steps_daily" {
		t.Fatalf("limit_hit events %+v, want one for agent_steps_daily", hits)
	}
	if got := h.usage(key)["agent_steps_daily"]["rejected"]; got != float64(3) {
		t.Fatalf("after the flush, rejected = %v, want 3 (counted once)", got)
	}
	// The export of the billing period counts them too, beside the steps used.
	month := time.Now().UTC().Format("2006-01")
	exp, err := h.adminClient().UsageExport(ctx, month)
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, tu := range exp.Tenants {
		if tu.TenantID != "rj" {
			continue
		}
		found = true
		if tu.Rejections["agent_steps_daily"] != 3 {
			t.Fatalf("export rejections %v, want agent_steps_daily 3", tu.Rejections)
		}
	}
	if !found {
		t.Fatalf("the export of %s lacks tenant rj: %+v", month, exp)
	}
	csv, err := h.adminClient().UsageExportCSV(ctx, month)
	if err != nil || !strings.Contains(string(csv), "rejections:agent_steps_daily,3") {
		t.Fatalf("CSV export %v:\n%s", err, csv)
	}
}

// Refusals decided in process while Redis is unreachable are counted and told: the
// replica keeps the counts in memory and writes them to Postgres, with a limit_hit
// that says the platform refused (eligible_breach, refused_by platform), within about
// a second; what it refused just before it stops is written on the way down.
func TestDegradedRefusalsAreCountedAndTold(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dead := testenv.DeadRedis(t)
	h := e.start(t, func(o *agentq.Options) {
		o.Redis = dead
		o.Config.Roles = []string{config.RoleAPI}
		o.Config.RedisTimeout = 200 * time.Millisecond
	})
	noQuotas := map[string]client.Limit{"tenant_rate": 0, "agent_steps_daily": client.Unlimited, "ai_tokens_monthly": client.Unlimited, "usd_monthly": client.Unlimited}
	key := h.tenantWith("dg", "enterprise", noQuotas, nil)
	refuse := func(n int) {
		for range n {
			var r refusal
			if st, _ := h.do("POST", "/v1/tasks", key, `{"agent":"sim"}`, &r); st != 429 || r.Error.LimitType != "tenant_rate" {
				t.Fatalf("a tenant_rate of 0 with Redis down: %d %+v", st, r)
			}
		}
	}
	refuse(3)
	ctx := context.Background()
	pool := h.app.Store().Pool()
	var payload []byte
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && payload == nil; time.Sleep(50 * time.Millisecond) {
		err := pool.QueryRow(ctx, `SELECT payload FROM events WHERE tenant_id = 'dg' AND type = 'usage.limit_hit'`).Scan(&payload)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
	}
	if payload == nil {
		t.Fatal("no limit_hit for refusals decided in degraded mode within 5 s")
	}
	var ev struct {
		Data struct {
			LimitType         string `json:"limit_type"`
			Enforcement       string `json:"enforcement"`
			SLAClassification string `json:"sla_classification"`
			RefusedBy         string `json:"refused_by"`
		} `json:"data"`
	}
	if err := json.Unmarshal(payload, &ev); err != nil {
		t.Fatal(err)
	}
	if d := ev.Data; d.LimitType != "tenant_rate" || d.Enforcement != "refused" || d.SLAClassification != "eligible_breach" || d.RefusedBy != "platform" {
		t.Fatalf("degraded limit_hit %s", payload)
	}
	count := func() (n int64) {
		if err := pool.QueryRow(ctx, `SELECT COALESCE(sum(count), 0)::bigint FROM degraded_rejections WHERE tenant_id = 'dg' AND limit_type = 'tenant_rate'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for deadline := time.Now().Add(5 * time.Second); count() != 3 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
	}
	if n := count(); n != 3 {
		t.Fatalf("degraded refusals counted %d, want 3", n)
	}
	refuse(2)
	h.stop()
	if n := count(); n != 5 {
		t.Fatalf("after shutdown the degraded refusals counted %d, want 5", n)
	}
	// One event per minute window (the five refusals may straddle a minute's end).
	var events, windows int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM events WHERE tenant_id = 'dg' AND type = 'usage.limit_hit'),
		(SELECT count(DISTINCT minute) FROM degraded_rejections WHERE tenant_id = 'dg')`).Scan(&events, &windows); err != nil || events != windows {
		t.Fatalf("%d limit_hit events %v, want one per window (%d)", events, err, windows)
	}
}
