package agentq_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agentq/agentq/client"
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
