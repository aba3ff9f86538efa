package e2e_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/runtime"
)

// syncBuffer collects a process's log lines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// withLog sends the process's logs (debug and up) to buf.
func withLog(buf *syncBuffer) func(*agentq.Options) {
	return func(o *agentq.Options) {
		o.Logger = slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
}

// stepCall is one step request an agent received.
type stepCall struct {
	method, uri string
	header      http.Header
	body        []byte
}

// rawAgent answers each step with the task input's "reply" (raw JSON) and "status"
// (default 200), plus a Location header from "location"; it records every request.
type rawAgent struct {
	srv   *httptest.Server
	mu    sync.Mutex
	calls []stepCall
}

func newRawAgent(t *testing.T) *rawAgent {
	a := &rawAgent{}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		a.mu.Lock()
		a.calls = append(a.calls, stepCall{method: r.Method, uri: r.RequestURI, header: r.Header.Clone(), body: body})
		a.mu.Unlock()
		var req runtime.StepRequest
		_ = json.Unmarshal(body, &req)
		var in struct {
			Status   int    `json:"status"`
			Reply    string `json:"reply"`
			Location string `json:"location"`
		}
		_ = json.Unmarshal(req.Input, &in)
		if in.Location != "" {
			w.Header().Set("Location", in.Location)
		}
		if in.Status != 0 {
			w.WriteHeader(in.Status)
		}
		_, _ = io.WriteString(w, in.Reply)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *rawAgent) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.calls)
}

func (a *rawAgent) last() stepCall {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls[len(a.calls)-1]
}

// registered is the answer to PUT /v1/admin/agents/{name}.
type registered struct {
	Name          string            `json:"name"`
	Headers       map[string]string `json:"headers"`
	SigningSecret string            `json:"signing_secret"`
}

func (h *harness) putAgent(name string, body map[string]any, wantStatus int) registered {
	h.t.Helper()
	var out registered
	var raw map[string]any
	st, _ := h.do("PUT", "/v1/admin/agents/"+name, h.admin, body, &raw)
	if st != wantStatus {
		h.t.Fatalf("PUT agent %s: %d %v", name, st, raw)
	}
	b, _ := json.Marshal(raw)
	_ = json.Unmarshal(b, &out)
	return out
}

// nanAgent is a Go handler that reports a non-finite cost.
type nanAgent struct{}

func (nanAgent) Step(context.Context, runtime.StepRequest) (runtime.StepResult, error) {
	return runtime.StepResult{Done: true, Usage: runtime.StepUsage{Tokens: 1, CostUSD: math.NaN()}}, nil
}

// Usage an agent reports is checked before anything is billed: a negative, huge or
// non-finite count fails the step with an error naming the agent, the step and the
// field, and nothing reaches the ledger or the tenant's counters.
func TestBadUsageFromAnAgentFailsTheStep(t *testing.T) {
	t.Parallel()
	agents := runtime.NewRegistry()
	agents.Register("nan", nanAgent{})
	h := start(t, func(o *agentq.Options) { o.Agents = agents })
	a := newRawAgent(t)
	h.putAgent("raw", map[string]any{"url": a.srv.URL + "/step"}, 201)
	c, key := h.tenantClient("usage", "pro", nil)
	cases := []struct {
		name, usage, field string
	}{
		{"huge cost", `{"tokens":1,"cost_usd":1e300}`, "cost_usd"},
		{"cost beyond float64", `{"tokens":1,"cost_usd":1e400}`, "cost_usd"},
		{"tokens beyond int64", `{"tokens":1e30,"cost_usd":0}`, "tokens"},
		{"cost past int64 micro-dollars", `{"tokens":1,"cost_usd":9300000000000}`, "cost_usd"},
		{"negative cost", `{"tokens":1,"cost_usd":-0.5}`, "cost_usd"},
		{"negative tokens", `{"tokens":-5,"cost_usd":0.001}`, "tokens"},
		{"huge tokens", `{"tokens":9223372036854775807,"cost_usd":0.001}`, "tokens"},
	}
	for _, tc := range cases {
		before := a.count()
		reply := `{"done":true,"output":{},"usage":` + tc.usage + `}`
		task := run(t, c, client.SubmitTaskRequest{Agent: "raw", Input: map[string]any{"reply": reply}})
		msg := deref(task.Error)
		if task.State != "failed" || !strings.Contains(msg, `agent "raw"`) || !strings.Contains(msg, "step 1") || !strings.Contains(msg, tc.field) {
			t.Errorf("%s: %s %q; want failed naming agent \"raw\", step 1 and %s", tc.name, task.State, msg, tc.field)
		}
		if n := a.count() - before; n != 1 {
			t.Errorf("%s: %d calls to the agent; bad usage is not retried", tc.name, n)
		}
		if task.Usage.Steps != 0 || task.Usage.Tokens != 0 || task.Usage.CostUSD != 0 {
			t.Errorf("%s: the bad step was counted: %+v", tc.name, task.Usage)
		}
		rows, err := h.app.Store().TaskLedger(context.Background(), store.TaskLedgerParams{TenantID: task.TenantID, TaskID: uuid.MustParse(task.ID)})
		if err != nil || len(rows) != 0 {
			t.Errorf("%s: %d ledger rows (%v)", tc.name, len(rows), err)
		}
	}
	task := run(t, c, client.SubmitTaskRequest{Agent: "nan"})
	if msg := deref(task.Error); task.State != "failed" || !strings.Contains(msg, `agent "nan"`) || !strings.Contains(msg, "cost_usd") {
		t.Errorf("NaN cost: %s %q", task.State, msg)
	}
	u := h.usage(key.Key)
	if u["agent_steps_daily"]["used"] != 0.0 || u["ai_tokens_monthly"]["used"] != 0.0 || u["usd_monthly"]["used"] != 0.0 {
		t.Fatalf("quota counters moved: steps %v tokens %v usd %v", u["agent_steps_daily"]["used"], u["ai_tokens_monthly"]["used"], u["usd_monthly"]["used"])
	}
}

// A failed step tells the tenant the agent, the step and the kind of failure, never the
// agent's URL; the log has the detail with the URL's credentials redacted.
func TestAgentFailuresShowNoURLOrCredential(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	h := start(t, withLog(&logs))
	h.putAgent("gone", map[string]any{"url": "http://opsuser:hunter2pw@127.0.0.1:1/run?api_key=sekrit-value&x=1", "step_timeout_s": 1}, 201)
	a := newRawAgent(t)
	h.putAgent("talky", map[string]any{"url": a.srv.URL + "/step?token=sekrit-value"}, 201)
	c, _ := h.tenantClient("urls", "pro", nil)
	for _, tc := range []struct {
		agent string
		input map[string]any
		kind  string
	}{
		{"gone", nil, "could not connect"},
		{"talky", map[string]any{"status": 400, "reply": `{"error":"field q is wrong"}`}, "HTTP 400"},
	} {
		task := run(t, c, client.SubmitTaskRequest{Agent: tc.agent, Input: tc.input})
		msg := deref(task.Error)
		if task.State != "failed" || !strings.Contains(msg, `agent "`+tc.agent+`"`) || !strings.Contains(msg, "step 1") || !strings.Contains(msg, tc.kind) {
			t.Errorf("%s: %s %q; want failed naming the agent, step 1 and %q", tc.agent, task.State, msg, tc.kind)
		}
		for _, leak := range []string{"127.0.0.1", "api_key", "sekrit", "hunter2", "opsuser", "dial tcp", "http://", "/run", "/step", "field q"} {
			if strings.Contains(msg, leak) {
				t.Errorf("%s: the task error %q shows %q", tc.agent, msg, leak)
			}
		}
	}
	out := logs.String()
	for _, leak := range []string{"sekrit", "hunter2"} {
		if strings.Contains(out, leak) {
			t.Errorf("the log shows %q:\n%s", leak, out)
		}
	}
	if !strings.Contains(out, "connection refused") || !strings.Contains(out, "field q is wrong") || !strings.Contains(out, "api_key=REDACTED") {
		t.Errorf("the log lacks the failure's detail:\n%s", out)
	}
}

// The runtime never follows an agent's redirect: the step fails, and the target never
// sees the credential headers or the signed body.
func TestAgentRedirectsAreNotFollowed(t *testing.T) {
	t.Parallel()
	h := start(t)
	target := newRawAgent(t)
	a := newRawAgent(t)
	h.putAgent("hop", map[string]any{"url": a.srv.URL + "/step", "headers": map[string]string{"Authorization": "Bearer agent-cred"}}, 201)
	c, _ := h.tenantClient("redir", "pro", nil)
	for _, code := range []int{301, 302, 303, 307, 308} {
		before := a.count()
		task := run(t, c, client.SubmitTaskRequest{Agent: "hop", Input: map[string]any{"status": code, "location": target.srv.URL + "/stolen"}})
		want := fmt.Sprintf("answered a redirect (%d)", code)
		if msg := deref(task.Error); task.State != "failed" || !strings.Contains(msg, want) || !strings.Contains(msg, `agent "hop"`) {
			t.Errorf("%d: %s %q; want failed with %q", code, task.State, msg, want)
		}
		if n := a.count() - before; n != 1 {
			t.Errorf("%d: %d calls; a redirect is not retried", code, n)
		}
	}
	if n := target.count(); n != 0 {
		t.Fatalf("the redirect target was called %d times", n)
	}
}

// signedPayload is what the step signature covers, as the docs tell agent authors:
// method, request URI (path and query as sent), timestamp and body, one per line.
func checkSignature(secret string, c stepCall) bool {
	ts := c.header.Get("X-Agentq-Timestamp")
	sig, ok := strings.CutPrefix(c.header.Get("X-Agentq-Signature"), "v1=")
	if ts == "" || !ok {
		return false
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(c.method + "\n" + c.uri + "\n" + ts + "\n"))
	mac.Write(c.body)
	want := hex.EncodeToString(mac.Sum(nil))
	return hmac.Equal([]byte(sig), []byte(want))
}

// Every agent has its own signing secret: shown once at registration and at rotation,
// never by GET, and a request signed for one agent does not verify with another's.
func TestEachAgentHasItsOwnSigningSecret(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	h := start(t, withLog(&logs))
	one, two := newRawAgent(t), newRawAgent(t)
	r1 := h.putAgent("one", map[string]any{"url": one.srv.URL + "/step?v=1"}, 201)
	r2 := h.putAgent("two", map[string]any{"url": two.srv.URL + "/step"}, 201)
	if r1.SigningSecret == "" || r2.SigningSecret == "" || r1.SigningSecret == r2.SigningSecret {
		t.Fatalf("registration secrets %q and %q; want two different secrets", r1.SigningSecret, r2.SigningSecret)
	}
	// Replacing the agent's URL or headers keeps its secret and does not show it again.
	if again := h.putAgent("one", map[string]any{"url": one.srv.URL + "/step?v=1"}, 200); again.SigningSecret != "" {
		t.Fatal("a replacing PUT showed the secret again")
	}
	for _, path := range []string{"/v1/admin/agents/one", "/v1/admin/agents"} {
		var got map[string]any
		h.do("GET", path, h.admin, nil, &got)
		if s := toJSON(got); strings.Contains(s, r1.SigningSecret) || strings.Contains(s, r2.SigningSecret) || strings.Contains(s, `"signing_secret"`) {
			t.Fatalf("GET %s shows a secret: %s", path, s)
		}
	}
	c, _ := h.tenantClient("sig", "pro", nil)
	done := `{"done":true,"output":{},"usage":{"tokens":1,"cost_usd":0}}`
	for _, tc := range []struct {
		agent      *rawAgent
		name       string
		own, other string
	}{{one, "one", r1.SigningSecret, r2.SigningSecret}, {two, "two", r2.SigningSecret, r1.SigningSecret}} {
		task := run(t, c, client.SubmitTaskRequest{Agent: tc.name, Input: map[string]any{"reply": done}})
		if task.State != "completed" {
			t.Fatalf("%s: %s %q", tc.name, task.State, deref(task.Error))
		}
		call := tc.agent.last()
		if !checkSignature(tc.own, call) {
			t.Errorf("%s: the step does not verify with its own secret (headers %v)", tc.name, call.header)
		}
		if checkSignature(tc.other, call) {
			t.Errorf("%s: the step verifies with another agent's secret", tc.name)
		}
	}

	var rot registered
	if st, _ := h.do("POST", "/v1/admin/agents/one/rotate-secret", h.admin, nil, &rot); st != 200 || rot.SigningSecret == "" || rot.SigningSecret == r1.SigningSecret {
		t.Fatalf("rotate: %d %+v", st, rot)
	}
	if st, _ := h.do("POST", "/v1/admin/agents/nobody/rotate-secret", h.admin, nil, nil); st != 404 {
		t.Fatalf("rotating an unknown agent: %d", st)
	}
	time.Sleep(1100 * time.Millisecond) // every replica's agent cache holds an entry for a second
	task := run(t, c, client.SubmitTaskRequest{Agent: "one", Input: map[string]any{"reply": done}})
	if task.State != "completed" {
		t.Fatalf("after rotation: %s", task.State)
	}
	if call := one.last(); !checkSignature(rot.SigningSecret, call) || checkSignature(r1.SigningSecret, call) {
		t.Fatal("after rotation the step is not signed with the new secret alone")
	}
	for _, s := range []string{r1.SigningSecret, r2.SigningSecret, rot.SigningSecret} {
		if strings.Contains(logs.String(), s) {
			t.Fatal("the log shows a signing secret")
		}
	}
}

// An agent registered before per-agent secrets (none stored) is signed with the
// deployment-wide AGENTQ_AGENT_SECRET until it is rotated; without that secret its
// steps fail with a clear error and the agent is never called.
func TestAgentsWithoutTheirOwnSecretFallBackToTheSharedOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.start(t, func(o *agentq.Options) { o.Config.AgentSecret = "legacy-shared-secret" })
	a := newRawAgent(t)
	h.putAgent("old", map[string]any{"url": a.srv.URL + "/step"}, 201)
	ctx := context.Background()
	// As the migration leaves an agent registered before it.
	if _, err := h.app.Store().Pool().Exec(ctx, `UPDATE agents SET signing_secret = NULL, signing_secret_created_at = NULL WHERE name = 'old'`); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	h.do("GET", "/v1/admin/agents/old", h.admin, nil, &got)
	if v, ok := got["signing_secret_created_at"]; !ok || v != nil {
		t.Fatalf("a legacy agent shows signing_secret_created_at %v", v)
	}
	c, _ := h.tenantClient("legacy", "pro", nil)
	done := `{"done":true,"output":{},"usage":{"tokens":1,"cost_usd":0}}`
	if task := run(t, c, client.SubmitTaskRequest{Agent: "old", Input: map[string]any{"reply": done}}); task.State != "completed" {
		t.Fatalf("legacy agent: %s %q", task.State, deref(task.Error))
	}
	if !checkSignature("legacy-shared-secret", a.last()) {
		t.Fatal("a legacy agent's step is not signed with AGENTQ_AGENT_SECRET")
	}
	var rot registered
	if st, _ := h.do("POST", "/v1/admin/agents/old/rotate-secret", h.admin, nil, &rot); st != 200 || rot.SigningSecret == "" {
		t.Fatalf("rotate: %d", st)
	}
	time.Sleep(1100 * time.Millisecond)
	run(t, c, client.SubmitTaskRequest{Agent: "old", Input: map[string]any{"reply": done}})
	if call := a.last(); !checkSignature(rot.SigningSecret, call) || checkSignature("legacy-shared-secret", call) {
		t.Fatal("after rotation the legacy agent is still signed with the shared secret")
	}

	// A deployment without the shared secret: the legacy agent's steps fail.
	h2 := start(t)
	b := newRawAgent(t)
	h2.putAgent("old", map[string]any{"url": b.srv.URL + "/step"}, 201)
	if _, err := h2.app.Store().Pool().Exec(ctx, `UPDATE agents SET signing_secret = NULL, signing_secret_created_at = NULL WHERE name = 'old'`); err != nil {
		t.Fatal(err)
	}
	c2, _ := h2.tenantClient("legacy2", "pro", nil)
	task := run(t, c2, client.SubmitTaskRequest{Agent: "old", Input: map[string]any{"reply": done}})
	if task.State != "failed" || !strings.Contains(deref(task.Error), "signing secret") || b.count() != 0 {
		t.Fatalf("legacy agent without a shared secret: %s %q, %d calls", task.State, deref(task.Error), b.count())
	}
}
