package e2e_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/browsertest"
)

// panelGet fetches a panel URL and returns its status, headers and body.
func panelGet(t *testing.T, url string) (int, http.Header, []byte) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Error(err)
		return 0, nil, nil
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, b
}

func errorFields(t *testing.T, body []byte) map[string]any {
	t.Helper()
	var eb struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal(body, &eb); err != nil || eb.Error == nil {
		t.Fatalf("%q is not the error body: %v", body, err)
	}
	return eb.Error
}

// Many pollers on one link: the link's own bucket refuses the excess with 429 and the
// rate-limit body, nothing answers 5xx, and another link of the tenant is not slowed.
func TestPanelLinkRateLimited(t *testing.T) {
	t.Parallel()
	h := start(t)
	h.tenantWith("plr", "pro", nil, nil)
	_, link := h.panelLink("plr", nil)
	// A link is its signed token: two asked for in the same millisecond with the same
	// lifetime are one link, with one bucket. The other link lives an hour instead.
	_, other := h.panelLink("plr", map[string]any{"ttl_s": 3600})
	if other == link || other == "" {
		t.Fatalf("the tenant's second link %q is not another link", other)
	}
	usage := strings.Replace(link, "/panel/t?", "/panel/t/usage?", 1)

	var mu sync.Mutex
	got := map[int]int{}
	var refusal []byte
	var retryAfter string
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 25 {
				st, hd, body := panelGet(t, usage)
				mu.Lock()
				got[st]++
				if st == http.StatusTooManyRequests && refusal == nil {
					refusal, retryAfter = body, hd.Get("Retry-After")
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for st, n := range got {
		if st >= 500 || st == 0 {
			t.Errorf("%d answers %d", n, st)
		}
	}
	if got[http.StatusTooManyRequests] == 0 || got[http.StatusOK] == 0 {
		t.Fatalf("16 pollers x 25 requests on one link: %v, want some 200 and some 429", got)
	}
	e := errorFields(t, refusal)
	if ra, _ := strconv.Atoi(retryAfter); ra < 1 || e["code"] != "RATE_LIMIT_EXCEEDED" || e["limit_type"] != "panel_link_rate" ||
		e["tenant_id"] != "plr" || e["retry_after_seconds"] != float64(ra) {
		t.Fatalf("the refusal: Retry-After %q, %s", retryAfter, refusal)
	}
	if st, _, body := panelGet(t, strings.Replace(other, "/panel/t?", "/panel/t/usage?", 1)); st != http.StatusOK {
		t.Fatalf("another link of the tenant while the first is refused: %d %s", st, body)
	}
}

// A panel request holds one of its tenant's inflight_requests slots, like the
// tenant's API requests: with every slot taken it is refused, and it gives its slot
// back when it ends.
func TestPanelRequestsCountInflight(t *testing.T) {
	t.Parallel()
	h := start(t)
	h.tenantWith("pin", "pro", map[string]client.Limit{"inflight_requests": 2}, nil)
	_, link := h.panelLink("pin", nil)
	usage := strings.Replace(link, "/panel/t?", "/panel/t/usage?", 1)
	if st, _, body := panelGet(t, usage); st != http.StatusOK {
		t.Fatalf("usage: %d %s", st, body)
	}
	h.waitInflight("pin", 0, "after a panel request")
	ctx := context.Background()
	key := h.app.Keys().InflightRequests("pin")
	exp := float64(time.Now().Add(time.Minute).UnixMilli())
	if err := h.app.Redis().ZAdd(ctx, key, redis.Z{Score: exp, Member: "open-1"}, redis.Z{Score: exp, Member: "open-2"}).Err(); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{usage, link} {
		st, _, body := panelGet(t, u)
		if st != http.StatusTooManyRequests {
			t.Fatalf("GET %s with every inflight slot taken: %d %s", u, st, body)
		}
		if u == usage {
			if e := errorFields(t, body); e["code"] != "CONCURRENCY_LIMIT_EXCEEDED" || e["limit_type"] != "inflight_requests" {
				t.Fatalf("the refusal: %s", body)
			}
		}
	}
	h.app.Redis().ZRem(ctx, key, "open-1")
	if st, _, body := panelGet(t, usage); st != http.StatusOK {
		t.Fatalf("usage with a slot free: %d %s", st, body)
	}
	h.waitInflight("pin", 1, "after the panel request ended")
}

// An admin revokes a tenant's links: every link issued before is refused (403 with the
// error body), links issued after work, and other tenants' links are untouched.
func TestPanelLinksRevoked(t *testing.T) {
	t.Parallel()
	h := start(t)
	h.tenantWith("prv", "pro", nil, nil)
	h.tenantWith("prw", "pro", nil, nil)
	_, old := h.panelLink("prv", nil)
	_, others := h.panelLink("prw", nil)
	usage := func(link string) string { return strings.Replace(link, "/panel/t?", "/panel/t/usage?", 1) }
	if st, _, _ := panelGet(t, usage(old)); st != http.StatusOK {
		t.Fatalf("the link before revocation: %d", st)
	}
	var out struct {
		TenantID        string    `json:"tenant_id"`
		LinksValidAfter time.Time `json:"links_valid_after"`
	}
	if st, _ := h.do("POST", "/v1/admin/tenants/prv/panel-links/revoke", h.admin, nil, &out); st != http.StatusOK ||
		out.TenantID != "prv" || out.LinksValidAfter.IsZero() {
		t.Fatalf("revoke: %d %+v", st, out)
	}
	st, _, body := panelGet(t, usage(old))
	if e := errorFields(t, body); st != http.StatusForbidden || e["code"] != "LINK_REVOKED" {
		t.Fatalf("a revoked link's usage: %d %s", st, body)
	}
	if st, _, body := panelGet(t, old); st != http.StatusForbidden || !strings.Contains(string(body), "revoked") {
		t.Fatalf("a revoked link's page: %d %s", st, body)
	}
	_, fresh := h.panelLink("prv", nil)
	if st, _, body := panelGet(t, usage(fresh)); st != http.StatusOK {
		t.Fatalf("a link issued after the revocation: %d %s", st, body)
	}
	if st, _, _ := panelGet(t, usage(others)); st != http.StatusOK {
		t.Fatalf("another tenant's link: %d", st)
	}
	if st, _ := h.do("POST", "/v1/admin/tenants/nobody/panel-links/revoke", h.admin, nil, nil); st != http.StatusNotFound {
		t.Fatalf("revoking an unknown tenant's links: %d", st)
	}
	if st, _ := h.do("POST", "/v1/admin/tenants/prv/panel-links/revoke", "wrong", nil, nil); st != http.StatusUnauthorized {
		t.Fatalf("revoking without the admin token: %d", st)
	}
}

// An open panel page whose link is revoked stops updating and says why.
func TestPanelPageStopsWhenItsLinkIsRevoked(t *testing.T) {
	t.Parallel()
	h := start(t)
	h.tenantWith("prb", "pro", nil, nil)
	_, link := h.panelLink("prb", nil)
	bctx := browsertest.New(t)
	nctx, cancel := browsertest.Within(bctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(nctx, chromedp.Navigate(link), chromedp.WaitVisible(`#refresh-state`)); err != nil {
		t.Fatal(err)
	}
	if st, _ := h.do("POST", "/v1/admin/tenants/prb/panel-links/revoke", h.admin, nil, nil); st != http.StatusOK {
		t.Fatalf("revoke: %d", st)
	}
	pctx, cancel2 := browsertest.Within(bctx, 20*time.Second)
	defer cancel2()
	if _, err := chromedp.Run(pctx, chromedp.Poll[bool](
		`document.getElementById("refresh-state").textContent.indexOf("revoked") >= 0`,
		chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		t.Fatalf("the page of a revoked link does not say so: %v", err)
	}
}
