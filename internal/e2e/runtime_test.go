package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/runtime"
)

// echoAgent is a real HTTP agent: it counts steps in its state, reports usage and is
// done after "steps" steps (or never with "forever"); "fail" answers that status,
// "sleep_ms" sleeps before answering, "garbage" answers malformed JSON.
type echoAgent struct {
	srv      *httptest.Server
	calls    atomic.Int64
	badSig   atomic.Int64
	inflight atomic.Int64
	aborted  atomic.Int64
	mu       sync.Mutex
	headers  []http.Header
	secret   atomic.Value // the signing secret the registration showed
}

func newEchoAgent(t *testing.T) *echoAgent {
	a := &echoAgent{}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		secret, _ := a.secret.Load().(string)
		if runtime.Verify([]byte(secret), r.Method, r.RequestURI, r.Header.Get(runtime.TimestampHeader),
			r.Header.Get(runtime.SignatureHeader), body, time.Now()) != nil {
			a.badSig.Add(1)
		}
		a.mu.Lock()
		a.headers = append(a.headers, r.Header.Clone())
		a.mu.Unlock()
		var req runtime.StepRequest
		_ = json.Unmarshal(body, &req)
		var in struct {
			Steps   int  `json:"steps"`
			Forever bool `json:"forever"`
			Fail    int  `json:"fail"`
			SleepMs int  `json:"sleep_ms"`
			Garbage bool `json:"garbage"`
			Tokens  int  `json:"tokens"`
		}
		_ = json.Unmarshal(req.Input, &in)
		if in.SleepMs > 0 {
			a.inflight.Add(1)
			select {
			case <-time.After(time.Duration(in.SleepMs) * time.Millisecond):
			case <-r.Context().Done():
				a.aborted.Add(1)
			}
			a.inflight.Add(-1)
		}
		if in.Fail != 0 {
			w.WriteHeader(in.Fail)
			_, _ = w.Write([]byte(`{"error":"nope"}`))
			return
		}
		if in.Garbage {
			_, _ = w.Write([]byte(`{"output":`))
			return
		}
		var st struct{ N int }
		_ = json.Unmarshal(req.State, &st)
		st.N++
		tokens := in.Tokens
		if tokens == 0 {
			tokens = 7
		}
		done := !in.Forever && st.N >= max(in.Steps, 1)
		res := map[string]any{"state": st, "done": done, "usage": map[string]any{"tokens": tokens, "cost_usd": 0.001}}
		if done {
			res["output"] = map[string]any{"n": st.N}
		}
		_ = json.NewEncoder(w).Encode(res)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func startWithAgents(t *testing.T) (*harness, *echoAgent) {
	agents := runtime.NewRegistry()
	agents.Register("panicky", panicky{})
	h := start(t, func(o *agentq.Options) {
		o.Agents = agents
	})
	a := newEchoAgent(t)
	var out struct {
		SigningSecret string `json:"signing_secret"`
	}
	if st, _ := h.do("PUT", "/v1/admin/agents/echo", h.admin, map[string]any{"url": a.srv.URL + "/step", "step_timeout_s": 0.5,
		"headers": map[string]string{"Authorization": "Bearer agent-token"}}, &out); st != 201 || out.SigningSecret == "" {
		t.Fatalf("PUT agent: %d %v", st, out)
	}
	a.secret.Store(out.SigningSecret)
	return h, a
}

type panicky struct{}

func (panicky) Step(context.Context, runtime.StepRequest) (runtime.StepResult, error) {
	panic("boom")
}

func run(t *testing.T, c *client.Client, req client.SubmitTaskRequest) *client.Task {
	t.Helper()
	task, err := c.SubmitTask(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done, err := c.WaitTask(ctx, task.ID, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	return done
}

// traceparentRE is a W3C traceparent: the step span's, in the submission's trace.
var traceparentRE = regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]$`)

func TestHTTPAgentRunsStepsWithUsageAndLedger(t *testing.T) {
	t.Parallel()
	h, a := startWithAgents(t)
	c, _ := h.tenantClient("ag", "pro", nil)
	task := run(t, c, client.SubmitTaskRequest{Agent: "echo", Input: map[string]any{"steps": 3}})
	if task.State != "completed" || task.Usage.Steps != 3 || task.Usage.Tokens != 21 || task.Usage.CostUSD != 0.003 {
		t.Fatalf("task: %s, usage %+v, error %v", task.State, task.Usage, deref(task.Error))
	}
	var out struct{ N int }
	_ = json.Unmarshal(task.Output, &out)
	if out.N != 3 {
		t.Fatalf("output %s", task.Output)
	}
	if a.badSig.Load() != 0 {
		t.Fatalf("%d step requests had a bad signature", a.badSig.Load())
	}
	a.mu.Lock()
	hd := a.headers[0]
	a.mu.Unlock()
	if hd.Get("Authorization") != "Bearer agent-token" || !traceparentRE.MatchString(hd.Get("Traceparent")) {
		t.Fatalf("step request headers: %v", hd)
	}
	rows, err := h.app.Store().TaskLedger(context.Background(), store.TaskLedgerParams{TenantID: task.TenantID, TaskID: uuid.MustParse(task.ID)})
	if err != nil || len(rows) != 9 {
		t.Fatalf("ledger: %d rows (%v), want 3 steps x 3 meters", len(rows), err)
	}
	// the tenant's quota counters hold exactly what the steps reported (reserve/settle)
	u := h.usage(keyOf(t, h, "ag"))
	if u["agent_steps_daily"]["used"] != 3.0 || u["ai_tokens_monthly"]["used"] != 21.0 || u["usd_monthly"]["used"] != 0.003 {
		t.Fatalf("quota counters: steps %v tokens %v usd %v", u["agent_steps_daily"]["used"], u["ai_tokens_monthly"]["used"], u["usd_monthly"]["used"])
	}
	// the admin API never shows the agent's header values
	var ag map[string]any
	h.do("GET", "/v1/admin/agents/echo", h.admin, nil, &ag)
	if strings.Contains(toJSON(ag), "agent-token") {
		t.Fatal("GET agent shows a header value")
	}
}

func toJSON(v any) string { b, _ := json.Marshal(v); return string(b) }

func TestBudgetsAndTenantQuotasEndTasks(t *testing.T) {
	t.Parallel()
	h, _ := startWithAgents(t)
	four, cost, wall := 4, 0.0025, 1.0
	cases := []struct {
		name      string
		overrides map[string]client.Limit
		req       client.SubmitTaskRequest
		steps     int
		errSubstr string
	}{
		{"max_steps", nil, client.SubmitTaskRequest{Agent: "echo", Input: map[string]any{"forever": true}, Budget: &client.BudgetRequest{MaxSteps: &four}}, 4, "max_steps 4"},
		{"max_cost_usd", nil, client.SubmitTaskRequest{Agent: "echo", Input: map[string]any{"forever": true}, Budget: &client.BudgetRequest{MaxCostUSD: &cost}}, 2, "max_cost_usd"},
		{"max_wallclock_s", nil, client.SubmitTaskRequest{Agent: "sim", Input: map[string]any{"steps": 100, "step_ms": 300}, Budget: &client.BudgetRequest{MaxWallclockS: &wall}}, -1, "max_wallclock_s"},
		{"agent_steps_daily", map[string]client.Limit{"agent_steps_daily": 2}, client.SubmitTaskRequest{Agent: "echo", Input: map[string]any{"forever": true}}, 2, "agent_steps_daily limit of 2"},
		{"ai_tokens_monthly", map[string]client.Limit{"ai_tokens_monthly": 20}, client.SubmitTaskRequest{Agent: "echo", Input: map[string]any{"forever": true}}, 2, "ai_tokens_monthly limit of 20"},
		{"usd_monthly", map[string]client.Limit{"usd_monthly": 0.0025}, client.SubmitTaskRequest{Agent: "echo", Input: map[string]any{"forever": true}}, 2, "usd_monthly"},
	}
	for i, tc := range cases {
		c, _ := h.tenantClient("b"+strings.Repeat("x", i), "pro_stop", tc.overrides)
		task := run(t, c, tc.req)
		stepsOK := task.Usage.Steps == tc.steps || (tc.steps < 0 && task.Usage.Steps >= 1 && task.Usage.Steps <= 3) // 1 s of 300 ms steps, however slow the machine
		if task.State != "budget_exceeded" || !stepsOK || !strings.Contains(deref(task.Error), tc.errSubstr) {
			t.Errorf("%s: %s after %d steps (%s); want budget_exceeded after %d naming %q", tc.name, task.State, task.Usage.Steps, deref(task.Error), tc.steps, tc.errSubstr)
		}
	}
}

func TestAgentErrorsAndTimeouts(t *testing.T) {
	t.Parallel()
	h, a := startWithAgents(t)
	c, _ := h.tenantClient("er", "pro", nil)
	cases := []struct {
		name      string
		input     map[string]any
		calls     int64
		errSubstr string
	}{
		{"5xx is retried, then fails", map[string]any{"fail": 503}, 3, "HTTP 503"},
		{"4xx fails at once", map[string]any{"fail": 400}, 1, "HTTP 400"},
		{"timeout is retried, then fails", map[string]any{"sleep_ms": 2000}, 3, "no answer within 500ms"},
		{"malformed answer is retried, then fails", map[string]any{"garbage": true}, 3, "malformed answer"},
	}
	for _, tc := range cases {
		before := a.calls.Load()
		task := run(t, c, client.SubmitTaskRequest{Agent: "echo", Input: tc.input})
		if task.State != "failed" || !strings.Contains(deref(task.Error), tc.errSubstr) || !strings.Contains(deref(task.Error), `agent "echo"`) {
			t.Errorf("%s: %s, error %q", tc.name, task.State, deref(task.Error))
		}
		if n := a.calls.Load() - before; n != tc.calls {
			t.Errorf("%s: %d calls to the agent, want %d", tc.name, n, tc.calls)
		}
	}
}

func TestCancelInterruptsAnHTTPStep(t *testing.T) {
	t.Parallel()
	h, a := startWithAgents(t)
	if st, _ := h.do("PUT", "/v1/admin/agents/slow", h.admin, map[string]any{"url": a.srv.URL, "step_timeout_s": 30}, nil); st != 201 {
		t.Fatalf("PUT slow: %d", st)
	}
	c, _ := h.tenantClient("cx", "pro", nil)
	ctx := context.Background()
	task, err := c.SubmitTask(ctx, client.SubmitTaskRequest{Agent: "slow", Input: map[string]any{"sleep_ms": 20000}})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.inflight.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the agent never got the step")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := c.CancelTask(ctx, task.ID); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(time.Second)
	for a.aborted.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the agent's request was not interrupted within a second of the cancel")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got, _ := c.GetTask(ctx, task.ID); got.State != "killed" {
		t.Fatalf("state %s", got.State)
	}
}

func TestPanickingHandlerFailsTheTaskAndReleasesItsLease(t *testing.T) {
	t.Parallel()
	h, _ := startWithAgents(t)
	c, key := h.tenantClient("pn", "pro", map[string]client.Limit{"concurrent_sessions": 1})
	task := run(t, c, client.SubmitTaskRequest{Agent: "panicky"})
	if task.State != "failed" || !strings.Contains(deref(task.Error), "panicked") {
		t.Fatalf("%s %q", task.State, deref(task.Error))
	}
	deadline := time.Now().Add(2 * time.Second)
	for h.usage(key.Key)["concurrent_sessions"]["used"] != 0.0 {
		if time.Now().After(deadline) {
			t.Fatal("the panicked task's lease is still held")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// the worker survived the panic
	if got := run(t, c, client.SubmitTaskRequest{Agent: "sim"}); got.State != "completed" {
		t.Fatalf("after a panic: %s", got.State)
	}
}

func TestEventStream(t *testing.T) {
	t.Parallel()
	h, _ := startWithAgents(t)
	_, key := h.tenantClient("ev", "pro", map[string]client.Limit{"concurrent_sessions": 2})
	var task struct{ ID string }
	h.do("POST", "/v1/tasks", key.Key, `{"agent":"sim","input":{"steps":3,"step_ms":400,"tokens_per_step":5}}`, &task)
	req, _ := http.NewRequest("GET", h.base+"/v1/tasks/"+task.ID+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+key.Key)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("%d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	// the open stream holds a request slot, not a session: only the task's is taken
	if u := h.usage(key.Key); u["concurrent_sessions"]["used"] != 1.0 || u["inflight_requests"]["used"] != 2.0 {
		t.Fatalf("with a task running and a stream open: sessions %v, inflight requests %v; want 1 and 2 (the stream, this read)",
			u["concurrent_sessions"]["used"], u["inflight_requests"]["used"])
	}
	var events []map[string]any
	var names []string
	sc := bufio.NewScanner(resp.Body)
	name := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var ev map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev); err != nil {
				t.Fatalf("data line is not JSON: %s", line)
			}
			events = append(events, ev)
			names = append(names, name)
		}
	}
	if len(events) < 2 {
		t.Fatalf("events: %v", events)
	}
	last := events[len(events)-1]
	if names[len(names)-1] != "state" || last["state"] != "completed" {
		t.Fatalf("the stream did not end with the completed state: %v", last)
	}
	steps := 0
	for i, ev := range events {
		if names[i] == "step" {
			steps++
			if ev["step"] != float64(steps) || ev["usage"].(map[string]any)["tokens"] != 5.0 {
				t.Fatalf("step event %d: %v", steps, ev)
			}
		}
	}
	if steps != 3 {
		t.Fatalf("%d step events, want 3 (%v)", steps, names)
	}
	final := last["task"].(map[string]any)
	if final["usage"].(map[string]any)["steps"] != 3.0 {
		t.Fatalf("final task: %v", final)
	}
	// closing the stream gives the slot back
	h.waitInflight("ev", 0, "after the stream ended")
}

// Shutting down ends open event streams at once (the client reconnects elsewhere),
// so shutdown does not wait on them, and their request slots are given back.
func TestShutdownEndsOpenStreams(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.start(t)
	_, key := h.tenantClient("sd", "pro", nil)
	var task struct{ ID string }
	h.do("POST", "/v1/tasks", key.Key, `{"agent":"sim","input":{"steps":100,"step_ms":100}}`, &task)
	req, _ := http.NewRequest("GET", h.base+"/v1/tasks/"+task.ID+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+key.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got := make(chan string, 1)
	go func() { b, _ := io.ReadAll(resp.Body); got <- string(b) }()
	t0 := time.Now()
	h.stop()
	if d := time.Since(t0); d > 9*time.Second {
		t.Fatalf("shutdown took %v with a stream open", d)
	}
	select {
	case body := <-got:
		if !strings.Contains(body, "event: shutdown") {
			t.Fatalf("the stream ended without a shutdown event: %q", body[max(0, len(body)-200):])
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stream is still open after shutdown")
	}
	if n := h.inflightHeld("sd"); n != 0 {
		t.Fatalf("%d inflight_requests leases survived shutdown", n)
	}
}
