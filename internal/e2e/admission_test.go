package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/runtime"
)

// refusal is the 429/402 error body.
type refusal struct {
	Error struct {
		Code              string   `json:"code"`
		Message           string   `json:"message"`
		LimitType         string   `json:"limit_type"`
		RetryAfterSeconds int      `json:"retry_after_seconds"`
		TenantID          string   `json:"tenant_id"`
		Violated          []string `json:"violated"`
		CurrentUsage      float64  `json:"current_usage"`
		LimitValue        float64  `json:"limit_value"`
		UpgradeURL        string   `json:"upgrade_url"`
	} `json:"error"`
}

func (h *harness) tenantWith(id, plan string, overrides map[string]client.Limit, scopes any) string {
	h.t.Helper()
	ov := maps.Clone(generous)
	maps.Copy(ov, overrides)
	var out map[string]any
	if st, _ := h.do("POST", "/v1/admin/tenants", h.admin, map[string]any{"id": id, "plan": plan, "overrides": ov}, &out); st != 201 {
		h.t.Fatalf("create tenant: %d %v", st, out)
	}
	var k struct{ Key string }
	h.do("POST", "/v1/admin/tenants/"+id+"/keys", h.admin, map[string]any{"scopes": scopes}, &k)
	return k.Key
}

func checkContractHeaders(t *testing.T, what string, hd http.Header) {
	t.Helper()
	for _, name := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit"} {
		if hd.Get(name) == "" {
			t.Errorf("%s: no %s header", what, name)
		}
	}
	if reset, err := strconv.ParseInt(hd.Get("X-RateLimit-Reset"), 10, 64); err != nil || reset < time.Now().Unix() || reset > time.Now().Add(32*24*time.Hour).Unix() {
		t.Errorf("%s: X-RateLimit-Reset %q is not a unix time in the near future", what, hd.Get("X-RateLimit-Reset"))
	}
}

func TestRateLimitContract(t *testing.T) {
	t.Parallel()
	h := start(t)
	// burst 5, refilled only every 100 s: the test measures the burst, not the clock
	key := h.tenantWith("rl", "pro", map[string]client.Limit{"tenant_rate": 0.01, "tenant_rate_burst": 5}, nil)
	body := `{"agent":"sim","input":{"steps":1,"step_ms":1}}`
	for i := range 5 {
		var task map[string]any
		st, hd := h.do("POST", "/v1/tasks", key, body, &task)
		if st != 202 {
			t.Fatalf("request %d of the burst: %d %v", i, st, task)
		}
		checkContractHeaders(t, "202", hd)
		if !strings.Contains(hd.Get("RateLimit-Policy"), `"tenant";q=0.01;w=1`) || !strings.Contains(hd.Get("RateLimit-Policy"), `"key";q=`) {
			t.Fatalf("RateLimit-Policy %q lacks the tenant or key item", hd.Get("RateLimit-Policy"))
		}
		if want := fmt.Sprintf(`"tenant";r=%d;t=`, 4-i); !strings.Contains(hd.Get("RateLimit"), want) {
			t.Fatalf("RateLimit %q lacks %s", hd.Get("RateLimit"), want)
		}
		if hd.Get("Retry-After") != "" {
			t.Fatal("Retry-After on a 202")
		}
	}
	var r refusal
	st, hd := h.do("POST", "/v1/tasks", key, body, &r)
	if st != 429 || r.Error.Code != "RATE_LIMIT_EXCEEDED" || r.Error.LimitType != "tenant_rate" || r.Error.TenantID != "rl" ||
		!slices.Contains(r.Error.Violated, "tenant_rate") || r.Error.RetryAfterSeconds < 1 || !strings.Contains(r.Error.Message, "0.01 requests/second") {
		t.Fatalf("6th request: %d %+v", st, r)
	}
	checkContractHeaders(t, "429", hd)
	if ra, err := strconv.Atoi(hd.Get("Retry-After")); err != nil || ra < 1 {
		t.Fatalf("Retry-After %q", hd.Get("Retry-After"))
	}
	if hd.Get("X-RateLimit-Remaining") != "0" || !strings.Contains(hd.Get("RateLimit"), `"tenant";r=0;`) {
		t.Fatalf("binding limit on 429: remaining %s, RateLimit %q; want the tenant's bucket at 0", hd.Get("X-RateLimit-Remaining"), hd.Get("RateLimit"))
	}
	if n, _ := h.app.Store().CountTasks(context.Background(), store.CountTasksParams{TenantID: "rl"}); n != 5 {
		t.Fatalf("%d tasks written, want 5", n)
	}
	// reads carry the headers too (the key bucket)
	_, hd = h.do("GET", "/v1/tasks", key, nil, nil)
	checkContractHeaders(t, "GET /v1/tasks", hd)
}

func TestConcurrencyAndQuotaRefusals(t *testing.T) {
	t.Parallel()
	h := start(t)
	ctx := context.Background()
	cc := h.tenantWith("cc", "pro", map[string]client.Limit{"concurrent_sessions": 2}, nil)
	long := `{"agent":"sim","input":{"steps":40,"step_ms":100}}`
	var ids []string
	for range 2 {
		var task struct{ ID string }
		if st, _ := h.do("POST", "/v1/tasks", cc, long, &task); st != 202 {
			t.Fatalf("session: %d", st)
		}
		ids = append(ids, task.ID)
	}
	var r refusal
	st, hd := h.do("POST", "/v1/tasks", cc, `{"agent":"sim"}`, &r)
	if st != 429 || r.Error.Code != "CONCURRENCY_LIMIT_EXCEEDED" || r.Error.LimitType != "concurrent_sessions" ||
		!strings.Contains(r.Error.Message, "concurrent-agent limit (2)") || hd.Get("Retry-After") == "" {
		t.Fatalf("third session: %d %+v", st, r)
	}
	checkContractHeaders(t, "429 concurrency", hd)
	// killing a session frees its lease at once
	if st, _ := h.do("POST", "/v1/tasks/"+ids[0]+"/cancel", cc, nil, nil); st != 200 {
		t.Fatalf("cancel: %d", st)
	}
	if st, _ := h.do("POST", "/v1/tasks", cc, `{"agent":"sim"}`, nil); st != 202 {
		t.Fatalf("after a cancel freed a session: %d", st)
	}

	qq := h.tenantWith("qq", "pro", map[string]client.Limit{"agent_steps_daily": 3}, nil)
	var task struct{ ID string }
	h.do("POST", "/v1/tasks", qq, `{"agent":"sim","input":{"steps":3,"step_ms":5}}`, &task)
	c := client.New(h.base, qq)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if done, err := c.WaitTask(wctx, task.ID, 20*time.Millisecond); err != nil || done.State != "completed" {
		t.Fatalf("quota task: %v %v", done, err)
	}
	st, hd = h.do("POST", "/v1/tasks", qq, `{"agent":"sim"}`, &r)
	if st != 402 || r.Error.Code != "QUOTA_EXCEEDED" || r.Error.LimitType != "agent_steps_daily" || r.Error.CurrentUsage != 3 ||
		r.Error.LimitValue != 3 || r.Error.UpgradeURL == "" || !strings.Contains(r.Error.Message, "Daily agent step limit of 3") {
		t.Fatalf("after the daily steps: %d %+v", st, r)
	}
	checkContractHeaders(t, "402", hd)
}

// usage reads /v1/usage.
func (h *harness) usage(key string) map[string]map[string]any {
	h.t.Helper()
	var u struct {
		TenantID string                    `json:"tenant_id"`
		Limits   map[string]map[string]any `json:"limits"`
	}
	if st, _ := h.do("GET", "/v1/usage", key, nil, &u); st != 200 {
		h.t.Fatalf("GET /v1/usage: %d", st)
	}
	return u.Limits
}

func TestLeaseReleasedAtEveryTerminalState(t *testing.T) {
	t.Parallel()
	h := start(t)
	ctx := context.Background()
	key := h.tenantWith("ls", "pro", map[string]client.Limit{"concurrent_sessions": 1}, nil)
	c := client.New(h.base, key)
	steps := 1
	cases := []struct {
		name  string
		req   client.SubmitTaskRequest
		state string
	}{
		{"completed", client.SubmitTaskRequest{Agent: "sim", Input: map[string]int{"steps": 1, "step_ms": 300}}, "completed"},
		{"failed", client.SubmitTaskRequest{Agent: "sim", Input: map[string]int{"steps": 2, "fail_at_step": 1, "step_ms": 300}}, "failed"},
		{"budget_exceeded", client.SubmitTaskRequest{Agent: "sim", Input: map[string]int{"steps": 5, "step_ms": 300}, Budget: &client.BudgetRequest{MaxSteps: &steps}}, "budget_exceeded"},
		{"killed while running", client.SubmitTaskRequest{Agent: "sim", Input: map[string]int{"steps": 100, "step_ms": 50}}, "killed"},
	}
	for _, tc := range cases {
		task, err := c.SubmitTask(ctx, tc.req)
		if err != nil {
			t.Fatalf("%s: submit: %v (the previous task's lease was not released)", tc.name, err)
		}
		if used := h.usage(key)["concurrent_sessions"]["used"]; used != 1.0 {
			t.Fatalf("%s: sessions used %v while the task lives, want 1", tc.name, used)
		}
		if tc.state == "killed" {
			waitState(t, c, task.ID, "running", 10*time.Second)
			if _, err := c.CancelTask(ctx, task.ID); err != nil {
				t.Fatal(err)
			}
		}
		waitState(t, c, task.ID, tc.state, 10*time.Second)
		deadline := time.Now().Add(2 * time.Second)
		for h.usage(key)["concurrent_sessions"]["used"] != 0.0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: lease still held after the task ended", tc.name)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// taskEnds listens to every task's progress messages from now on; the function it
// returns waits, at most within, for the given task's end message. A worker sends
// that message in one round trip after the end's last quota settlement and its lease
// release, so once it is heard the task's use is booked and its session free: polling
// the task's state instead can see the end before them.
func (h *harness) taskEnds() func(id string, within time.Duration) runtime.Event {
	h.t.Helper()
	ctx := context.Background()
	sub := h.app.Redis().PSubscribe(ctx, h.app.Keys().TaskEvents("*"))
	if _, err := sub.Receive(ctx); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { sub.Close() })
	ch := sub.Channel()
	return func(id string, within time.Duration) runtime.Event {
		h.t.Helper()
		timeout := time.After(within)
		for {
			select {
			case m := <-ch:
				var ev runtime.Event
				if err := json.Unmarshal([]byte(m.Payload), &ev); err != nil {
					h.t.Fatalf("a progress message %q: %v", m.Payload, err)
				}
				if ev.TaskID == id && ev.Type == "state" && agentqtype.TaskState(ev.State).Terminal() {
					return ev
				}
			case <-timeout:
				h.t.Fatalf("task %s sent no end message within %v", id, within)
			}
		}
	}
}

func TestUsageAgreesWithAdmissionAndConsumesNothing(t *testing.T) {
	t.Parallel()
	h := start(t)
	// a slow refill (one token per 100 s), so the bucket does not move between reads
	key := h.tenantWith("pa", "pro", map[string]client.Limit{"tenant_rate": 0.01, "tenant_rate_burst": 5, "agent_steps_daily": 500}, nil)
	c := client.New(h.base, key)
	ends := h.taskEnds()
	task, err := c.SubmitTask(context.Background(), client.SubmitTaskRequest{Agent: "sim", Input: map[string]any{"steps": 3, "step_ms": 5, "tokens_per_step": 10, "cost_usd_per_step": 0.25}})
	if err != nil {
		t.Fatal(err)
	}
	if end := ends(task.ID, 10*time.Second); end.State != "completed" {
		t.Fatalf("the task ended %+v", end)
	}
	var u map[string]map[string]any
	for range 30 {
		u = h.usage(key)
	}
	want := map[string][2]any{ // limit, used
		"agent_steps_daily": {500.0, 3.0}, "ai_tokens_monthly": {20000000.0, 30.0}, "usd_monthly": {50.0, 0.75},
		"concurrent_sessions": {10000.0, 0.0}, "tenant_rate": {0.01, nil},
	}
	for name, w := range want {
		l := u[name]
		if l["limit"] != w[0] || (w[1] != nil && l["used"] != w[1]) {
			t.Errorf("%s: limit %v used %v, want %v %v", name, l["limit"], l["used"], w[0], w[1])
		}
	}
	for _, name := range []string{"key_rate", "tenant_rate", "key_agent_rate", "user_tasks_hourly", "concurrent_sessions",
		"long_running_inflight", "queue_backlog", "running", "agent_steps_daily", "ai_tokens_monthly", "usd_monthly"} {
		l, ok := u[name]
		if !ok {
			t.Errorf("usage lacks %s", name)
			continue
		}
		for _, f := range []string{"limit", "used", "remaining", "reset_at", "window_s", "unit"} {
			if _, ok := l[f]; !ok {
				t.Errorf("usage %s lacks %s", name, f)
			}
		}
	}
	// 30 usage calls took nothing: the tenant bucket still has 4 (5 - the one task),
	// and the next admission reports exactly one less than usage does.
	rem := u["tenant_rate"]["remaining"].(float64)
	if rem != 4 {
		t.Fatalf("tenant_rate remaining %v after one task and 30 usage calls, want 4", rem)
	}
	_, hd := h.do("POST", "/v1/tasks", key, `{"agent":"sim"}`, nil)
	if got := hd.Get("RateLimit"); !strings.Contains(got, fmt.Sprintf(`"tenant";r=%d;`, int(rem)-1)) {
		t.Fatalf("usage said tenant_rate remaining %v; the next admission's RateLimit is %q", rem, got)
	}
}

func TestScopeCheckedBeforeTenantLimits(t *testing.T) {
	t.Parallel()
	h := start(t)
	ctx := context.Background()
	good := h.tenantWith("sc", "pro", map[string]client.Limit{"tenant_rate": 5, "tenant_rate_burst": 5, "key_rate": 5, "key_rate_burst": 10}, nil)
	var k struct{ Key string }
	h.do("POST", "/v1/admin/tenants/sc/keys", h.admin, map[string]any{"scopes": map[string]any{"agents": []string{"other-agent"}}}, &k)
	bad := k.Key
	n429 := 0
	for range 60 {
		var r refusal
		st, _ := h.do("POST", "/v1/tasks", bad, `{"agent":"sim","input":{"steps":1}}`, &r)
		switch {
		case st == 403 && r.Error.Code == "SCOPE_FORBIDDEN":
		case st == 429 && r.Error.LimitType == "key_rate":
			n429++ // the hammering key's own bucket
		default:
			t.Fatalf("out-of-scope submit: %d %+v", st, r)
		}
	}
	if n429 == 0 {
		t.Fatal("60 rapid requests never hit the key's own bucket")
	}
	for i := range 5 {
		if st, _ := h.do("POST", "/v1/tasks", good, `{"agent":"sim","input":{"steps":1,"step_ms":1}}`, nil); st != 202 {
			t.Fatalf("in-scope request %d after out-of-scope hammering: %d", i, st)
		}
	}
	// no Redis key name holds a plaintext secret
	keys, err := h.app.Redis().Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, plaintext := range []string{good, bad} {
		secret := plaintext[strings.LastIndexByte(plaintext, '_')+1:]
		for _, rk := range keys {
			if strings.Contains(rk, secret) || strings.Contains(rk, plaintext) {
				t.Fatalf("Redis key %q contains a key secret", rk)
			}
		}
	}
}

func TestReloadKeepsWindowsAndRevokeDropsKeyState(t *testing.T) {
	t.Parallel()
	h := start(t)
	ctx := context.Background()
	keep := h.tenantWith("rk", "pro", map[string]client.Limit{"key_rate": 0.01, "key_rate_burst": 10}, nil)
	for range 6 {
		h.do("GET", "/v1/tasks", keep, nil, nil)
	}
	_, hd := h.do("GET", "/v1/tasks", keep, nil, nil)
	before := hd.Get("X-RateLimit-Remaining")
	h.app.API().ReloadKeys()
	_, hd = h.do("GET", "/v1/tasks", keep, nil, nil)
	if after := hd.Get("X-RateLimit-Remaining"); after != before && after != fmt.Sprint(atoi(before)-1) {
		t.Fatalf("key bucket remaining %s before reload, %s after: the window was reset", before, after)
	}
	var k struct{ Kid, Key string }
	h.do("POST", "/v1/admin/tenants/rk/keys", h.admin, map[string]any{}, &k)
	h.do("GET", "/v1/tasks", k.Key, nil, nil)
	state := h.app.Keys().AdmissionState("rk")
	if !h.app.Redis().HExists(ctx, state, "k:"+k.Kid).Val() {
		t.Fatal("no key bucket after a request")
	}
	if st, _ := h.do("DELETE", "/v1/admin/keys/"+k.Kid, h.admin, nil, nil); st != 204 {
		t.Fatalf("revoke: %d", st)
	}
	if h.app.Redis().HExists(ctx, state, "k:"+k.Kid).Val() {
		t.Fatal("the revoked key's bucket survived")
	}
	if !h.app.Redis().HExists(ctx, state, "k:"+keyKid(keep)).Val() {
		t.Fatal("revoking one key dropped another key's bucket")
	}
}

func keyKid(plaintext string) string {
	rest := strings.TrimPrefix(plaintext, "aq_")
	return rest[:strings.LastIndexByte(rest, '_')]
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

func TestGlobalLimitAcrossThreeAPIReplicas(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	first := e.start(t)
	apiOnly := func(o *agentq.Options) { o.Config.Roles = []string{config.RoleAPI} }
	replicas := []*harness{first, e.start(t, apiOnly), e.start(t, apiOnly)}
	key := first.tenantWith("gl", "pro", map[string]client.Limit{"tenant_rate": 10, "tenant_rate_burst": 10}, nil)
	var ok atomic.Int64
	t0 := time.Now()
	end := t0.Add(2 * time.Second)
	var wg sync.WaitGroup
	for _, r := range replicas {
		for range 3 {
			wg.Go(func() {
				for time.Now().Before(end) {
					req, _ := http.NewRequest("POST", r.base+"/v1/tasks", strings.NewReader(`{"agent":"sim","input":{"steps":1,"step_ms":1}}`))
					req.Header.Set("Authorization", "Bearer "+key)
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						continue
					}
					resp.Body.Close()
					if resp.StatusCode == 202 {
						ok.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	el := time.Since(t0).Seconds()
	maxOK := int64(10 + 10*el + 1)
	if got := ok.Load(); got > maxOK || got < 15 {
		t.Fatalf("3 replicas admitted %d in %.1fs for a 10/s burst-10 tenant, want 15..%d (one global bucket)", got, el, maxOK)
	}
}

// redisDeadline is the Redis deadline of TestDegradedModeWhenRedisIsDown.
const redisDeadline = 10 * time.Second

func TestDegradedModeWhenRedisIsDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dead := testenv.DeadRedis(t)
	h := e.start(t, func(o *agentq.Options) {
		o.Redis = dead
		o.Config.Roles = []string{config.RoleAPI}
		// A request that waited on Redis would wait this long: far beyond what 13
		// answered ones take on the busiest machine (about 1.3 s here alone, 3 s under
		// the full suite), so the bound below tells waiting from a slow machine.
		o.Config.RedisTimeout = redisDeadline
	})
	noQuotas := map[string]client.Limit{"tenant_rate": 0.01, "tenant_rate_burst": 5, "agent_steps_daily": client.Unlimited, "ai_tokens_monthly": client.Unlimited, "usd_monthly": client.Unlimited}
	free := h.tenantWith("free", "enterprise", noQuotas, nil)
	paid := h.tenantWith("paid", "pro", map[string]client.Limit{"tenant_rate": 5, "tenant_rate_burst": 5}, nil)

	t0 := time.Now()
	var r refusal
	st, hd := h.do("POST", "/v1/tasks", paid, `{"agent":"sim"}`, &r)
	if st != 503 || r.Error.Code != "SERVICE_UNAVAILABLE" || hd.Get("Retry-After") == "" {
		t.Fatalf("quota tenant with Redis down: %d %+v (Retry-After %q), want 503 with Retry-After", st, r, hd.Get("Retry-After"))
	}
	n202, n429 := 0, 0
	for range 12 {
		st, hd := h.do("POST", "/v1/tasks", free, `{"agent":"sim"}`, &r)
		switch st {
		case 202:
			n202++
		case 429:
			n429++
			if r.Error.LimitType != "tenant_rate" || hd.Get("Retry-After") == "" {
				t.Fatalf("degraded 429: %+v", r)
			}
		default:
			t.Fatalf("no-quota tenant with Redis down: %d %+v", st, r)
		}
	}
	if n202 != 5 || n429 != 7 {
		t.Fatalf("local bucket of burst 5 admitted %d, refused %d of 12", n202, n429)
	}
	if d := time.Since(t0); d >= redisDeadline {
		t.Fatalf("13 requests took %v with Redis down: the API waited on Redis (its deadline is %v)", d, redisDeadline)
	}
	// accepted tasks are in Postgres, queued, for the recovery sweep to push
	if n, _ := h.app.Store().CountTasks(context.Background(), store.CountTasksParams{TenantID: "free"}); n != n202 {
		t.Fatalf("%d tasks stored, %d accepted", n, n202)
	}
}

func TestPlanChangesApplyOnTheNextRequestOnEveryReplica(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.start(t)
	b := e.start(t, func(o *agentq.Options) { o.Config.Roles = []string{config.RoleAPI} })
	key := a.tenantWith("pc", "pro", map[string]client.Limit{"tenant_rate": 0.01, "tenant_rate_burst": 1}, nil)
	body := `{"agent":"sim","input":{"steps":1,"step_ms":1}}`
	if st, _ := b.do("POST", "/v1/tasks", key, body, nil); st != 202 {
		t.Fatalf("first: %d", st)
	}
	if st, _ := b.do("POST", "/v1/tasks", key, body, nil); st != 429 {
		t.Fatalf("second request: %d, want 429", st)
	}
	ov := maps.Clone(generous)
	ov["tenant_rate"], ov["tenant_rate_burst"] = 100, 100
	if st, _ := a.do("PATCH", "/v1/admin/tenants/pc", a.admin, map[string]any{"overrides": ov}, nil); st != 200 {
		t.Fatalf("patch: %d", st)
	}
	deadline := time.Now().Add(time.Second)
	for {
		var r refusal
		st, hd := b.do("POST", "/v1/tasks", key, body, &r)
		if st == 202 && strings.Contains(hd.Get("RateLimit-Policy"), `"tenant";q=100`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a second after the override, replica B still answers %d %+v with %q", st, r, hd.Get("RateLimit"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
