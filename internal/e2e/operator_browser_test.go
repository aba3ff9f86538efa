package e2e_test

import (
	"context"
	"maps"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/browsertest"
)

// AGENTQ_UPDATE_SCREENSHOTS=1 makes the browser tests write their screenshots to docs/.
func updateScreenshots() bool { return os.Getenv("AGENTQ_UPDATE_SCREENSHOTS") != "" }

// weightedTenant creates a tenant of weight w with the generous limits and a key.
func (h *harness) weightedTenant(id string, w int) *client.Client {
	h.t.Helper()
	ctx := context.Background()
	ov := maps.Clone(generous)
	ov["running"] = 1000
	if _, err := h.adminClient().CreateTenant(ctx, client.CreateTenantRequest{ID: id, Name: id, Plan: "pro", Weight: &w, Overrides: ov}); err != nil {
		h.t.Fatal(err)
	}
	k, err := h.adminClient().CreateKey(ctx, id, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	return client.New(h.base, k.Key)
}

// A fairness run, then the operator view in Chromium: sign in through the form, both
// tenants listed with shares near their weights' entitlements, sorting by a header
// link works.
func TestOperatorViewShowsSharesAfterAFairnessRun(t *testing.T) {
	t.Parallel()
	browser := browsertest.New(t)
	e := newEnv(t)
	h := e.start(t, func(o *agentq.Options) { o.Config.Roles = []string{"api", "scheduler", "janitor", "relay"} })
	heavy, light := h.weightedTenant("acme", 3), h.weightedTenant("globex", 1)

	// Both tenants queue far more work than the pool (8 slots of 200 ms tasks: 40 a
	// second) can run while the view is read, all of it before the worker starts, so
	// both stay backlogged and share by weight however slowly submissions go.
	const perTenant = 400
	var wg sync.WaitGroup
	for _, c := range []*client.Client{heavy, light} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perTenant {
				if _, err := c.SubmitTask(context.Background(), sim(1, 200)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	e.start(t, func(o *agentq.Options) { o.Config.Roles = []string{"worker"} })
	// An endpoint whose URL carries a credential in its query: the view shows it without.
	var ep map[string]any
	if st, _ := h.do("POST", "/v1/admin/webhooks", h.admin, map[string]any{
		"url": "http://127.0.0.1:9/hooks?token=hidden-from-the-view", "types": []string{"usage.limit_hit"},
	}, &ep); st != 201 {
		t.Fatalf("create webhook: %d %v", st, ep)
	}
	time.Sleep(3 * time.Second) // about 24 worker-seconds at 8 slots

	ctx, cancel := browsertest.Within(browser, 60*time.Second)
	defer cancel()
	err := chromedp.Do(ctx,
		chromedp.Navigate(h.base+"/panel/admin"), // no session: to the sign-in form
		chromedp.WaitVisible("#token"),
		chromedp.SendKeys("#token", h.admin),
		chromedp.Click(`button[type="submit"]`),
		chromedp.WaitVisible("#tenants"),
	)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		Tenant      string  `json:"tenant"`
		Share       float64 `json:"share"`
		Entitlement float64 `json:"entitlement"`
	}
	rowsJS := `Array.from(document.querySelectorAll("#tenants tbody tr[data-tenant]")).map(r => ({
		tenant: r.dataset.tenant, share: parseFloat(r.dataset.share), entitlement: parseFloat(r.dataset.entitlement)}))`
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]row](rowsJS))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]row{}
	for _, r := range rows {
		got[r.Tenant] = r
	}
	a, g := got["acme"], got["globex"]
	if len(rows) != 2 || a.Tenant == "" || g.Tenant == "" {
		t.Fatalf("rows %+v, want acme and globex", rows)
	}
	if a.Entitlement != 0.75 || g.Entitlement != 0.25 {
		t.Errorf("entitlements acme %v globex %v, want 0.75 and 0.25 (weights 3 and 1)", a.Entitlement, g.Entitlement)
	}
	// Loose: the first tasks of each tenant run before its estimate settles, and the
	// race detector slows everything.
	if a.Share < 0.6 || a.Share > 0.9 || g.Share < 0.1 || g.Share > 0.4 || a.Share+g.Share < 0.99 {
		t.Errorf("shares acme %v globex %v, want about 0.75 and 0.25", a.Share, g.Share)
	}
	if html, err := chromedp.Run(ctx, chromedp.OuterHTML("#webhooks")); err != nil || !strings.Contains(html, "http://127.0.0.1:9/hooks") || strings.Contains(html, "hidden-from-the-view") {
		t.Errorf("webhooks table (%v): %s; want the endpoint without its query", err, html)
	}
	// Nor does the page show it anywhere else: the recent changes show the
	// endpoint's creation with the URL as the view shows it.
	if html, err := chromedp.Run(ctx, chromedp.OuterHTML("body")); err != nil || strings.Contains(html, "hidden-from-the-view") {
		t.Errorf("the page (%v) shows an endpoint URL's query", err)
	}
	// The default order is by share, descending.
	if rows[0].Tenant != "acme" {
		t.Errorf("first row %s, want acme (largest share)", rows[0].Tenant)
	}
	if updateScreenshots() {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile("../../docs/operator.png", png, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// Sort by tenant through its header link: ascending puts acme first; again,
	// descending, globex first.
	for _, want := range []string{"acme", "globex"} {
		if err := chromedp.Do(ctx,
			chromedp.Click(`#tenants thead a[data-sort="tenant"]`),
			chromedp.WaitVisible(`#tenants th[aria-sort] a[data-sort="tenant"]`),
		); err != nil {
			t.Fatal(err)
		}
		first, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#tenants tbody tr[data-tenant]").dataset.tenant`))
		if err != nil {
			t.Fatal(err)
		}
		loc, _ := chromedp.Run(ctx, chromedp.Location())
		if first != want {
			t.Errorf("after a click on the tenant header (%s): first row %s, want %s", loc, first, want)
		}
		// the next click's page must be a new one: wait for this one's direction
		dir := "ascending"
		if want == "globex" {
			dir = "descending"
		}
		if !strings.Contains(loc, "sort=tenant") {
			t.Errorf("location %s does not sort by tenant", loc)
		}
		if v, err := chromedp.Run(ctx, chromedp.AttributeValue(`#tenants th[aria-sort]`, "aria-sort")); err != nil || v.Value != dir {
			t.Errorf("aria-sort %q (%v), want %s", v.Value, err, dir)
		}
	}

	// Filter by tenant through the form.
	if err := chromedp.Do(ctx,
		chromedp.SendKeys("#f-tenant", "glob"),
		chromedp.Submit("#f-tenant"),
		chromedp.WaitVisible(`a[href*="Clear"], .filters .actions a`),
	); err != nil {
		t.Fatal(err)
	}
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#tenants tbody tr[data-tenant]").length`))
	if err != nil || n != 1 {
		t.Errorf("filtered by glob: %d rows (%v), want 1", n, err)
	}
	if updateScreenshots() {
		phone(t, ctx, h.base+"/panel/admin")
	}
}

// phone takes the view as a phone shows it (docs/operator-phone.png).
func phone(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	png, err := func() ([]byte, error) {
		if err := chromedp.Do(ctx, chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2)), chromedp.Navigate(url),
			chromedp.WaitVisible("#tenants")); err != nil {
			return nil, err
		}
		return chromedp.Run(ctx, chromedp.CaptureScreenshot())
	}()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("../../docs/operator-phone.png", png, 0o644); err != nil {
		t.Fatal(err)
	}
}
