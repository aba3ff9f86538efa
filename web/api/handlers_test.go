package api

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/runtime"
	"github.com/agentq/agentq/web/internal/adminauth"
	"github.com/agentq/agentq/web/internal/panellink"
	"github.com/agentq/agentq/web/internal/webtest"
)

// apiFixture is the API over real services on the test's own schema and Redis
// prefix, called through its http.Handler (no listener).
type apiFixture struct {
	webtest.Env
	t     *testing.T
	s     *API
	h     http.Handler
	admin string
}

func newAPIFixture(t *testing.T) *apiFixture {
	t.Helper()
	env := webtest.New(t)
	links, err := panellink.New([]byte("panel secret"), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := New(Deps{
		Tenants: env.Svc.Tenants, APIKeys: env.Svc.Keys, Tasks: env.Svc.Tasks, HTTPAgents: env.Svc.Agents,
		Pools: env.Svc.Pools, Queue: env.Scheduler, Redis: env.Redis, Keys: env.Keys, Plans: env.Plans,
		Admission: env.Admission, Credentials: env.Svc.Credentials, AdminAuth: adminauth.New(env.Svc.Credentials, env.Admission), PanelLinks: links,
		Logger: env.Arch.Logger,
	})
	return &apiFixture{Env: env, t: t, s: s, h: serve(s), admin: env.AdminToken}
}

// serve is s behind what the server puts before every API request: the error body
// and the input check.
func serve(s *API) http.Handler {
	e := echo.New()
	e.HTTPErrorHandler = ErrorHandler(s.log)
	e.Use(ValidateInput)
	s.Mount(e)
	return e
}

// call sends a request with the bearer token (none when empty) and returns the status
// and the raw body.
func (f *apiFixture) call(method, path, token, body string) (int, []byte) {
	f.t.Helper()
	st, _, b := webtest.Call(f.h, "", method, path, token, body)
	return st, b
}

// callFrom is call from the client address addr.
func (f *apiFixture) callFrom(addr, method, path, token string) (int, http.Header, []byte) {
	f.t.Helper()
	return webtest.Call(f.h, addr, method, path, token, "")
}

func errorOf(t *testing.T, body []byte) (string, string) { t.Helper(); return webtest.ErrorOf(t, body) }

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
	if got := webtest.TopKeys(t, body); !slices.Equal(got, append(slices.Clone(agentFields), "signing_secret")) {
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
	if stored, err := f.Svc.Agents.Get(ctx, "echo"); err != nil || stored.SigningSecret != created.SigningSecret || stored.Headers["X-Api-Key"] != "hunter2" {
		t.Fatalf("stored agent %+v %v", stored, err)
	}

	// A second PUT replaces it and keeps its secret.
	st, body = f.call("PUT", "/v1/admin/agents/echo", f.admin, `{"url":"https://agent.example/step","step_timeout_s":5}`)
	if st != http.StatusOK || strings.Contains(string(body), "signing_secret\"") || !slices.Equal(webtest.TopKeys(t, body), agentFields) {
		t.Fatalf("PUT existing agent: %d %s", st, body)
	}
	if stored, _ := f.Svc.Agents.Get(ctx, "echo"); stored.SigningSecret != created.SigningSecret || stored.URL != "https://agent.example/step" || stored.StepTimeoutS != 5 {
		t.Errorf("replaced agent %+v", stored)
	}

	st, body = f.call("GET", "/v1/admin/agents/echo", f.admin, "")
	if st != http.StatusOK || !slices.Equal(webtest.TopKeys(t, body), agentFields) || strings.Contains(string(body), created.SigningSecret) {
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
	exec, found, err := f.Svc.Agents.Resolver(nil, nil)(ctx, "echo")
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
	if as, err := f.Svc.Agents.List(context.Background()); err != nil || len(as) != 0 {
		t.Errorf("agents after the refusals: %+v %v", as, err)
	}
}

// Wrong admin tokens sent at once from one address: a small burst is answered 401, the
// rest 429 with Retry-After and the rate-limit error body. While the address is
// refused even the right token is (or the answers would tell a right guess from a
// wrong one); other addresses are not affected, and right tokens never count.
func TestAdminWrongTokensLimitedPerAddress(t *testing.T) {
	t.Parallel()
	f := newAPIFixture(t)
	got := webtest.Concurrently(60, func() int {
		st, _, _ := f.callFrom("192.0.2.1:4000", http.MethodGet, "/v1/admin/tenants", "wrong-"+testenv.ID())
		return st
	})
	if got[http.StatusTooManyRequests] == 0 || got[http.StatusUnauthorized] > 10 || got[http.StatusUnauthorized]+got[http.StatusTooManyRequests] != 60 {
		t.Fatalf("60 wrong admin tokens at once: %v, want at most 10 answered 401 and the rest 429", got)
	}
	st, h, body := f.callFrom("192.0.2.1:4001", http.MethodGet, "/v1/admin/tenants", "wrong")
	var eb struct {
		Error struct {
			Code              string   `json:"code"`
			Message           string   `json:"message"`
			LimitType         string   `json:"limit_type"`
			RetryAfterSeconds int64    `json:"retry_after_seconds"`
			Violated          []string `json:"violated"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &eb); err != nil || st != http.StatusTooManyRequests {
		t.Fatalf("a wrong token past the burst: %d %s", st, body)
	}
	ra, _ := strconv.Atoi(h.Get("Retry-After"))
	if ra < 1 || eb.Error.Code != "RATE_LIMIT_EXCEEDED" || eb.Error.LimitType != "admin_auth_failures" ||
		eb.Error.RetryAfterSeconds != int64(ra) || len(eb.Error.Violated) != 1 || eb.Error.Message == "" {
		t.Fatalf("the refusal: Retry-After %q, body %s", h.Get("Retry-After"), body)
	}
	if st, _, body := f.callFrom("192.0.2.1:4002", http.MethodGet, "/v1/admin/tenants", f.admin); st != http.StatusTooManyRequests {
		t.Fatalf("the right token from the refused address: %d %s, want 429", st, body)
	}
	if st, _, body := f.callFrom("198.51.100.2:4000", http.MethodGet, "/v1/admin/tenants", f.admin); st != http.StatusOK {
		t.Fatalf("the right token from another address: %d %s", st, body)
	}
	// Right tokens, however many and however fast, are never refused.
	ok := webtest.Concurrently(300, func() int {
		st, _, _ := f.callFrom("198.51.100.3:4000", http.MethodGet, "/v1/admin/plans", f.admin)
		return st
	})
	if ok[http.StatusOK] != 300 {
		t.Fatalf("300 admin requests with the right token at once: %v, want all 200", ok)
	}
	// A request without a token guesses nothing and is not counted.
	for range 20 {
		if st, _, _ := f.callFrom("198.51.100.3:4000", http.MethodGet, "/v1/admin/plans", ""); st != http.StatusUnauthorized {
			t.Fatalf("no token: %d", st)
		}
	}
	if st, _, _ := f.callFrom("198.51.100.3:4000", http.MethodGet, "/v1/admin/plans", f.admin); st != http.StatusOK {
		t.Fatalf("the right token after requests without one: %d", st)
	}
}
