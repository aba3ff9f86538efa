package e2e_test

import (
	"context"
	"flag"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/browsertest"
)

var updateScreenshot = flag.Bool("update", false, "TestPanelScreenshot: rewrite docs/panel.png and docs/panel-phone.png")

// panelLink asks the admin API for a tenant's panel link.
func (h *harness) panelLink(tenant string, body any) (int, string) {
	h.t.Helper()
	var out struct {
		URL       string    `json:"url"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	st, _ := h.do("POST", "/v1/admin/tenants/"+tenant+"/panel-links", h.admin, body, &out)
	return st, out.URL
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// The limits whose use the panel shows (the per-key buckets show their size only).
var panelLimits = []string{"tenant_rate", "concurrent_sessions", "queue_backlog", "running", "agent_steps_daily",
	"ai_tokens_monthly", "ai_tokens_per_minute", "usd_monthly", "long_running_inflight", "inflight_requests"}

func attr(t *testing.T, ctx context.Context, sel, name string) string {
	t.Helper()
	sctx, cancel := browsertest.Within(ctx, 10*time.Second)
	defer cancel()
	r, err := chromedp.Run(sctx, chromedp.AttributeValue(sel, name))
	if err != nil || !r.Exists {
		t.Fatalf("%s[%s]: %v (present %v)", sel, name, err, r.Exists)
	}
	return r.Value
}

// The tenant panel after real tasks ran shows each limit's used and limit as
// /v1/usage has them, updates itself after new usage without a reload, refuses
// forged and expired links, and shows only its own tenant.
func TestTenantPanelInBrowser(t *testing.T) {
	t.Parallel()
	h := start(t)
	ctx := context.Background()
	ca, ka := h.tenantClient("pa", "pro", map[string]client.Limit{"agent_steps_daily": 500})
	cb, _ := h.tenantClient("pb", "pro", nil)
	run(t, ca, client.SubmitTaskRequest{Agent: "sim", Input: map[string]any{"steps": 3, "step_ms": 1, "tokens_per_step": 10, "cost_usd_per_step": 0.25}})
	doneB := run(t, cb, sim(2, 1))
	liveB, err := cb.SubmitTask(ctx, client.SubmitTaskRequest{Agent: "sim", Input: map[string]any{"steps": 20, "step_ms": 3000}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = cb.CancelTask(context.Background(), liveB.ID) })

	st, link := h.panelLink("pa", nil)
	if st != 201 || !strings.HasPrefix(link, h.base+"/panel/t?token=") {
		t.Fatalf("panel link: %d %q", st, link)
	}
	bctx := browsertest.New(t)
	nctx, cancel := browsertest.Within(bctx, 20*time.Second)
	if err := chromedp.Do(nctx, chromedp.Navigate(link), chromedp.WaitVisible(`[data-limit="agent_steps_daily"]`)); err != nil {
		cancel()
		t.Fatal(err)
	}
	cancel()
	u, err := ca.GetUsage(ctx, client.UsageQuery{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range panelLimits {
		sel := `[data-limit="` + name + `"]`
		lu := u.Limits[name]
		wantLimit := "unlimited"
		if lu.Limit != nil {
			wantLimit = strconv.FormatFloat(*lu.Limit, 'f', -1, 64)
		}
		if got := attr(t, bctx, sel, "data-limit-value"); got != wantLimit {
			t.Errorf("%s: data-limit-value %q, /v1/usage limit %q", name, got, wantLimit)
		}
		got, err := strconv.ParseFloat(attr(t, bctx, sel, "data-used"), 64)
		want := lu.Used
		switch name {
		case "tenant_rate": // a bucket refilling at 10000/s: drained by at most a request or two
			if err != nil || got < 0 || got > 2 {
				t.Errorf("%s: data-used %v", name, got)
			}
			continue
		case "ai_tokens_per_minute": // a bucket refilling at 100,000 a minute: the panel's read came first
			if err != nil || got < want || got > 100000 {
				t.Errorf("%s: data-used %v (%v), /v1/usage used %v", name, got, err, want)
			}
			continue
		case "inflight_requests": // the panel reports none (its own request's slot is not shown); /v1/usage counts itself
			want = 0
		}
		if err != nil || got != want {
			t.Errorf("%s: data-used %v (%v), /v1/usage used %v", name, got, err, want)
		}
	}
	if got := attr(t, bctx, `[data-limit="agent_steps_daily"]`, "data-used"); got != "3" {
		t.Fatalf("agent_steps_daily data-used %q after a 3-step task", got)
	}
	for _, name := range []string{"key_rate", "key_agent_rate", "user_tasks_hourly"} {
		attr(t, bctx, `[data-limit="`+name+`"]`, "data-limit-value")
	}
	html, err := chromedp.Run(bctx, chromedp.OuterHTML("html"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(html, doneB.ID) || strings.Contains(html, liveB.ID) || strings.Contains(html, `"pb"`) || strings.Contains(html, ">pb<") {
		t.Fatal("tenant pa's panel shows tenant pb's tasks or id")
	}

	// New usage shows without a reload: the page keeps its own marker.
	if err := chromedp.Do(bctx, chromedp.Evaluate[chromedp.Void](`window.__sameDocument = 1`)); err != nil {
		t.Fatal(err)
	}
	run(t, ca, sim(2, 1))
	pctx, cancel := browsertest.Within(bctx, 20*time.Second)
	defer cancel()
	if _, err := chromedp.Run(pctx, chromedp.Poll[bool](
		`document.querySelector('[data-limit="agent_steps_daily"]').getAttribute("data-used") === "5" && window.__sameDocument === 1`,
		chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		t.Fatalf("the panel did not show 5 steps without a reload: %v", err)
	}
	if u, _ := ca.GetUsage(ctx, client.UsageQuery{}); u.Limits["agent_steps_daily"].Used != 5 {
		t.Fatalf("/v1/usage says %v steps", u.Limits["agent_steps_daily"].Used)
	}

	// Forged, expired, and other tenants' links.
	forged := link[:len(link)-1] + otherLast(link)
	if st, body := httpGet(t, forged); st != 401 || !strings.Contains(body, "<html") {
		t.Fatalf("forged link: %d %q", st, body)
	}
	usageLink := strings.Replace(link, "/panel/t?", "/panel/t/usage?", 1)
	if st, _ := httpGet(t, usageLink[:len(usageLink)-1]+otherLast(usageLink)); st != 401 {
		t.Fatalf("forged usage link: %d", st)
	}
	st, short := h.panelLink("pa", map[string]any{"ttl_s": 1})
	if st != 201 {
		t.Fatalf("short link: %d", st)
	}
	time.Sleep(1100 * time.Millisecond)
	if st, body := httpGet(t, short); st != 403 || !strings.Contains(body, "expired") {
		t.Fatalf("expired link: %d %q", st, body)
	}
	for _, bad := range []any{map[string]any{"ttl_s": 0}, map[string]any{"ttl_s": 2592001}, map[string]any{"ttl": 5}} {
		if st, _ := h.panelLink("pa", bad); st != 400 {
			t.Fatalf("link with %v: %d, want 400", bad, st)
		}
	}
	if st, _ := h.panelLink("nobody", nil); st != 404 {
		t.Fatalf("link of an unknown tenant: %d", st)
	}
	if st, _ := h.do("POST", "/v1/admin/tenants/pa/panel-links", ka.Key, nil, nil); st != 401 {
		t.Fatalf("a tenant key created a panel link: %d", st)
	}
	_, linkB := h.panelLink("pb", nil)
	var rb struct {
		TenantID string `json:"tenant_id"`
		Tasks    []struct {
			ID string `json:"id"`
		} `json:"tasks"`
	}
	if st, _ := h.do("GET", strings.TrimPrefix(strings.Replace(linkB, "/panel/t?", "/panel/t/usage?", 1), h.base), "", nil, &rb); st != 200 ||
		rb.TenantID != "pb" || len(rb.Tasks) != 1 || rb.Tasks[0].ID != liveB.ID {
		t.Fatalf("pb's usage through its link: %d %+v", st, rb)
	}
}

// TestPanelScreenshot rewrites docs/panel.png (desktop) and docs/panel-phone.png with
// -update, after real tasks ran: go test -run TestPanelScreenshot -update ./internal/e2e/
func TestPanelScreenshot(t *testing.T) {
	if !*updateScreenshot {
		t.Skip("run with -update to rewrite docs/panel.png")
	}
	h := start(t)
	ctx := context.Background()
	c, _ := h.tenantClient("acme", "pro", map[string]client.Limit{"agent_steps_daily": 20, "usd_monthly": 0.02, "concurrent_sessions": 2})
	run(t, c, client.SubmitTaskRequest{Agent: "sim", Input: map[string]any{"steps": 16, "step_ms": 1, "tokens_per_step": 1200, "cost_usd_per_step": 0.001}})
	for range 2 {
		task, err := c.SubmitTask(ctx, client.SubmitTaskRequest{Agent: "sim", Input: map[string]any{"steps": 2, "step_ms": 20000, "tokens_per_step": 500, "cost_usd_per_step": 0.001}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = c.CancelTask(context.Background(), task.ID) })
	}
	if _, err := c.SubmitTask(ctx, sim(1, 1)); err == nil {
		t.Fatal("a third session was admitted")
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if u, err := c.GetUsage(ctx, client.UsageQuery{}); err == nil && len(u.RecentLimitHits) > 0 && u.Limits["agent_steps_daily"].Used >= 18 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no limit hit after a refusal")
		}
	}
	_, link := h.panelLink("acme", nil)
	bctx := browsertest.New(t)
	for _, shot := range []struct {
		file          string
		width, height int64
		mobile        bool
	}{{"../../docs/panel.png", 1280, 900, false}, {"../../docs/panel-phone.png", 390, 844, true}} {
		sctx, cancel := browsertest.Within(bctx, 30*time.Second)
		var opts []chromedp.EmulateViewportOption
		if shot.mobile {
			opts = append(opts, chromedp.EmulateScale(2), chromedp.EmulateMobile)
		}
		if err := chromedp.Do(sctx, chromedp.EmulateViewport(shot.width, shot.height, opts...), chromedp.Navigate(link),
			chromedp.WaitVisible(`[data-limit="usd_monthly"]`)); err != nil {
			cancel()
			t.Fatal(err)
		}
		// the desktop shot is the whole page; the phone's its first screen
		shoot := chromedp.FullScreenshot(100) // quality 100: PNG
		if shot.mobile {
			shoot = chromedp.CaptureScreenshot()
		}
		png, err := chromedp.Run(sctx, shoot)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(shot.file, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// otherLast is a character other than s's last one: a link's signature changed in its
// last place. (A fixed replacement was the signature's own last character in one run
// of 16, which left the link valid.)
func otherLast(s string) string {
	if strings.HasSuffix(s, "A") {
		return "B"
	}
	return "A"
}
