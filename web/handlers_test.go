package web

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/keys"
	"github.com/agentq/agentq/internal/services"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
	"github.com/agentq/agentq/runtime"
	"github.com/agentq/agentq/scheduler"
)

// apiFixture is a Server over real services on the test's own schema and Redis
// prefix, called through its http.Handler (no listener).
type apiFixture struct {
	t     *testing.T
	s     *Server
	svc   *services.Services
	pool  *pgxpool.Pool
	admin string
}

func newAPIFixture(t *testing.T) *apiFixture {
	t.Helper()
	pool := testenv.Postgres(t)
	rdb, rk := testenv.Redis(t, 1)
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	arch := &baseservice.Archetype{Logger: log}
	guard := admission.NewGuard(admission.New(rdb, rk, nil), admission.GuardOptions{Timeout: 2 * time.Second, Archetype: arch})
	sched := scheduler.New(rdb, rk, scheduler.Options{})
	svc := services.New(services.Deps{
		Pool: pool, Plans: plans, Redis: rdb, Keys: rk, Scheduler: sched, Admission: guard,
		Agents: runtime.NewRegistry(), Archetype: arch,
	})
	admin := "admin-" + testenv.ID()
	s := New(Deps{
		Tenants: svc.Tenants, APIKeys: svc.Keys, Tasks: svc.Tasks, HTTPAgents: svc.Agents, Pools: svc.Pools,
		Postgres: pool, Queue: sched, Redis: rdb, Keys: rk, Admission: guard, AdminToken: admin, Archetype: arch,
	})
	return &apiFixture{t: t, s: s, svc: svc, pool: pool, admin: admin}
}

// call sends a request with the bearer token (none when empty) and returns the status
// and the raw body.
func (f *apiFixture) call(method, path, token, body string) (int, []byte) {
	f.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, rd)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	f.s.Handler().ServeHTTP(rec, req)
	return rec.Code, rec.Body.Bytes()
}

// errorOf is the code and message of an error body.
func errorOf(t *testing.T, body []byte) (string, string) {
	t.Helper()
	var eb struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal(body, &eb); err != nil {
		t.Fatalf("%q is not an error body: %v", body, err)
	}
	return eb.Error.Code, eb.Error.Message
}

// topKeys is the keys of a JSON object, in the order they appear.
func topKeys(t *testing.T, body []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("%q is not a JSON object", body)
	}
	var out []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

var agentFields = []string{"name", "url", "step_timeout_s", "headers", "signing_secret_created_at", "created_at", "updated_at"}

func TestAgentHandlers(t *testing.T) {
	t.Parallel()
	f := newAPIFixture(t)
	ctx := context.Background()

	// First PUT registers the agent and shows its signing secret, once.
	st, body := f.call("PUT", "/v1/admin/agents/echo", f.admin, `{"url":"http://127.0.0.1:9/step","headers":{"X-Api-Key":"hunter2"}}`)
	if st != http.StatusCreated {
		t.Fatalf("PUT new agent: %d %s", st, body)
	}
	if got := topKeys(t, body); !slices.Equal(got, append(slices.Clone(agentFields), "signing_secret")) {
		t.Errorf("registration shows fields %v", got)
	}
	var created struct {
		StepTimeoutS  float64           `json:"step_timeout_s"`
		Headers       map[string]string `json:"headers"`
		SigningSecret string            `json:"signing_secret"`
	}
	_ = json.Unmarshal(body, &created)
	if created.StepTimeoutS != 30 || created.Headers["X-Api-Key"] != "********" || !strings.HasPrefix(created.SigningSecret, "aqsig_") {
		t.Errorf("registration answer %s", body)
	}
	if stored, err := f.svc.Agents.Get(ctx, "echo"); err != nil || stored.SigningSecret != created.SigningSecret || stored.Headers["X-Api-Key"] != "hunter2" {
		t.Fatalf("stored agent %+v %v", stored, err)
	}

	// A second PUT replaces it and keeps its secret.
	st, body = f.call("PUT", "/v1/admin/agents/echo", f.admin, `{"url":"https://agent.example/step","step_timeout_s":5}`)
	if st != http.StatusOK || strings.Contains(string(body), "signing_secret\"") || !slices.Equal(topKeys(t, body), agentFields) {
		t.Fatalf("PUT existing agent: %d %s", st, body)
	}
	if stored, _ := f.svc.Agents.Get(ctx, "echo"); stored.SigningSecret != created.SigningSecret || stored.URL != "https://agent.example/step" || stored.StepTimeoutS != 5 {
		t.Errorf("replaced agent %+v", stored)
	}

	st, body = f.call("GET", "/v1/admin/agents/echo", f.admin, "")
	if st != http.StatusOK || !slices.Equal(topKeys(t, body), agentFields) || strings.Contains(string(body), created.SigningSecret) {
		t.Errorf("GET agent: %d %s", st, body)
	}
	st, body = f.call("GET", "/v1/admin/agents", f.admin, "")
	var list struct{ Agents []map[string]any }
	if err := json.Unmarshal(body, &list); st != http.StatusOK || err != nil || len(list.Agents) != 1 || list.Agents[0]["name"] != "echo" {
		t.Errorf("GET agents: %d %s", st, body)
	}

	// Rotation shows a new secret, which the workers' resolver then signs with.
	st, body = f.call("POST", "/v1/admin/agents/echo/rotate-secret", f.admin, "")
	var rotated struct {
		SigningSecret string `json:"signing_secret"`
	}
	if err := json.Unmarshal(body, &rotated); st != http.StatusOK || err != nil || rotated.SigningSecret == created.SigningSecret ||
		!strings.HasPrefix(rotated.SigningSecret, "aqsig_") {
		t.Fatalf("rotate: %d %s", st, body)
	}
	exec, found, err := f.svc.Agents.Resolver(nil, nil)(ctx, "echo")
	if ha, ok := exec.(*runtime.HTTPAgent); err != nil || !found || !ok || string(ha.Secret) != rotated.SigningSecret || ha.Timeout != 5*time.Second {
		t.Errorf("resolver: %+v %v %v", exec, found, err)
	}

	if st, body := f.call("DELETE", "/v1/admin/agents/echo", f.admin, ""); st != http.StatusNoContent || len(body) != 0 {
		t.Errorf("DELETE: %d %s", st, body)
	}
	for _, r := range []struct{ method, path string }{
		{"GET", "/v1/admin/agents/echo"}, {"DELETE", "/v1/admin/agents/echo"}, {"POST", "/v1/admin/agents/echo/rotate-secret"},
	} {
		st, body := f.call(r.method, r.path, f.admin, "")
		if code, msg := errorOf(t, body); st != http.StatusNotFound || code != CodeNotFound || msg != `No HTTP agent "echo".` {
			t.Errorf("%s %s of a deleted agent: %d %s", r.method, r.path, st, body)
		}
	}
	if st, body := f.call("GET", "/v1/admin/agents", f.admin, ""); st != http.StatusOK || string(body) != `{"agents":[]}`+"\n" {
		t.Errorf("GET agents when there are none: %d %q", st, body)
	}
}

// Each refused registration gets its status and sentence, and writes nothing.
func TestAgentRegistrationRefusals(t *testing.T) {
	t.Parallel()
	f := newAPIFixture(t)
	long := "http://a.example/" + strings.Repeat("x", 2048)
	for _, tc := range []struct {
		name, path, body string
		status           int
		code, msg        string
	}{
		{"bad name", "/v1/admin/agents/-x", `{"url":"http://a.example"}`, 400, CodeInvalidRequest,
			"Agent names are 1 to 63 letters, digits, '.', '-' or '_'."},
		{"bad name before a bad body", "/v1/admin/agents/-x", `{`, 400, CodeInvalidRequest,
			"Agent names are 1 to 63 letters, digits, '.', '-' or '_'."},
		{"built-in name", "/v1/admin/agents/sim", `{"url":"http://a.example"}`, 409, CodeConflict,
			`Agent "sim" is built in or registered in process; pick another name.`},
		{"empty body", "/v1/admin/agents/a1", ``, 400, CodeInvalidJSON, "The request body is empty; send a JSON object."},
		{"unknown field", "/v1/admin/agents/a1", `{"url":"http://a.example","secret":"x"}`, 400, CodeInvalidRequest, `Unknown field "secret".`},
		{"url not ASCII", "/v1/admin/agents/a1", `{"url":"http://ä.example"}`, 400, CodeInvalidRequest,
			"url must be printable ASCII of at most 2048 bytes."},
		{"url too long", "/v1/admin/agents/a1", `{"url":"` + long + `"}`, 400, CodeInvalidRequest,
			"url must be printable ASCII of at most 2048 bytes."},
		{"relative url", "/v1/admin/agents/a1", `{"url":"/step"}`, 400, CodeInvalidRequest, "url must be an absolute http or https URL."},
		{"ftp url", "/v1/admin/agents/a1", `{"url":"ftp://a.example/"}`, 400, CodeInvalidRequest, "url must be an absolute http or https URL."},
		{"timeout 0", "/v1/admin/agents/a1", `{"url":"http://a.example","step_timeout_s":0}`, 400, CodeInvalidRequest,
			"step_timeout_s must be above 0 and at most 3600."},
		{"timeout above an hour", "/v1/admin/agents/a1", `{"url":"http://a.example","step_timeout_s":3601}`, 400, CodeInvalidRequest,
			"step_timeout_s must be above 0 and at most 3600."},
		{"header name", "/v1/admin/agents/a1", `{"url":"http://a.example","headers":{"X Key":"v"}}`, 400, CodeInvalidRequest,
			`Header "X Key" is not a valid HTTP header.`},
		{"header value", "/v1/admin/agents/a1", `{"url":"http://a.example","headers":{"X-Key":"a\nb"}}`, 400, CodeInvalidRequest,
			`Header "X-Key" is not a valid HTTP header.`},
		{"reserved header", "/v1/admin/agents/a1", `{"url":"http://a.example","headers":{"x-agentq-signature":"v"}}`, 400, CodeInvalidRequest,
			`Header "x-agentq-signature" is set by agentq and cannot be configured.`},
	} {
		st, body := f.call("PUT", tc.path, f.admin, tc.body)
		if code, msg := errorOf(t, body); st != tc.status || code != tc.code || msg != tc.msg {
			t.Errorf("%s: %d %s %q, want %d %s %q", tc.name, st, code, msg, tc.status, tc.code, tc.msg)
		}
	}
	if as, err := f.svc.Agents.List(context.Background()); err != nil || len(as) != 0 {
		t.Errorf("agents after the refusals: %+v %v", as, err)
	}
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	f := newAPIFixture(t)
	ctx := context.Background()
	plan := "pro"
	if _, err := f.svc.Tenants.Create(ctx, tenants.CreateParams{ID: "acme", Plan: &plan}); err != nil {
		t.Fatal(err)
	}
	k, err := f.svc.Keys.Create(ctx, keys.CreateParams{TenantID: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	tenantCall := func(token string) (int, string) {
		t.Helper()
		st, body := f.call("GET", "/v1/tasks", token, "")
		if st == http.StatusOK {
			return st, ""
		}
		_, msg := errorOf(t, body)
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
	var rotated KeyCreated
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
	k2, err := f.svc.Keys.Create(ctx, keys.CreateParams{TenantID: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := tenantCall(k2.Plaintext); st != 200 {
		t.Fatalf("a new key: %d", st)
	}
	other := services.New(services.Deps{Pool: f.pool, Plans: f.s.Plans})
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
	noAdmin := New(Deps{Tenants: f.svc.Tenants, APIKeys: f.svc.Keys})
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
	f := newAPIFixture(t)
	st, body := f.call("GET", "/readyz", "", "")
	if st != 200 || string(body) != `{"checks":{"postgres":"ok","redis":"ok"},"ready":true}`+"\n" {
		t.Errorf("readyz: %d %s", st, body)
	}
	closed := testenv.Postgres(t)
	closed.Close()
	down := New(Deps{Postgres: closed, Redis: f.s.Redis, Tenants: f.svc.Tenants})
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
	f := newAPIFixture(t)
	ctx := context.Background()
	plan := "pro"
	if _, err := f.svc.Tenants.Create(ctx, tenants.CreateParams{ID: "acme", Plan: &plan}); err != nil {
		t.Fatal(err)
	}
	k, err := f.svc.Keys.Create(ctx, keys.CreateParams{TenantID: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	submit := func() (int, string) {
		t.Helper()
		st, body := f.call("POST", "/v1/tasks", k.Plaintext, `{"agent":"sim","input":{"steps":1}}`)
		if st == http.StatusAccepted {
			return st, ""
		}
		code, _ := errorOf(t, body)
		return st, code
	}
	if st, code := submit(); st != 202 {
		t.Fatalf("submit: %d %s", st, code)
	}
	if st, body := f.call("PATCH", "/v1/admin/tenants/acme", f.admin, `{"status":"suspended"}`); st != 200 {
		t.Fatalf("suspend: %d %s", st, body)
	}
	if st, code := submit(); st != 403 || code != CodeTenantSuspended {
		t.Errorf("submit right after the suspension: %d %s", st, code)
	}
	other := services.New(services.Deps{Pool: f.pool, Plans: f.s.Plans}) // publishes nothing
	active := "active"
	if _, err := other.Tenants.Update(ctx, tenants.UpdateParams{ID: "acme", Status: &active}); err != nil {
		t.Fatal(err)
	}
	f.s.invalidateLocal("t:acme")
	if st, code := submit(); st != 202 {
		t.Errorf("submit after another process reactivated the tenant: %d %s", st, code)
	}
}
