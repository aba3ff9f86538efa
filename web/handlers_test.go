package web

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/keys"
	"github.com/agentq/agentq/internal/services"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/web/api"
	"github.com/agentq/agentq/web/internal/webtest"
)

// serverFixture is a Server over real services on the test's own schema and Redis
// prefix, called through its http.Handler (no listener).
type serverFixture struct {
	webtest.Env
	t     *testing.T
	s     *Server
	admin string
}

func newServerFixture(t *testing.T) *serverFixture {
	t.Helper()
	env := webtest.New(t)
	s := New(Deps{
		Tenants: env.Svc.Tenants, APIKeys: env.Svc.Keys, Tasks: env.Svc.Tasks, HTTPAgents: env.Svc.Agents,
		Pools: env.Svc.Pools, Audit: env.Svc.Audit, Postgres: env.Pool, Queue: env.Scheduler, Redis: env.Redis, Keys: env.Keys,
		Admission: env.Admission, Credentials: env.Svc.Credentials, AdminToken: env.AdminToken, Archetype: env.Arch,
	})
	return &serverFixture{Env: env, t: t, s: s, admin: env.AdminToken}
}

// call sends a request with the bearer token (none when empty) and returns the status
// and the raw body.
func (f *serverFixture) call(method, path, token, body string) (int, []byte) {
	f.t.Helper()
	st, _, b := webtest.Call(f.s.Handler(), "", method, path, token, body)
	return st, b
}

// callFrom is call from the client address addr.
func (f *serverFixture) callFrom(addr, method, path, token string) (int, http.Header, []byte) {
	f.t.Helper()
	return webtest.Call(f.s.Handler(), addr, method, path, token, "")
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	f := newServerFixture(t)
	ctx := context.Background()
	plan := "pro"
	if _, err := f.Svc.Tenants.Create(ctx, tenants.CreateParams{ID: "acme", Plan: &plan}); err != nil {
		t.Fatal(err)
	}
	k, err := f.Svc.Keys.Create(ctx, keys.CreateParams{TenantID: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	tenantCall := func(token string) (int, string) {
		t.Helper()
		st, body := f.call("GET", "/v1/tasks", token, "")
		if st == http.StatusOK {
			return st, ""
		}
		_, msg := webtest.ErrorOf(t, body)
		return st, msg
	}
	missing, invalid := "Missing API key: send Authorization: Bearer aq_<kid>_<secret>.", "Invalid or revoked API key."
	for _, tc := range []struct {
		name, token string
		status      int
		msg         string
	}{
		{"no key", "", 401, missing},
		{"not a key", "hello", 401, invalid},
		{"unknown kid", "aq_acme-00000000_" + strings.Repeat("a", 64), 401, invalid},
		{"wrong secret", "aq_" + k.Kid + "_" + strings.Repeat("b", 64), 401, invalid},
		{"the key", k.Plaintext, 200, ""},
	} {
		if st, msg := tenantCall(tc.token); st != tc.status || msg != tc.msg {
			t.Errorf("%s: %d %q, want %d %q", tc.name, st, msg, tc.status, tc.msg)
		}
	}
	req := httptest.NewRequest("GET", "/v1/tasks", nil)
	req.Header.Set("Authorization", "Basic "+k.Plaintext)
	rec := httptest.NewRecorder()
	f.s.Handler().ServeHTTP(rec, req)
	if rec.Code != 401 {
		t.Errorf("the key as Basic credentials: %d", rec.Code)
	}

	// A rotation or revocation through this process's admin API takes effect at once,
	// although the key was just cached.
	st, body := f.call("POST", "/v1/admin/keys/"+k.Kid+"/rotate", f.admin, "")
	var rotated api.KeyCreated
	if err := json.Unmarshal(body, &rotated); st != 200 || err != nil || rotated.Key == k.Plaintext {
		t.Fatalf("rotate: %d %s", st, body)
	}
	if st, _ := tenantCall(k.Plaintext); st != 401 {
		t.Errorf("the old secret right after rotation: %d", st)
	}
	if st, _ := tenantCall(rotated.Key); st != 200 {
		t.Errorf("the new secret: %d", st)
	}
	if st, _ := f.call("DELETE", "/v1/admin/keys/"+k.Kid, f.admin, ""); st != 204 {
		t.Fatalf("revoke: %d", st)
	}
	if st, _ := tenantCall(rotated.Key); st != 401 {
		t.Errorf("a revoked key right after revocation: %d", st)
	}

	// A change made by another process (here a key service with no Redis, so nothing
	// is published) is honoured once its change message arrives.
	k2, err := f.Svc.Keys.Create(ctx, keys.CreateParams{TenantID: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := tenantCall(k2.Plaintext); st != 200 {
		t.Fatalf("a new key: %d", st)
	}
	other := services.New(services.Deps{Pool: f.Pool, Plans: f.s.Plans})
	if _, err := other.Keys.Revoke(ctx, k2.Kid); err != nil {
		t.Fatal(err)
	}
	f.s.invalidateLocal("k:" + k2.Kid)
	if st, _ := tenantCall(k2.Plaintext); st != 401 {
		t.Errorf("a key another process revoked, after its change message: %d", st)
	}

	// The admin API wants the admin token, and a server without one refuses everyone.
	for _, tok := range []string{"", "wrong", k2.Plaintext} {
		if st, body := f.call("GET", "/v1/admin/tenants", tok, ""); st != 401 {
			t.Errorf("admin with %q: %d %s", tok, st, body)
		}
	}
	noAdmin := New(Deps{Tenants: f.Svc.Tenants, APIKeys: f.Svc.Keys})
	rec = httptest.NewRecorder()
	req = httptest.NewRequest("GET", "/v1/admin/tenants", nil)
	req.Header.Set("Authorization", "Bearer ")
	noAdmin.Handler().ServeHTTP(rec, req)
	if rec.Code != 401 {
		t.Errorf("admin of a server without a token: %d", rec.Code)
	}
}

func TestReadiness(t *testing.T) {
	t.Parallel()
	f := newServerFixture(t)
	st, body := f.call("GET", "/readyz", "", "")
	if st != 200 || string(body) != `{"checks":{"postgres":"ok","redis":"ok"},"ready":true}`+"\n" {
		t.Errorf("readyz: %d %s", st, body)
	}
	closed := testenv.Postgres(t)
	closed.Close()
	down := New(Deps{Postgres: closed, Redis: f.s.Redis, Tenants: f.Svc.Tenants})
	rec := httptest.NewRecorder()
	down.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != 503 || rec.Body.String() != `{"checks":{"postgres":"unreachable","redis":"ok"},"ready":false}`+"\n" {
		t.Errorf("readyz with Postgres down: %d %s", rec.Code, rec.Body)
	}
}

// A tenant changed through this process's admin API applies to its next request,
// although the tenant was just cached; one changed by another process applies once
// its change message arrives.
func TestTenantChangesReachTheCache(t *testing.T) {
	t.Parallel()
	f := newServerFixture(t)
	ctx := context.Background()
	plan := "pro"
	if _, err := f.Svc.Tenants.Create(ctx, tenants.CreateParams{ID: "acme", Plan: &plan}); err != nil {
		t.Fatal(err)
	}
	k, err := f.Svc.Keys.Create(ctx, keys.CreateParams{TenantID: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	submit := func() (int, string) {
		t.Helper()
		st, body := f.call("POST", "/v1/tasks", k.Plaintext, `{"agent":"sim","input":{"steps":1}}`)
		if st == http.StatusAccepted {
			return st, ""
		}
		code, _ := webtest.ErrorOf(t, body)
		return st, code
	}
	if st, code := submit(); st != 202 {
		t.Fatalf("submit: %d %s", st, code)
	}
	if st, body := f.call("PATCH", "/v1/admin/tenants/acme", f.admin, `{"status":"suspended"}`); st != 200 {
		t.Fatalf("suspend: %d %s", st, body)
	}
	if st, code := submit(); st != 403 || code != api.CodeTenantSuspended {
		t.Errorf("submit right after the suspension: %d %s", st, code)
	}
	other := services.New(services.Deps{Pool: f.Pool, Plans: f.s.Plans}) // publishes nothing
	active := "active"
	if _, err := other.Tenants.Update(ctx, tenants.UpdateParams{ID: "acme", Status: &active}); err != nil {
		t.Fatal(err)
	}
	f.s.invalidateLocal("t:acme")
	if st, code := submit(); st != 202 {
		t.Errorf("submit after another process reactivated the tenant: %d %s", st, code)
	}
}

// Wrong admin tokens count per address across replicas (the count is in Redis) and
// across the admin API and the operator view's sign-in: guesses spread over both, or
// over several replicas, get no larger burst.
func TestAdminTokenFailuresSharedAcrossReplicasAndSignIn(t *testing.T) {
	t.Parallel()
	f := newServerFixture(t)
	other := New(Deps{Tenants: f.s.Tenants, APIKeys: f.s.APIKeys, Redis: f.s.Redis, Keys: f.s.Keys,
		Admission: f.s.Admission, AdminToken: f.admin,
		Archetype: &baseservice.Archetype{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}})
	const addr = "192.0.2.9:5000"
	for i := range 5 {
		if st, _, body := f.callFrom(addr, http.MethodGet, "/v1/admin/tenants", "wrong"); st != http.StatusUnauthorized {
			t.Fatalf("wrong token %d on replica A: %d %s", i+1, st, body)
		}
	}
	login := func(s *Server, token string) int {
		r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1:8080/panel/admin/login", nil)
		r.RemoteAddr = addr
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, r)
		var csrf *http.Cookie
		for _, c := range rec.Result().Cookies() {
			if c.Name == "aq_op_login" { // the sign-in form's CSRF cookie
				csrf = c
			}
		}
		if csrf == nil {
			t.Fatal("no CSRF cookie")
		}
		form := url.Values{"token": {token}, "csrf": {csrf.Value}}
		r = httptest.NewRequest(http.MethodPost, "http://127.0.0.1:8080/panel/admin/login", strings.NewReader(form.Encode()))
		r.RemoteAddr = addr
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Origin", "http://127.0.0.1:8080")
		r.AddCookie(csrf)
		rec = httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, r)
		return rec.Code
	}
	for i := range 5 {
		if st := login(other, "wrong"); st != http.StatusUnauthorized {
			t.Fatalf("wrong sign-in %d on replica B: %d", i+1, st)
		}
	}
	if st := login(other, "wrong"); st != http.StatusTooManyRequests {
		t.Fatalf("the 11th wrong token from one address, on replica B's sign-in: %d, want 429", st)
	}
	if st, _, body := f.callFrom(addr, http.MethodGet, "/v1/admin/tenants", "wrong"); st != http.StatusTooManyRequests {
		t.Fatalf("the 12th, on replica A's admin API: %d %s, want 429", st, body)
	}
	if st := login(other, f.admin); st != http.StatusTooManyRequests {
		t.Fatalf("the right token's sign-in from the refused address: %d, want 429", st)
	}
	if st, _, _ := f.callFrom("192.0.2.10:5000", http.MethodGet, "/v1/admin/tenants", f.admin); st != http.StatusOK {
		t.Fatalf("another address: %d", st)
	}
}
