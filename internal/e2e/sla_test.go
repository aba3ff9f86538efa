package e2e_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/browsertest"
)

// slaBreaches are the tenant's limit_hits of a commitment, read from the table.
func (h *harness) slaBreaches(tenant, limitType string) []outbox.LimitData {
	h.t.Helper()
	rows, err := h.app.Store().Pool().Query(context.Background(),
		`SELECT payload FROM events WHERE tenant_id = $1 AND type = $2 ORDER BY seq`, tenant, outbox.TypeLimitHit)
	if err != nil {
		h.t.Fatal(err)
	}
	payloads, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		h.t.Fatal(err)
	}
	var out []outbox.LimitData
	for _, p := range payloads {
		var ev struct {
			Data outbox.LimitData `json:"data"`
		}
		if err := json.Unmarshal(p, &ev); err != nil {
			h.t.Fatal(err)
		}
		if ev.Data.LimitType == limitType {
			out = append(out, ev.Data)
		}
	}
	return out
}

// lateStart runs a server with one worker slot that a long task of "hog" (free: no
// commitment) holds while "acme" (pro, start_within_s 0.5) and "freeloader" (free)
// submit a task each: both wait past half a second for the slot.
func lateStart(t *testing.T) *harness {
	t.Helper()
	h := start(t, func(o *agentq.Options) { o.Config.WorkerConcurrency = 1; o.Config.Prefetch = 0 })
	ctx := context.Background()
	hog, _ := h.tenantClient("hog", "free", nil)
	acme, _ := h.tenantClient("acme", "pro", map[string]client.Limit{"sla_start_within_s": 0.5})
	free, _ := h.tenantClient("freeloader", "free", nil)
	long, err := hog.SubmitTask(ctx, sim(15, 100))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, hog, long.ID, "running", 10*time.Second)
	late, err := acme.SubmitTask(ctx, sim(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	also, err := free.SubmitTask(ctx, sim(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, acme, late.ID, "completed", 20*time.Second)
	waitState(t, free, also.ID, "completed", 20*time.Second)
	return h
}

// Worker slots all taken delay a tenant within its limits and share past its plan's
// start commitment: one eligible_breach with the committed and measured values,
// counted in agentq_sla_breaches_total. A tenant on a plan without the commitment
// waits as long and has none.
func TestStartDelayedByAFullPoolIsABreach(t *testing.T) {
	t.Parallel()
	h := lateStart(t)
	got := h.slaBreaches("acme", outbox.LimitSLAStart)
	if len(got) != 1 {
		t.Fatalf("%d start breaches of acme, want 1: %+v", len(got), got)
	}
	d := got[0]
	if d.SLAClassification != outbox.EligibleBreach || d.RefusedBy != outbox.RefusedByPlatform || d.Plan != "pro" ||
		d.CommittedMs == nil || *d.CommittedMs != 500 || d.MeasuredMs == nil || *d.MeasuredMs <= 500 || d.LimitValue.N != 1 {
		t.Fatalf("breach %+v", d)
	}
	if b := h.slaBreaches("freeloader", outbox.LimitSLAStart); len(b) != 0 {
		t.Fatalf("a plan without the commitment: %+v", b)
	}
	// The usage report shows the commitment and the breach; the plan listing the plans'.
	ctx := context.Background()
	k, err := h.adminClient().CreateKey(ctx, "acme", nil)
	if err != nil {
		t.Fatal(err)
	}
	u, err := client.New(h.base, k.Key).GetUsage(ctx, client.UsageQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if u.SLA.StartWithinS != 0.5 || u.SLA.PoolWaitWithinS != 30 || len(u.SLABreaches) != 1 ||
		u.SLABreaches[0].LimitType != "sla_start_within_s" || u.SLABreaches[0].Count != 1 || u.SLABreaches[0].LastCommittedMs != 500 {
		t.Fatalf("usage report sla %+v breaches %+v", u.SLA, u.SLABreaches)
	}
	plans, err := h.adminClient().ListPlans(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plans {
		if p.Name == "enterprise" && (p.SLA.StartWithinS != 10 || p.SLA.PoolWaitWithinS != 10) ||
			p.Name == "free" && (p.SLA.StartWithinS != client.Unlimited || p.SLA.PoolWaitWithinS != client.Unlimited) {
			t.Errorf("plan %s sla %+v", p.Name, p.SLA)
		}
	}
	if v, ok := sample(h.scrape(), "agentq_sla_breaches_total", map[string]string{"limit_type": "sla_start_within_s", "tenant_id": "acme"}); !ok || v != 1 {
		t.Fatalf("agentq_sla_breaches_total = %v (present %v), want 1", v, ok)
	}
}

// A task that expires at its start deadline behind worker slots all taken, after its
// plan's start commitment lapsed, is a breach written with the expiry, even when no
// late-start pass ran while it waited.
func TestExpiryBehindAFullPoolIsABreach(t *testing.T) {
	t.Parallel()
	h := start(t, func(o *agentq.Options) { o.Config.WorkerConcurrency = 1; o.Config.Prefetch = 0 })
	ctx := context.Background()
	hog, _ := h.tenantClient("hog", "free", nil)
	acme, _ := h.tenantClient("acme", "pro", map[string]client.Limit{"sla_start_within_s": 0.5})
	long, err := hog.SubmitTask(ctx, sim(5, 1000)) // free: at most 5 steps
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, hog, long.ID, "running", 10*time.Second)
	req := sim(1, 1)
	within := 1.5
	req.StartWithinS = &within
	late, err := acme.SubmitTask(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, acme, late.ID, "expired", 20*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for len(h.slaBreaches("acme", outbox.LimitSLAStart)) == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	got := h.slaBreaches("acme", outbox.LimitSLAStart)
	if len(got) != 1 || got[0].SLAClassification != outbox.EligibleBreach || *got[0].CommittedMs != 500 || *got[0].MeasuredMs < 1500 {
		t.Fatalf("breaches at the expiry %+v, want one measured to the expiry", got)
	}
}

// A start its tenant's own running cap delayed is not a breach.
func TestStartHeldByTheTenantsOwnCapIsNoBreach(t *testing.T) {
	t.Parallel()
	h := start(t)
	ctx := context.Background()
	capped, _ := h.tenantClient("capped", "pro", map[string]client.Limit{"running": 1, "sla_start_within_s": 0.5})
	first, err := capped.SubmitTask(ctx, sim(10, 100))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, capped, first.ID, "running", 10*time.Second)
	second, err := capped.SubmitTask(ctx, sim(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	done := waitState(t, capped, second.ID, "completed", 20*time.Second)
	if done.StartedAt == nil || done.StartedAt.Sub(done.CreatedAt) < 500*time.Millisecond {
		t.Fatalf("the second task started %v after its creation: the cap did not hold it", done.StartedAt.Sub(done.CreatedAt))
	}
	if b := h.slaBreaches("capped", outbox.LimitSLAStart); len(b) != 0 {
		t.Fatalf("a start the tenant's own cap held: %+v", b)
	}
}

// The operator view lists a tenant's missed commitments, and the tenant's panel its
// own.
func TestBreachesShowInTheOperatorViewAndThePanel(t *testing.T) {
	t.Parallel()
	browser := browsertest.New(t)
	h := lateStart(t)
	ctx, cancel := browsertest.Within(browser, 60*time.Second)
	defer cancel()
	sel := `#tenants tr[data-tenant="acme"] [data-sla="sla_start_within_s"]`
	if err := chromedp.Do(ctx,
		chromedp.Navigate(h.base+"/panel/admin"),
		chromedp.WaitVisible("#token"),
		chromedp.SendKeys("#token", h.admin),
		chromedp.Click(`button[type="submit"]`),
		chromedp.WaitVisible(sel),
	); err != nil {
		t.Fatal(err)
	}
	if text, err := chromedp.Run(ctx, chromedp.Text(sel)); err != nil || !strings.Contains(text, "sla_start_within_s: 1,") {
		t.Errorf("operator view: %q %v, want one start breach", text, err)
	}
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#tenants tr[data-tenant="freeloader"] [data-sla]').length`)); err != nil || n != 0 {
		t.Errorf("freeloader shows %d breaches (%v), want none", n, err)
	}
	st, link := h.panelLink("acme", nil)
	if st != 201 {
		t.Fatalf("panel link: %d", st)
	}
	row := `#sla-breaches tr[data-sla="sla_start_within_s"]`
	if err := chromedp.Do(ctx, chromedp.Navigate(link), chromedp.WaitVisible(row)); err != nil {
		t.Fatal(err)
	}
	if text, err := chromedp.Run(ctx, chromedp.Text(row)); err != nil || !strings.Contains(text, "/ 0.5 s") {
		t.Errorf("panel row %q %v, want the committed 0.5 s", text, err)
	}
}
