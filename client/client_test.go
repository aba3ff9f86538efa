package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const (
	testKey   = "aq_acme-1a2b3c4d_00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	testAdmin = "admin-token-s3cret"
)

// recorded is one request as the fake server saw it.
type recorded struct {
	Method, Path, RawQuery string
	Header                 http.Header
	Body                   []byte
}

// fake is an httptest server that records requests and answers from a script.
type fake struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []recorded
}

func newFake(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, n int)) *fake {
	t.Helper()
	f := &fake{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.reqs = append(f.reqs, recorded{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Clone(), b})
		n := len(f.reqs)
		f.mu.Unlock()
		answer(w, r, n)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fake) requests() []recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]recorded(nil), f.reqs...)
}

func (f *fake) last(t *testing.T) recorded {
	t.Helper()
	rs := f.requests()
	if len(rs) == 0 {
		t.Fatal("the server saw no request")
	}
	return rs[len(rs)-1]
}

func reply(status int, body string, headers ...string) func(http.ResponseWriter, *http.Request, int) {
	return func(w http.ResponseWriter, _ *http.Request, _ int) {
		for i := 0; i+1 < len(headers); i += 2 {
			w.Header().Set(headers[i], headers[i+1])
		}
		if body != "" {
			w.Header().Set("Content-Type", "application/json")
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

// taskBody is a task exactly as the server renders it (api.TaskJSON of web/api).
func taskBody(state string) string {
	finished := `null`
	if IsTerminal(state) {
		finished = `"2025-01-02T03:04:09.5Z"`
	}
	return `{"id":"0190d7f2-4c1e-7b3a-9d2e-5f6a7b8c9d0e","tenant_id":"acme","agent":"sim","user":"u1",` +
		`"state":"` + state + `","priority":7,"input":{"steps":3},"output":null,"error":null,` +
		`"budget":{"max_steps":2,"max_wallclock_s":60,"max_cost_usd":0.1},` +
		`"usage":{"steps":1,"tokens":100,"cost_usd":0.001},"wait_reason":null,"attempt":1,` +
		`"created_at":"2025-01-02T03:04:05Z","started_at":"2025-01-02T03:04:06Z","finished_at":` + finished + `}`
}

func jsonEqual(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("request body %q is not JSON: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	if !bytes.Equal(gb, wb) {
		t.Errorf("request body = %s, want %s", gb, wb)
	}
}

func checkAuth(t *testing.T, r recorded, token string) {
	t.Helper()
	if got := r.Header.Get("Authorization"); got != "Bearer "+token {
		t.Errorf("Authorization = %q, want Bearer <token>", got)
	}
	if got := r.Header.Get("Accept"); got != "application/json" {
		t.Errorf("Accept = %q", got)
	}
	if !strings.HasPrefix(r.Header.Get("User-Agent"), "agentq-go-client/") {
		t.Errorf("User-Agent = %q", r.Header.Get("User-Agent"))
	}
}

func TestSubmitTaskRequestAndDecoding(t *testing.T) {
	f := newFake(t, reply(http.StatusAccepted, taskBody(StateQueued), "Location", "/v1/tasks/0190d7f2-4c1e-7b3a-9d2e-5f6a7b8c9d0e"))
	c := New(f.URL+"/", testKey) // a trailing slash is tolerated
	steps, prio := 2, 7
	task, err := c.SubmitTask(context.Background(), SubmitTaskRequest{
		Agent:          "sim",
		Input:          map[string]any{"steps": 3},
		User:           "u1",
		Budget:         &BudgetRequest{MaxSteps: &steps},
		Priority:       &prio,
		IdempotencyKey: "order-1234",
	})
	if err != nil {
		t.Fatal(err)
	}
	r := f.last(t)
	if r.Method != http.MethodPost || r.Path != "/v1/tasks" || r.RawQuery != "" {
		t.Errorf("request = %s %s?%s, want POST /v1/tasks", r.Method, r.Path, r.RawQuery)
	}
	checkAuth(t, r, testKey)
	if got := r.Header.Get("Idempotency-Key"); got != "order-1234" {
		t.Errorf("Idempotency-Key = %q", got)
	}
	if got := r.Header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type = %q", got)
	}
	// The key goes in the header only, and unset optional fields are not sent.
	jsonEqual(t, r.Body, `{"agent":"sim","input":{"steps":3},"user":"u1","budget":{"max_steps":2},"priority":7}`)

	want := Task{
		ID: "0190d7f2-4c1e-7b3a-9d2e-5f6a7b8c9d0e", TenantID: "acme", Agent: "sim", User: ptr("u1"),
		State: StateQueued, Priority: 7, Input: json.RawMessage(`{"steps":3}`), Output: json.RawMessage(`null`),
		Budget: &Budget{MaxSteps: 2, MaxWallclockS: 60, MaxCostUSD: 0.1},
		Usage:  Usage{Steps: 1, Tokens: 100, CostUSD: 0.001}, Attempt: 1,
		CreatedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
		StartedAt: ptr(time.Date(2025, 1, 2, 3, 4, 6, 0, time.UTC)),
	}
	if got, wantS := fmt.Sprintf("%+v", deref(task)), fmt.Sprintf("%+v", deref(&want)); got != wantS {
		t.Errorf("task =\n %s\nwant\n %s", got, wantS)
	}
	if task.Error != nil || task.WaitReason != nil || task.FinishedAt != nil || task.Terminal() {
		t.Errorf("null fields decoded wrong: %+v", task)
	}
}

// deref renders pointers and raw JSON by value so tasks compare as text.
func deref(t *Task) string {
	s := func(p *string) string {
		if p == nil {
			return "<nil>"
		}
		return *p
	}
	tm := func(p *time.Time) string {
		if p == nil {
			return "<nil>"
		}
		return p.UTC().Format(time.RFC3339Nano)
	}
	wait := func(w *WaitReason) string {
		if w == nil {
			return "<nil>"
		}
		return fmt.Sprintf("%s@%d:%s:%s", w.Reason, w.Position, tm(w.ExpectedStart), tm(w.Until))
	}
	return fmt.Sprintf("id=%s tenant=%s agent=%s user=%s state=%s prio=%d in=%s out=%s err=%s budget=%+v usage=%+v wait=%s attempt=%d created=%s started=%s finished=%s",
		t.ID, t.TenantID, t.Agent, s(t.User), t.State, t.Priority, t.Input, t.Output, s(t.Error), *t.Budget, t.Usage,
		wait(t.WaitReason), t.Attempt, t.CreatedAt.UTC().Format(time.RFC3339Nano), tm(t.StartedAt), tm(t.FinishedAt))
}

func ptr[T any](v T) *T { return &v }

func TestSubmitTaskMinimal(t *testing.T) {
	f := newFake(t, reply(http.StatusAccepted, taskBody(StateQueued)))
	c := New(f.URL, testKey)
	if _, err := c.SubmitTask(context.Background(), SubmitTaskRequest{Agent: "sim", Input: json.RawMessage(nil)}); err != nil {
		t.Fatal(err)
	}
	r := f.last(t)
	if _, ok := r.Header["Idempotency-Key"]; ok {
		t.Error("Idempotency-Key sent without a key")
	}
	jsonEqual(t, r.Body, `{"agent":"sim"}`)

	raw := json.RawMessage(`{"steps":1,"step_ms":5}`)
	if _, err := c.SubmitTask(context.Background(), SubmitTaskRequest{Agent: "sim", Input: raw}); err != nil {
		t.Fatal(err)
	}
	jsonEqual(t, f.last(t).Body, `{"agent":"sim","input":{"steps":1,"step_ms":5}}`)
}

func TestGetListCancel(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/v1/tasks":
			reply(http.StatusOK, `{"tasks":[`+taskBody(StateRunning)+`,`+taskBody(StateCompleted)+`],"next_cursor":"0190d7f2-0000-7000-8000-000000000000"}`)(w, r, 0)
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/cancel"):
			reply(http.StatusOK, taskBody(StateKilled))(w, r, 0)
		default:
			reply(http.StatusOK, taskBody(StateRunning))(w, r, 0)
		}
	})
	c := New(f.URL, testKey)
	ctx := context.Background()

	task, err := c.GetTask(ctx, "0190d7f2-4c1e-7b3a-9d2e-5f6a7b8c9d0e")
	if err != nil {
		t.Fatal(err)
	}
	if r := f.last(t); r.Method != http.MethodGet || r.Path != "/v1/tasks/0190d7f2-4c1e-7b3a-9d2e-5f6a7b8c9d0e" || len(r.Body) != 0 {
		t.Errorf("GetTask sent %s %s body %q", r.Method, r.Path, r.Body)
	}
	checkAuth(t, f.last(t), testKey)
	if task.State != StateRunning {
		t.Errorf("state = %q", task.State)
	}

	// Ids are path-escaped: they cannot change the route.
	if _, err := c.GetTask(ctx, "../admin/plans"); err != nil {
		t.Fatal(err)
	}
	if p := f.last(t).Path; p != "/v1/tasks/..%2Fadmin%2Fplans" {
		t.Errorf("escaped path = %q", p)
	}

	list, err := c.ListTasks(ctx, ListTasksParams{State: StateRunning, Limit: 2, Cursor: "0190d7f2-4c1e-7b3a-9d2e-5f6a7b8c9d0e"})
	if err != nil {
		t.Fatal(err)
	}
	r := f.last(t)
	if r.Method != http.MethodGet || r.Path != "/v1/tasks" || r.RawQuery != "cursor=0190d7f2-4c1e-7b3a-9d2e-5f6a7b8c9d0e&limit=2&state=running" {
		t.Errorf("ListTasks sent %s %s?%s", r.Method, r.Path, r.RawQuery)
	}
	if len(list.Tasks) != 2 || list.Tasks[1].State != StateCompleted || !list.Tasks[1].Terminal() || list.Tasks[1].FinishedAt == nil {
		t.Errorf("list = %+v", list)
	}
	if list.NextCursor == nil || *list.NextCursor != "0190d7f2-0000-7000-8000-000000000000" {
		t.Errorf("next_cursor = %v", list.NextCursor)
	}
	if _, err := c.ListTasks(ctx, ListTasksParams{}); err != nil {
		t.Fatal(err)
	}
	if q := f.last(t).RawQuery; q != "" {
		t.Errorf("zero params sent query %q", q)
	}

	killed, err := c.CancelTask(ctx, "0190d7f2-4c1e-7b3a-9d2e-5f6a7b8c9d0e")
	if err != nil {
		t.Fatal(err)
	}
	r = f.last(t)
	if r.Method != http.MethodPost || r.Path != "/v1/tasks/0190d7f2-4c1e-7b3a-9d2e-5f6a7b8c9d0e/cancel" || len(r.Body) != 0 {
		t.Errorf("CancelTask sent %s %s body %q", r.Method, r.Path, r.Body)
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		t.Errorf("CancelTask sent Content-Type %q without a body", ct)
	}
	if killed.State != StateKilled {
		t.Errorf("state = %q", killed.State)
	}
}

func TestNullNextCursor(t *testing.T) {
	f := newFake(t, reply(http.StatusOK, `{"tasks":[],"next_cursor":null}`))
	list, err := New(f.URL, testKey).ListTasks(context.Background(), ListTasksParams{})
	if err != nil {
		t.Fatal(err)
	}
	if list.NextCursor != nil || list.Tasks == nil || len(list.Tasks) != 0 {
		t.Errorf("list = %+v", list)
	}
}

func TestRateLimitError(t *testing.T) {
	body := `{"error":{"code":"RATE_LIMIT_EXCEEDED","message":"Tenant rate limit of 100 requests/second exceeded. Retry in 3 seconds.",` +
		`"limit_type":"tenant_rate","retry_after_seconds":3,"tenant_id":"acme","violated":["tenant_rate","user_tasks_hourly"]}}`
	f := newFake(t, reply(http.StatusTooManyRequests, body,
		"Retry-After", "3", "X-RateLimit-Limit", "100", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1735787046",
		"RateLimit-Policy", `"tenant";q=100;w=1, "key";q=20;w=1`, "RateLimit", `"tenant";r=0;t=3`))
	_, err := New(f.URL, testKey).SubmitTask(context.Background(), SubmitTaskRequest{Agent: "sim"})
	var ae *Error
	if !errors.As(err, &ae) {
		t.Fatalf("err = %T %v, want *Error", err, err)
	}
	if ae.StatusCode != 429 || ae.Code != "RATE_LIMIT_EXCEEDED" || ae.LimitType != "tenant_rate" || ae.RetryAfter != 3*time.Second {
		t.Errorf("error = %+v", ae)
	}
	if !strings.HasPrefix(ae.Message, "Tenant rate limit of 100") {
		t.Errorf("message = %q", ae.Message)
	}
	if ae.Header.Get("X-RateLimit-Remaining") != "0" || ae.Header.Get("X-RateLimit-Limit") != "100" ||
		ae.Header.Get("X-RateLimit-Reset") != "1735787046" || ae.Header.Get("RateLimit") == "" || ae.Header.Get("RateLimit-Policy") == "" {
		t.Errorf("rate-limit headers = %v", ae.Header)
	}
	// Body is the error object, so callers can read the fields a code adds.
	var extra struct {
		Code     string   `json:"code"`
		TenantID string   `json:"tenant_id"`
		Violated []string `json:"violated"`
	}
	if err := json.Unmarshal(ae.Body, &extra); err != nil {
		t.Fatalf("Body %q: %v", ae.Body, err)
	}
	if extra.Code != "RATE_LIMIT_EXCEEDED" || extra.TenantID != "acme" || len(extra.Violated) != 2 {
		t.Errorf("body fields = %+v", extra)
	}
	if ae.Method != http.MethodPost || ae.Path != "/v1/tasks" {
		t.Errorf("request = %s %s", ae.Method, ae.Path)
	}
	msg := err.Error()
	if !strings.Contains(msg, "429") || !strings.Contains(msg, "RATE_LIMIT_EXCEEDED") || strings.Contains(msg, testKey) {
		t.Errorf("Error() = %q", msg)
	}
}

func TestErrorShapes(t *testing.T) {
	future := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	cases := []struct {
		name       string
		status     int
		body       string
		headers    []string
		code       string
		retryAfter time.Duration // exact, or a lower bound when approx
		approx     bool
		rawBody    string
	}{
		{name: "not found", status: 404, body: `{"error":{"code":"NOT_FOUND","message":"No task x."}}`, code: "NOT_FOUND",
			rawBody: `{"code":"NOT_FOUND","message":"No task x."}`},
		{name: "unavailable, body only", status: 503,
			body: `{"error":{"code":"SERVICE_UNAVAILABLE","message":"Retry in 1 second.","retry_after_seconds":1}}`,
			code: "SERVICE_UNAVAILABLE", retryAfter: time.Second},
		{name: "header wins over body", status: 503, headers: []string{"Retry-After", "7"},
			body: `{"error":{"code":"SERVICE_UNAVAILABLE","message":"m","retry_after_seconds":1}}`,
			code: "SERVICE_UNAVAILABLE", retryAfter: 7 * time.Second},
		{name: "http date", status: 429, headers: []string{"Retry-After", future},
			body: `{"error":{"code":"CONCURRENCY_LIMIT_EXCEEDED","message":"m","limit_type":"concurrent_sessions"}}`,
			code: "CONCURRENCY_LIMIT_EXCEEDED", retryAfter: 80 * time.Second, approx: true},
		{name: "garbage retry-after", status: 429, headers: []string{"Retry-After", "soon"},
			body: `{"error":{"code":"RATE_LIMIT_EXCEEDED","message":"m"}}`, code: "RATE_LIMIT_EXCEEDED"},
		{name: "quota", status: 402,
			body: `{"error":{"code":"QUOTA_EXCEEDED","message":"Daily agent step limit of 500 reached.","limit_type":"agent_steps_daily","current_usage":500,"limit_value":500,"upgrade_url":"https://x"}}`,
			code: "QUOTA_EXCEEDED"},
		{name: "proxy page", status: 502, body: `<html>bad gateway</html>`, rawBody: `<html>bad gateway</html>`},
		{name: "empty", status: 500, rawBody: ``},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, reply(tc.status, tc.body, tc.headers...))
			_, err := New(f.URL, testKey).GetTask(context.Background(), "x")
			var ae *Error
			if !errors.As(err, &ae) {
				t.Fatalf("err = %v, want *Error", err)
			}
			if ae.StatusCode != tc.status || ae.Code != tc.code {
				t.Errorf("status, code = %d %q, want %d %q", ae.StatusCode, ae.Code, tc.status, tc.code)
			}
			if tc.approx {
				if ae.RetryAfter < tc.retryAfter || ae.RetryAfter > 91*time.Second {
					t.Errorf("RetryAfter = %v, want about 90s", ae.RetryAfter)
				}
			} else if ae.RetryAfter != tc.retryAfter {
				t.Errorf("RetryAfter = %v, want %v", ae.RetryAfter, tc.retryAfter)
			}
			if tc.rawBody != "" || tc.body == "" {
				if string(ae.Body) != tc.rawBody {
					t.Errorf("Body = %q, want %q", ae.Body, tc.rawBody)
				}
			}
			if tc.code == "QUOTA_EXCEEDED" && ae.LimitType != "agent_steps_daily" {
				t.Errorf("LimitType = %q", ae.LimitType)
			}
			if s := ae.Error(); !strings.Contains(s, fmt.Sprint(tc.status)) || strings.Contains(s, testKey) {
				t.Errorf("Error() = %q", s)
			}
		})
	}
}

// TestCredentialNeverInErrors covers a server (or proxy) that echoes the credential
// and a transport whose error text includes it.
func TestCredentialNeverInErrors(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		msg := "bad key " + strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		b, _ := json.Marshal(map[string]any{"error": map[string]any{"code": "UNAUTHORIZED", "message": msg}})
		reply(http.StatusUnauthorized, string(b))(w, r, 0)
	})
	_, err := New(f.URL, testKey).GetTask(context.Background(), "x")
	var ae *Error
	if !errors.As(err, &ae) || ae.StatusCode != 401 {
		t.Fatalf("err = %v", err)
	}
	if strings.Contains(err.Error(), testKey) || strings.Contains(ae.Message, testKey) || bytes.Contains(ae.Body, []byte(testKey)) {
		t.Errorf("the key leaked: %q / %q", err.Error(), ae.Body)
	}
	if !strings.Contains(ae.Message, "[REDACTED]") {
		t.Errorf("message = %q", ae.Message)
	}

	leaky := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return nil, fmt.Errorf("dial failed for %s: %w", r.Header.Get("Authorization"), context.DeadlineExceeded)
	})}
	a := NewAdmin("http://agentq.invalid", testAdmin, WithHTTPClient(leaky))
	_, err = a.GetTenant(context.Background(), "acme")
	if err == nil || strings.Contains(err.Error(), testAdmin) {
		t.Fatalf("err = %v", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("redaction broke errors.Is: %v", err)
	}
	var ae2 *Error
	if errors.As(err, &ae2) {
		t.Error("a transport failure is not an *Error")
	}

	c := New("http://agentq.invalid", testKey)
	for _, s := range []string{fmt.Sprint(c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), fmt.Sprint(a), fmt.Sprintf("%#v", a)} {
		if strings.Contains(s, testKey) || strings.Contains(s, testAdmin) {
			t.Errorf("formatting a client shows its credential: %s", s)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestWithHTTPClient(t *testing.T) {
	f := newFake(t, reply(http.StatusOK, taskBody(StateRunning)))
	var calls atomic.Int32
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		calls.Add(1)
		return http.DefaultTransport.RoundTrip(r)
	})}
	if _, err := New(f.URL, testKey, WithHTTPClient(hc), WithUserAgent("my-app/1")).GetTask(context.Background(), "x"); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 1 {
		t.Errorf("custom client used %d times, want 1", calls.Load())
	}
	if ua := f.last(t).Header.Get("User-Agent"); ua != "my-app/1" {
		t.Errorf("User-Agent = %q", ua)
	}
}

func TestWaitTask(t *testing.T) {
	states := []string{StateQueued, StateRunning, "503", StateRunning, StateCompleted}
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n > len(states) {
			t.Errorf("polled after the task ended (request %d)", n)
			n = len(states)
		}
		if st := states[n-1]; st == "503" {
			reply(http.StatusServiceUnavailable, `{"error":{"code":"SERVICE_UNAVAILABLE","message":"m","retry_after_seconds":1}}`, "Retry-After", "0")(w, r, n)
		} else {
			reply(http.StatusOK, taskBody(st))(w, r, n)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	task, err := New(f.URL, testKey).WaitTask(ctx, "0190d7f2-4c1e-7b3a-9d2e-5f6a7b8c9d0e", time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if task.State != StateCompleted || task.FinishedAt == nil {
		t.Errorf("task = %+v", task)
	}
	reqs := f.requests()
	if len(reqs) != len(states) {
		t.Errorf("polled %d times, want %d", len(reqs), len(states))
	}
	for _, r := range reqs {
		if r.Method != http.MethodGet || r.Path != "/v1/tasks/0190d7f2-4c1e-7b3a-9d2e-5f6a7b8c9d0e" {
			t.Errorf("poll = %s %s", r.Method, r.Path)
		}
	}
}

func TestWaitTaskEveryTerminalState(t *testing.T) {
	for _, st := range []string{StateCompleted, StateFailed, StateKilled, StateBudgetExceeded, StateAbandoned} {
		f := newFake(t, reply(http.StatusOK, taskBody(st)))
		task, err := New(f.URL, testKey).WaitTask(context.Background(), "x", time.Hour)
		if err != nil || task.State != st {
			t.Errorf("%s: task %v, err %v", st, task, err)
		}
	}
	for _, st := range []string{StateQueued, StateRunning, "unknown"} {
		if IsTerminal(st) {
			t.Errorf("IsTerminal(%q) = true", st)
		}
	}
}

func TestWaitTaskContextEnds(t *testing.T) {
	f := newFake(t, reply(http.StatusOK, taskBody(StateRunning)))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	task, err := New(f.URL, testKey).WaitTask(ctx, "x", 5*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	if task == nil || task.State != StateRunning {
		t.Errorf("last task = %+v, want the running task", task)
	}
	if n := len(f.requests()); n < 2 {
		t.Errorf("polled %d times in 200ms at 5ms", n)
	}
}

func TestWaitTaskStopsOnHardError(t *testing.T) {
	f := newFake(t, reply(http.StatusNotFound, `{"error":{"code":"NOT_FOUND","message":"No task x."}}`))
	_, err := New(f.URL, testKey).WaitTask(context.Background(), "x", time.Millisecond)
	var ae *Error
	if !errors.As(err, &ae) || ae.Code != "NOT_FOUND" {
		t.Fatalf("err = %v", err)
	}
	if n := len(f.requests()); n != 1 {
		t.Errorf("polled %d times after a 404, want 1", n)
	}
}

func TestAdmin(t *testing.T) {
	tenant := `{"id":"acme","name":"Acme","plan":"pro","weight":2,"overrides":{"tenant_rate":5},"status":"active",` +
		`"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z","effective_weight":2}`
	key := `{"kid":"acme-1a2b3c4d","key":"` + testKey + `","tenant_id":"acme","scopes":{"agents":["sim"]},"created_at":"2025-01-02T03:04:05Z"}`
	rotated := `{"kid":"acme-1a2b3c4d","key":"` + testKey + `","tenant_id":"acme","scopes":{},"created_at":"2025-01-02T03:04:05Z","rotated_at":"2025-01-03T00:00:00Z"}`
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/v1/admin/tenants":
			reply(http.StatusCreated, tenant)(w, r, 0)
		case r.URL.Path == "/v1/admin/tenants":
			reply(http.StatusOK, `{"tenants":[`+tenant+`]}`)(w, r, 0)
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/keys"):
			reply(http.StatusCreated, key)(w, r, 0)
		case strings.HasSuffix(r.URL.Path, "/keys"):
			reply(http.StatusOK, `{"keys":[{"kid":"acme-1a2b3c4d","tenant_id":"acme","scopes":{},"created_at":"2025-01-02T03:04:05Z","rotated_at":null,"revoked_at":"2025-01-04T00:00:00Z"}]}`)(w, r, 0)
		case strings.HasSuffix(r.URL.Path, "/rotate"):
			reply(http.StatusOK, rotated)(w, r, 0)
		case r.Method == http.MethodDelete && r.URL.Path == "/v1/admin/keys/gone-00000000":
			reply(http.StatusNotFound, `{"error":{"code":"NOT_FOUND","message":"No live key \"gone-00000000\"."}}`)(w, r, 0)
		case r.Method == http.MethodDelete:
			reply(http.StatusNoContent, "")(w, r, 0)
		case r.URL.Path == "/v1/admin/plans":
			reply(http.StatusOK, `{"plans":[{"name":"free","weight":1,"limits":{"tenant_rate":5},"budget":{"default":{"max_steps":5,"max_wallclock_s":60,"max_cost_usd":0.1},"ceiling":{"max_steps":5,"max_wallclock_s":60,"max_cost_usd":0.1}}}]}`)(w, r, 0)
		default:
			reply(http.StatusOK, tenant)(w, r, 0)
		}
	})
	a := NewAdmin(f.URL, testAdmin)
	ctx := context.Background()

	weight := 2
	tn, err := a.CreateTenant(ctx, CreateTenantRequest{ID: "acme", Name: "Acme", Plan: "pro", Weight: &weight, Overrides: map[string]Limit{"tenant_rate": 5}})
	if err != nil {
		t.Fatal(err)
	}
	r := f.last(t)
	checkAuth(t, r, testAdmin)
	if r.Method != http.MethodPost || r.Path != "/v1/admin/tenants" {
		t.Errorf("CreateTenant sent %s %s", r.Method, r.Path)
	}
	jsonEqual(t, r.Body, `{"id":"acme","name":"Acme","plan":"pro","weight":2,"overrides":{"tenant_rate":5}}`)
	if tn.ID != "acme" || tn.Weight == nil || *tn.Weight != 2 || tn.Overrides["tenant_rate"] != 5 || tn.Status != "active" || tn.EffectiveWeight != 2 {
		t.Errorf("tenant = %+v", tn)
	}

	if _, err := a.CreateTenant(ctx, CreateTenantRequest{ID: "b", Plan: "free"}); err != nil {
		t.Fatal(err)
	}
	jsonEqual(t, f.last(t).Body, `{"id":"b","plan":"free"}`)

	if _, err := a.GetTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if r := f.last(t); r.Method != http.MethodGet || r.Path != "/v1/admin/tenants/acme" {
		t.Errorf("GetTenant sent %s %s", r.Method, r.Path)
	}

	ts, err := a.ListTenants(ctx)
	if err != nil || len(ts) != 1 || ts[0].ID != "acme" {
		t.Errorf("ListTenants = %v, %v", ts, err)
	}

	suspended := "suspended"
	if _, err := a.UpdateTenant(ctx, "acme", UpdateTenantRequest{Status: &suspended}); err != nil {
		t.Fatal(err)
	}
	r = f.last(t)
	if r.Method != http.MethodPatch || r.Path != "/v1/admin/tenants/acme" {
		t.Errorf("UpdateTenant sent %s %s", r.Method, r.Path)
	}
	jsonEqual(t, r.Body, `{"status":"suspended"}`)
	// An empty, non-nil Overrides clears the overrides; nil leaves them alone.
	if _, err := a.UpdateTenant(ctx, "acme", UpdateTenantRequest{Overrides: map[string]Limit{}}); err != nil {
		t.Fatal(err)
	}
	jsonEqual(t, f.last(t).Body, `{"overrides":{}}`)

	k, err := a.CreateKey(ctx, "acme", &Scopes{Agents: []string{"sim"}, Principals: []string{"u1"}})
	if err != nil {
		t.Fatal(err)
	}
	r = f.last(t)
	if r.Method != http.MethodPost || r.Path != "/v1/admin/tenants/acme/keys" {
		t.Errorf("CreateKey sent %s %s", r.Method, r.Path)
	}
	jsonEqual(t, r.Body, `{"scopes":{"agents":["sim"],"principals":["u1"]}}`)
	if k.Kid != "acme-1a2b3c4d" || k.Key != testKey || k.TenantID != "acme" || len(k.Scopes.Agents) != 1 || k.RotatedAt != nil {
		t.Errorf("key = %+v", k)
	}
	if _, err := a.CreateKey(ctx, "acme", nil); err != nil {
		t.Fatal(err)
	}
	jsonEqual(t, f.last(t).Body, `{}`)

	keys, err := a.ListKeys(ctx, "acme")
	if err != nil || len(keys) != 1 || keys[0].RevokedAt == nil || keys[0].RotatedAt != nil {
		t.Errorf("ListKeys = %+v, %v", keys, err)
	}

	rk, err := a.RotateKey(ctx, "acme-1a2b3c4d")
	if err != nil {
		t.Fatal(err)
	}
	if r := f.last(t); r.Method != http.MethodPost || r.Path != "/v1/admin/keys/acme-1a2b3c4d/rotate" {
		t.Errorf("RotateKey sent %s %s", r.Method, r.Path)
	}
	if rk.RotatedAt == nil || !rk.RotatedAt.Equal(time.Date(2025, 1, 3, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("rotated = %+v", rk)
	}

	if err := a.RevokeKey(ctx, "acme-1a2b3c4d"); err != nil {
		t.Fatal(err)
	}
	if r := f.last(t); r.Method != http.MethodDelete || r.Path != "/v1/admin/keys/acme-1a2b3c4d" {
		t.Errorf("RevokeKey sent %s %s", r.Method, r.Path)
	}
	err = a.RevokeKey(ctx, "gone-00000000")
	var ae *Error
	if !errors.As(err, &ae) || ae.StatusCode != 404 || ae.Code != "NOT_FOUND" {
		t.Errorf("RevokeKey of a gone key: %v", err)
	}

	plans, err := a.ListPlans(ctx)
	if err != nil || len(plans) != 1 || plans[0].Budget.Ceiling.MaxSteps != 5 || plans[0].Limits["tenant_rate"] != 5 {
		t.Errorf("ListPlans = %+v, %v", plans, err)
	}
}

func TestDecodeFailureIsNotAnAPIError(t *testing.T) {
	f := newFake(t, reply(http.StatusOK, `{"id":`))
	_, err := New(f.URL, testKey).GetTask(context.Background(), "x")
	var ae *Error
	if err == nil || errors.As(err, &ae) {
		t.Fatalf("err = %v", err)
	}
}

// TestStandardLibraryOnly keeps the package importable by tenant apps without the
// runtime: its non-test files import nothing but the standard library.
func TestStandardLibraryOnly(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") {
				t.Errorf("%s imports %s; package client may import only the standard library", name, path)
			}
		}
	}
}

// start_within_s goes in the body when set; a queued task's wait_reason decodes with
// its position and expected start, and a start deadline with it.
func TestStartDeadlineAndWaitReason(t *testing.T) {
	body := strings.Replace(taskBody(StateQueued), `"wait_reason":null`,
		`"wait_reason":{"reason":"behind_fair_share","position":3,"expected_start":"2025-01-02T03:05:00Z","until":null},`+
			`"wait_until":null,"waited_s":0,"start_deadline":"2025-01-02T03:06:05Z"`, 1)
	f := newFake(t, reply(http.StatusAccepted, body))
	c := New(f.URL, testKey)
	task, err := c.SubmitTask(context.Background(), SubmitTaskRequest{Agent: "sim", StartWithinS: ptr(120.0)})
	if err != nil {
		t.Fatal(err)
	}
	jsonEqual(t, f.last(t).Body, `{"agent":"sim","start_within_s":120}`)
	w := task.WaitReason
	if w == nil || w.Reason != "behind_fair_share" || w.Position != 3 || w.Until != nil ||
		w.ExpectedStart == nil || !w.ExpectedStart.Equal(time.Date(2025, 1, 2, 3, 5, 0, 0, time.UTC)) {
		t.Fatalf("wait reason %+v", w)
	}
	if task.StartDeadline == nil || !task.StartDeadline.Equal(time.Date(2025, 1, 2, 3, 6, 5, 0, time.UTC)) {
		t.Fatalf("start deadline %v", task.StartDeadline)
	}
	if IsTerminal(StateQueued) || !IsTerminal(StateExpired) {
		t.Fatal("expired must be terminal, queued not")
	}
}
