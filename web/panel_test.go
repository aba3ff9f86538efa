package web

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
)

func fixedClock(t time.Time) func() time.Time { return func() time.Time { return t } }

func TestPanelTokenSignVerify(t *testing.T) {
	now := time.Date(2026, 11, 15, 12, 0, 0, 0, time.UTC)
	p, err := NewPanelSigner([]byte("secret"), fixedClock(now))
	if err != nil {
		t.Fatal(err)
	}
	exp := now.Add(time.Hour)
	tok := p.Sign("acme", exp)
	id, gotExp, err := p.Verify(tok)
	if err != nil || id != "acme" || !gotExp.Equal(exp) {
		t.Fatalf("Verify = %q %v %v, want acme %v", id, gotExp, err, exp)
	}
	if other := p.Sign("other", exp); other == tok {
		t.Fatal("two tenants' tokens are equal")
	} else if id, _, _ := p.Verify(other); id != "other" {
		t.Fatalf("the other tenant's token verifies as %q", id)
	}

	// Every single-character change is refused as forged, never as another tenant.
	alphabet := "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_x."
	for i := range tok {
		for _, r := range alphabet {
			if byte(r) == tok[i] {
				continue
			}
			forged := tok[:i] + string(r) + tok[i+1:]
			if _, _, err := p.Verify(forged); !errors.Is(err, ErrPanelTokenInvalid) {
				t.Fatalf("token with char %d changed to %q: err %v, want ErrPanelTokenInvalid", i, r, err)
			}
		}
	}
	for _, bad := range []string{"", ".", "abc", tok + "x", tok[:len(tok)-1], strings.Repeat("a", 600)} {
		if _, _, err := p.Verify(bad); !errors.Is(err, ErrPanelTokenInvalid) {
			t.Errorf("Verify(%q) = %v, want ErrPanelTokenInvalid", bad, err)
		}
	}
	// Another secret's token is forged.
	q, _ := NewPanelSigner([]byte("another secret"), fixedClock(now))
	if _, _, err := q.Verify(tok); !errors.Is(err, ErrPanelTokenInvalid) {
		t.Fatalf("a token of another secret: %v", err)
	}
	// At and after its expiry it is expired, not forged.
	for _, at := range []time.Time{exp, exp.Add(time.Second)} {
		late, _ := NewPanelSigner([]byte("secret"), fixedClock(at))
		if id, _, err := late.Verify(tok); !errors.Is(err, ErrPanelTokenExpired) || id != "acme" {
			t.Fatalf("at %v: %q %v, want ErrPanelTokenExpired", at, id, err)
		}
	}
}

func TestPanelSecretChoice(t *testing.T) {
	if s, eph := panelSecret("configured", "admin"); string(s) != "configured" || eph {
		t.Fatalf("configured secret: %q %v", s, eph)
	}
	a, eph := panelSecret("", "admin")
	if eph || len(a) == 0 || string(a) == "admin" {
		t.Fatalf("from the admin token: %q %v", a, eph)
	}
	r1, eph1 := panelSecret("", "")
	r2, _ := panelSecret("", "")
	if !eph1 || len(r1) != 32 || string(r1) == string(r2) {
		t.Fatalf("random secret: %x %x %v", r1, r2, eph1)
	}
	// Links signed under the admin token's key do not verify under the random one.
	pa, _ := NewPanelSigner(a, nil)
	pr, _ := NewPanelSigner(r1, nil)
	if _, _, err := pr.Verify(pa.Sign("t", time.Now().Add(time.Hour))); !errors.Is(err, ErrPanelTokenInvalid) {
		t.Fatalf("cross-key verify: %v", err)
	}
}

func panelTestServer(t *testing.T, now time.Time) *Server {
	t.Helper()
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	return New(Deps{Plans: plans, PanelSecret: "s3cret", Archetype: &baseservice.Archetype{Clock: fixedClock(now)}})
}

func get(t *testing.T, s *Server, path string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Result()
}

// Forged and expired links are refused before any tenant is read, with an HTML page
// (the page) or the error body (the JSON it polls), and the panel's headers.
func TestPanelRefusesForgedAndExpiredLinks(t *testing.T) {
	now := time.Date(2026, 11, 15, 12, 0, 0, 0, time.UTC)
	s := panelTestServer(t, now)
	expired := s.panel.Sign("acme", now.Add(-time.Second))
	valid := s.panel.Sign("acme", now.Add(time.Hour))
	forged := valid[:len(valid)-1] + "x"
	cases := []struct {
		path   string
		status int
		ctype  string
		want   string
	}{
		{"/panel/t?token=" + forged, 401, "text/html", "not valid"},
		{"/panel/t", 401, "text/html", "not valid"},
		{"/panel/t?token=" + expired, 403, "text/html", "expired"},
		{"/panel/t/usage?token=" + forged, 401, "application/json", `"UNAUTHORIZED"`},
		{"/panel/t/usage?token=" + expired, 403, "application/json", `"LINK_EXPIRED"`},
	}
	for _, tc := range cases {
		res := get(t, s, tc.path)
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != tc.status || !strings.HasPrefix(res.Header.Get("Content-Type"), tc.ctype) || !strings.Contains(string(body), tc.want) {
			t.Errorf("GET %s: %d %s %q, want %d %s containing %q", tc.path, res.StatusCode, res.Header.Get("Content-Type"), body, tc.status, tc.ctype, tc.want)
		}
		if res.Header.Get("Cache-Control") != "no-store" || res.Header.Get("Referrer-Policy") != "no-referrer" ||
			!strings.Contains(res.Header.Get("Content-Security-Policy"), "frame-ancestors *") {
			t.Errorf("GET %s: headers %v", tc.path, res.Header)
		}
		if strings.Contains(string(body), valid) || strings.Contains(string(body), forged) {
			t.Errorf("GET %s: the body echoes the token", tc.path)
		}
	}
}

func TestPanelAssets(t *testing.T) {
	s := panelTestServer(t, time.Now())
	for name, ctype := range map[string]string{"panel.css": "text/css", "panel.js": "text/javascript"} {
		res := get(t, s, "/panel/t/assets/"+name)
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), ctype) || len(body) < 100 {
			t.Errorf("%s: %d %s %d bytes", name, res.StatusCode, res.Header.Get("Content-Type"), len(body))
		}
	}
	if res := get(t, s, "/panel/t/assets/other.js"); res.StatusCode != 404 {
		t.Errorf("unknown asset: %d", res.StatusCode)
	}
}

func TestPanelLimitView(t *testing.T) {
	now := time.Date(2026, 11, 15, 12, 0, 0, 0, time.UTC)
	reset := now.Add(90 * time.Minute)
	cases := []struct {
		lu                        LimitUsage
		level, used, limit, reset string
	}{
		{LimitUsage{Limit: ptr(500.0), Used: 3, Remaining: ptr(497.0), ResetAt: &reset, Unit: "steps"}, "ok", "3", "500", "resets in 1h 30m"},
		{LimitUsage{Limit: ptr(10.0), Used: 8, Remaining: ptr(2.0), Unit: "tasks"}, "warn", "8", "10", ""},
		{LimitUsage{Limit: ptr(10.0), Used: 9, Remaining: ptr(1.0), Unit: "tasks"}, "high", "9", "10", ""},
		{LimitUsage{Limit: ptr(50.0), Used: 50, Remaining: ptr(0.0), Unit: "usd"}, "full", "50", "50", ""},
		{LimitUsage{Limit: ptr(0.0), Used: 0, Remaining: ptr(0.0), Unit: "tasks"}, "full", "0", "0", ""},
		{LimitUsage{Used: 4, Unit: "tasks"}, "off", "4", "unlimited", ""},
	}
	for i, tc := range cases {
		pl := newPanelLimit("x", tc.lu, now)
		if pl.Level != tc.level || pl.DataUsed != tc.used || pl.DataLimit != tc.limit || pl.ResetText != tc.reset {
			t.Errorf("case %d: %+v", i, pl)
		}
	}
	if got := fmtAmount(20000000, "tokens"); got != "20,000,000" {
		t.Errorf("tokens: %q", got)
	}
	for f, want := range map[float64]string{1234.5: "$1,234.50", 0.016: "$0.016", 0: "$0.00", 0.00012: "$0.0001", 50: "$50.00"} {
		if got := fmtAmount(f, "usd"); got != want {
			t.Errorf("usd %v: %q, want %q", f, got, want)
		}
	}
}

// A token says when it was issued; a token of the first format, which does not, counts
// as issued at the epoch, so any revocation of its tenant's links ends it.
func TestPanelTokenIssueTime(t *testing.T) {
	now := time.Date(2026, 11, 15, 12, 0, 0, 123_000_000, time.UTC)
	p, err := NewPanelSigner([]byte("secret"), fixedClock(now))
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.Claims(p.Sign("acme", now.Add(time.Hour)))
	if err != nil || c.TenantID != "acme" || !c.Issued.Equal(now) || !c.Expires.Equal(now.Add(time.Hour).Truncate(time.Second)) {
		t.Fatalf("claims %+v %v, want acme issued %v", c, err, now)
	}
	v1 := seal(p.key, panelPurpose, []byte("1|acme|"+strconv.FormatInt(now.Add(time.Hour).Unix(), 10)))
	c, err = p.Claims(v1)
	if err != nil || c.TenantID != "acme" || !c.Issued.Equal(time.UnixMilli(0)) {
		t.Fatalf("a first-format token: %+v %v", c, err)
	}
	revoked := now.Add(-time.Minute)
	for _, tc := range []struct {
		issued time.Time
		want   bool
	}{{time.UnixMilli(0), true}, {revoked.Add(-time.Millisecond), true}, {revoked, false}, {now, false}} {
		if got := tenants.PanelLinkRevoked(tenants.Tenant{PanelLinksValidAfter: &revoked}, tc.issued); got != tc.want {
			t.Errorf("a link issued at %v, links valid after %v: revoked %v, want %v", tc.issued, revoked, got, tc.want)
		}
	}
	if tenants.PanelLinkRevoked(tenants.Tenant{}, time.UnixMilli(0)) {
		t.Error("a tenant that never revoked a link has a revoked link")
	}
}
