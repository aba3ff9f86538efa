package operator

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/internal/credentials"
	"github.com/agentq/agentq/internal/operator"
	"github.com/agentq/agentq/internal/pools"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/web/api"
	"github.com/agentq/agentq/web/internal/adminauth"
	"github.com/agentq/agentq/web/internal/webtest"
)

const opToken = "operator-test-token"

// opServer is the view behind the API's error body, as the server mounts it.
type opServer struct {
	*View
	h http.Handler
}

func (s opServer) Handler() http.Handler { return s.h }

func operatorServer(t *testing.T, token string) opServer {
	t.Helper()
	v := New(Deps{AdminAuth: adminauth.New(credentials.New(nil, credentials.Options{Bootstrap: token}), nil)})
	e := echo.New()
	e.HTTPErrorHandler = api.ErrorHandler(webtest.Quiet())
	v.Mount(e)
	return opServer{View: v, h: e}
}

type opResult struct {
	status int
	header http.Header
	body   string
	cookie map[string]*http.Cookie
}

func opDo(t *testing.T, s opServer, method, path string, form url.Values, header map[string]string, cookies ...*http.Cookie) opResult {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req := httptest.NewRequest(method, "http://127.0.0.1:8080"+path, body)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	for _, c := range cookies {
		req.AddCookie(c)
	}
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	res := rec.Result()
	raw, _ := io.ReadAll(res.Body)
	out := opResult{status: res.StatusCode, header: res.Header, body: string(raw), cookie: map[string]*http.Cookie{}}
	for _, c := range res.Cookies() {
		out.cookie[c.Name] = c
	}
	return out
}

var sameSite = map[string]string{"Origin": "http://127.0.0.1:8080"}

// loginCSRF loads the sign-in form and returns its CSRF cookie.
func loginCSRF(t *testing.T, s opServer) *http.Cookie {
	t.Helper()
	r := opDo(t, s, http.MethodGet, "/panel/admin/login", nil, nil)
	c := r.cookie[operatorLoginName]
	if r.status != http.StatusOK || c == nil || !strings.Contains(r.body, `value="`+c.Value+`"`) {
		t.Fatalf("login form: %d, cookie %v; the form must repeat the cookie's token", r.status, c)
	}
	if !strings.Contains(r.body, `<label for="token">`) || !strings.Contains(r.body, `type="password"`) {
		t.Fatal("the login form has no labelled password field")
	}
	return c
}

func checkCookie(t *testing.T, c *http.Cookie) {
	t.Helper()
	if !c.HttpOnly || !c.Secure || c.SameSite != http.SameSiteStrictMode || c.Path != "/panel/admin" {
		t.Errorf("cookie %s: HttpOnly %v Secure %v SameSite %v Path %q; want HttpOnly, Secure, Strict, /panel/admin",
			c.Name, c.HttpOnly, c.Secure, c.SameSite, c.Path)
	}
}

func login(t *testing.T, s opServer) *http.Cookie {
	t.Helper()
	csrf := loginCSRF(t, s)
	r := opDo(t, s, http.MethodPost, "/panel/admin/login", url.Values{"token": {opToken}, "csrf": {csrf.Value}}, sameSite, csrf)
	sess := r.cookie[operatorSessionName]
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/panel/admin" || sess == nil {
		t.Fatalf("login: %d to %q, session %v; want 303 to /panel/admin with a session", r.status, r.header.Get("Location"), sess)
	}
	checkCookie(t, sess)
	if sess.MaxAge != int(operatorSessionTTL/time.Second) {
		t.Errorf("session Max-Age %d, want %v", sess.MaxAge, operatorSessionTTL)
	}
	return sess
}

// csrfOf is the CSRF token of the session sess is the cookie of.
func csrfOf(t *testing.T, s opServer, sess *http.Cookie) string {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/panel/admin", nil)
	req.AddCookie(sess)
	ss, err := s.session(echo.New().NewContext(req, httptest.NewRecorder()))
	if err != nil || ss == nil {
		t.Fatalf("no live session in %v: %v", sess, err)
	}
	return ss.csrf()
}

func TestOperatorLogin(t *testing.T) {
	t.Parallel()
	s := operatorServer(t, opToken)

	if r := opDo(t, s, http.MethodGet, "/panel/admin", nil, nil); r.status != http.StatusSeeOther || r.header.Get("Location") != "/panel/admin/login" {
		t.Fatalf("the view without a session: %d to %q, want 303 to the login", r.status, r.header.Get("Location"))
	}
	checkCookie(t, loginCSRF(t, s))
	sess := login(t, s)

	// With the session the view answers (no data source in this test: 503, past the auth).
	if r := opDo(t, s, http.MethodGet, "/panel/admin", nil, nil, sess); r.status != http.StatusServiceUnavailable {
		t.Fatalf("the view with a session: %d, want past the login (503 without a data source)", r.status)
	}
	if r := opDo(t, s, http.MethodGet, "/panel/admin?sort=password", nil, nil, sess); r.status != http.StatusBadRequest || !strings.Contains(r.body, "sort must be one of") {
		t.Fatalf("unknown sort: %d %q", r.status, r.body)
	}
	// A forged or tampered session is none.
	forged := *sess
	forged.Value = sess.Value[:len(sess.Value)-2] + "AA"
	if r := opDo(t, s, http.MethodGet, "/panel/admin", nil, nil, &forged); r.status != http.StatusSeeOther {
		t.Fatalf("a tampered session: %d, want the login", r.status)
	}
	// Another admin token's sessions are not this one's.
	other := operatorServer(t, "another-token")
	if r := opDo(t, other, http.MethodGet, "/panel/admin", nil, nil, sess); r.status != http.StatusSeeOther {
		t.Fatalf("a session signed under another admin token: %d, want the login", r.status)
	}
	// Sessions expire.
	s.opAuth.now = func() time.Time { return time.Now().Add(operatorSessionTTL + time.Minute) }
	if r := opDo(t, s, http.MethodGet, "/panel/admin", nil, nil, sess); r.status != http.StatusSeeOther {
		t.Fatalf("an expired session: %d, want the login", r.status)
	}
}

func TestOperatorLoginRefusals(t *testing.T) {
	t.Parallel()
	s := operatorServer(t, opToken)
	csrf := loginCSRF(t, s)
	cases := []struct {
		name   string
		form   url.Values
		header map[string]string
		cookie bool
		status int
	}{
		{"wrong token", url.Values{"token": {"nope"}, "csrf": {csrf.Value}}, sameSite, true, http.StatusUnauthorized},
		{"no CSRF field", url.Values{"token": {opToken}}, sameSite, true, http.StatusForbidden},
		{"no CSRF cookie", url.Values{"token": {opToken}, "csrf": {csrf.Value}}, sameSite, false, http.StatusForbidden},
		{"CSRF mismatch", url.Values{"token": {opToken}, "csrf": {"x" + csrf.Value}}, sameSite, true, http.StatusForbidden},
		{"foreign Origin", url.Values{"token": {opToken}, "csrf": {csrf.Value}}, map[string]string{"Origin": "https://evil.example"}, true, http.StatusForbidden},
		{"no Origin", url.Values{"token": {opToken}, "csrf": {csrf.Value}}, nil, true, http.StatusForbidden},
		{"cross-site fetch", url.Values{"token": {opToken}, "csrf": {csrf.Value}}, map[string]string{"Sec-Fetch-Site": "cross-site"}, true, http.StatusForbidden},
	}
	for _, c := range cases {
		var cks []*http.Cookie
		if c.cookie {
			cks = append(cks, csrf)
		}
		r := opDo(t, s, http.MethodPost, "/panel/admin/login", c.form, c.header, cks...)
		if r.status != c.status || r.cookie[operatorSessionName] != nil {
			t.Errorf("%s: %d (session %v), want %d and no session", c.name, r.status, r.cookie[operatorSessionName], c.status)
		}
		if !strings.HasPrefix(r.header.Get("Content-Type"), "text/html") {
			t.Errorf("%s: Content-Type %q, want an HTML page", c.name, r.header.Get("Content-Type"))
		}
	}
	// Same-origin without Origin (Sec-Fetch-Site) is accepted.
	r := opDo(t, s, http.MethodPost, "/panel/admin/login", url.Values{"token": {opToken}, "csrf": {csrf.Value}},
		map[string]string{"Sec-Fetch-Site": "same-origin"}, csrf)
	if r.status != http.StatusSeeOther || r.cookie[operatorSessionName] == nil {
		t.Fatalf("same-origin sign-in: %d", r.status)
	}
}

// Failed sign-ins are limited per address: past the burst even the right token waits.
func TestOperatorLoginRateLimited(t *testing.T) {
	t.Parallel()
	s := operatorServer(t, opToken)
	csrf := loginCSRF(t, s)
	for i := range adminauth.FailureBucket.Burst {
		if r := opDo(t, s, http.MethodPost, "/panel/admin/login", url.Values{"token": {"wrong"}, "csrf": {csrf.Value}}, sameSite, csrf); r.status != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d, want 401", i+1, r.status)
		}
	}
	r := opDo(t, s, http.MethodPost, "/panel/admin/login", url.Values{"token": {opToken}, "csrf": {csrf.Value}}, sameSite, csrf)
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
		t.Fatalf("after %d failures: %d, want 429 with Retry-After", adminauth.FailureBucket.Burst, r.status)
	}
}

func TestOperatorLogout(t *testing.T) {
	t.Parallel()
	s := operatorServer(t, opToken)
	sess := login(t, s)
	csrf := csrfOf(t, s, sess)
	if r := opDo(t, s, http.MethodPost, "/panel/admin/logout", url.Values{"csrf": {"bad"}}, sameSite, sess); r.status != http.StatusForbidden {
		t.Fatalf("logout with a bad CSRF token: %d, want 403", r.status)
	}
	if r := opDo(t, s, http.MethodPost, "/panel/admin/logout", url.Values{"csrf": {csrf}}, map[string]string{"Origin": "http://evil.example"}, sess); r.status != http.StatusForbidden {
		t.Fatalf("logout from another origin: %d, want 403", r.status)
	}
	r := opDo(t, s, http.MethodPost, "/panel/admin/logout", url.Values{"csrf": {csrf}}, sameSite, sess)
	c := r.cookie[operatorSessionName]
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/panel/admin/login" || c == nil || c.MaxAge >= 0 || c.Value != "" {
		t.Fatalf("logout: %d to %q, cookie %v; want 303 to the login and the cookie cleared", r.status, r.header.Get("Location"), c)
	}
	checkCookie(t, c)
}

// Without an admin token the view refuses, as the admin API does.
func TestOperatorViewOffWithoutAdminToken(t *testing.T) {
	t.Parallel()
	s := operatorServer(t, "")
	for _, p := range []struct{ method, path string }{{"GET", "/panel/admin"}, {"GET", "/panel/admin/login"}, {"POST", "/panel/admin/login"}} {
		r := opDo(t, s, p.method, p.path, url.Values{"token": {""}}, sameSite)
		if r.status != http.StatusUnauthorized || !strings.Contains(r.body, "AGENTQ_ADMIN_TOKEN") || len(r.cookie) != 0 {
			t.Errorf("%s %s without an admin token: %d, cookies %v", p.method, p.path, r.status, r.cookie)
		}
	}
}

// Pages carry a strict CSP (no inline script or style) and are not cached; the
// assets are embedded.
func TestOperatorHeadersAndAssets(t *testing.T) {
	t.Parallel()
	s := operatorServer(t, opToken)
	r := opDo(t, s, http.MethodGet, "/panel/admin/login", nil, nil)
	if csp := r.header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
		t.Errorf("CSP %q", csp)
	}
	if r.header.Get("Cache-Control") != "no-store" || r.header.Get("X-Frame-Options") != "DENY" {
		t.Errorf("headers %v", r.header)
	}
	for path, ct := range map[string]string{"/panel/admin/assets/operator.css": "text/css", "/panel/admin/assets/operator.js": "text/javascript"} {
		if r := opDo(t, s, http.MethodGet, path, nil, nil); r.status != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), ct) || len(r.body) < 100 {
			t.Errorf("%s: %d %q (%d bytes)", path, r.status, r.header.Get("Content-Type"), len(r.body))
		}
	}
}

// The overview's pools table: configured and effective rate, the last minute's use,
// the waiting tenants with their shares, the agents; a note when there is none.
func TestOperatorViewShowsPools(t *testing.T) {
	t.Parallel()
	render := func(ov operator.Overview) string {
		t.Helper()
		var buf bytes.Buffer
		if err := operatorTmpl.ExecuteTemplate(&buf, "operator.html", viewPage{Overview: ov}); err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}
	if html := render(operator.Overview{}); !strings.Contains(html, "No model pool.") {
		t.Error("no note for a deployment without pools")
	}
	html := render(operator.Overview{Pools: []pools.Pool{{
		Config: quotas.PoolConfig{Name: "llm", TokensPerMinute: 120000, BurstTokens: 6000, RequestsPerMinute: 600},
		Status: quotas.PoolStatus{EffectiveRate: 84000, UsedLastMinute: 91500, Throttled: true,
			Waiting: []quotas.PoolWaiter{{Tenant: "acme", Weight: 3, Share: 0.75}, {Tenant: "globex", Weight: 1, Share: 0.25}}},
		Agents: []pools.AgentTokens{{Agent: "sim", TokensPerStep: 1000}},
	}}})
	for _, want := range []string{`<tr data-pool="llm" data-effective="84000" data-used="91500">`, "120,000 <span", "burst 6,000",
		"600 steps/min", `84,000 <span class="tag">throttled</span>`, `data-tenant="acme">acme 75.0 %`, "globex 25.0 %", "sim 1,000/step"} {
		if !strings.Contains(html, want) {
			t.Errorf("the pools table lacks %q", want)
		}
	}
}

// Concurrent wrong sign-ins from one address: only the burst is compared and answered
// 401, the rest are refused, however they interleave.
func TestOperatorLoginConcurrentWrongGuesses(t *testing.T) {
	t.Parallel()
	s := operatorServer(t, opToken)
	csrf := loginCSRF(t, s)
	got := webtest.Concurrently(60, func() int {
		form := url.Values{"token": {"wrong"}, "csrf": {csrf.Value}}
		r := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:8080/panel/admin/login", strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Origin", "http://127.0.0.1:8080")
		r.AddCookie(csrf)
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, r)
		return rec.Code
	})
	if got[http.StatusUnauthorized] > 10 || got[http.StatusTooManyRequests] == 0 {
		t.Fatalf("60 wrong sign-ins at once: %v, want at most 10 answered 401 and the rest 429", got)
	}
}

// The overview's recent changes: each row with who, what and the fields it moved.
func TestOperatorViewShowsRecentChanges(t *testing.T) {
	t.Parallel()
	render := func(ov operator.Overview) string {
		t.Helper()
		var buf bytes.Buffer
		if err := operatorTmpl.ExecuteTemplate(&buf, "operator.html", viewPage{Overview: ov}); err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}
	if html := render(operator.Overview{}); !strings.Contains(html, "No change recorded yet.") {
		t.Error("no note for an empty audit log")
	}
	html := render(operator.Overview{Changes: []operator.Change{{
		Row: audit.Row{ID: 12, At: time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC), Action: "tenant.update",
			Actor:        agentqtype.Actor{Kind: agentqtype.ActorCredential, Name: "admin"},
			ClaimedActor: "alice", Reason: "upgrade", Object: audit.Object{Kind: "tenant", ID: "acme", Tenant: "acme"}},
		Diff: []audit.FieldChange{{Field: "plan", Before: []byte(`"free"`), After: []byte(`"pro"`)}},
	}}})
	for _, want := range []string{`<tr data-audit="12">`, "2026-12-07 10:00:00Z", "credential admin", "says alice", "“upgrade”",
		"tenant.update", "tenant acme", `<span class="k">plan</span> &#34;free&#34; → &#34;pro&#34;`} {
		if !strings.Contains(html, want) {
			t.Errorf("the changes table lacks %q", want)
		}
	}
}
