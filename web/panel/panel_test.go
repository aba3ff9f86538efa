package panel

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/web/api"
	"github.com/agentq/agentq/web/internal/panellink"
	"github.com/agentq/agentq/web/internal/webtest"
)

// panelTestServer is the panel, with links signed at now, behind the API's error body.
func panelTestServer(t *testing.T, now time.Time) (http.Handler, *panellink.Signer) {
	t.Helper()
	links, err := panellink.New([]byte("s3cret"), func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	p := New(Deps{API: api.New(api.Deps{Logger: webtest.Quiet()}), Links: links, Logger: webtest.Quiet()})
	e := echo.New()
	e.HTTPErrorHandler = api.ErrorHandler(webtest.Quiet())
	p.Mount(e)
	return e, links
}

func get(t *testing.T, h http.Handler, path string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Result()
}

func ptr[T any](v T) *T { return &v }

// Forged and expired links are refused before any tenant is read, with an HTML page
// (the page) or the error body (the JSON it polls), and the panel's headers.
func TestPanelRefusesForgedAndExpiredLinks(t *testing.T) {
	now := time.Date(2026, 11, 15, 12, 0, 0, 0, time.UTC)
	s, links := panelTestServer(t, now)
	expired := links.Sign("acme", now.Add(-time.Second))
	valid := links.Sign("acme", now.Add(time.Hour))
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
	s, _ := panelTestServer(t, time.Now())
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
		lu                        api.LimitUsage
		level, used, limit, reset string
	}{
		{api.LimitUsage{Limit: ptr(500.0), Used: 3, Remaining: ptr(497.0), ResetAt: &reset, Unit: "steps"}, "ok", "3", "500", "resets in 1h 30m"},
		{api.LimitUsage{Limit: ptr(10.0), Used: 8, Remaining: ptr(2.0), Unit: "tasks"}, "warn", "8", "10", ""},
		{api.LimitUsage{Limit: ptr(10.0), Used: 9, Remaining: ptr(1.0), Unit: "tasks"}, "high", "9", "10", ""},
		{api.LimitUsage{Limit: ptr(50.0), Used: 50, Remaining: ptr(0.0), Unit: "usd"}, "full", "50", "50", ""},
		{api.LimitUsage{Limit: ptr(0.0), Used: 0, Remaining: ptr(0.0), Unit: "tasks"}, "full", "0", "0", ""},
		{api.LimitUsage{Used: 4, Unit: "tasks"}, "off", "4", "unlimited", ""},
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
