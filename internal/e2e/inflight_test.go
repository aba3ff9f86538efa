package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/config"
)

// openStream opens a task's event stream; the caller closes the body.
func (h *harness) openStream(ctx context.Context, key, id string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", h.base+"/v1/tasks/"+id+"/events", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	return http.DefaultClient.Do(req)
}

// inflightHeld is the number of live inflight_requests leases of a tenant.
func (h *harness) inflightHeld(tenant string) int64 {
	h.t.Helper()
	n, err := h.app.Redis().ZCard(context.Background(), h.app.Keys().InflightRequests(tenant)).Result()
	if err != nil {
		h.t.Fatal(err)
	}
	return n
}

func (h *harness) waitInflight(tenant string, want int64, why string) {
	h.t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for h.inflightHeld(tenant) != want {
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: tenant %s holds %d inflight_requests leases, want %d", why, tenant, h.inflightHeld(tenant), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A free tenant's only agent session is its running task's; its event stream on that
// task holds an inflight_requests slot instead, so it opens and sees the completion.
func TestEventStreamTakesNoAgentSession(t *testing.T) {
	t.Parallel()
	h := start(t)
	key := h.tenantWith("fs", "free", map[string]client.Limit{"concurrent_sessions": 1, "running": 1}, nil)
	var task struct{ ID string }
	if st, _ := h.do("POST", "/v1/tasks", key, `{"agent":"sim","input":{"steps":3,"step_ms":300}}`, &task); st != 202 {
		t.Fatalf("submit: %d", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	resp, err := h.openStream(ctx, key, task.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("a free tenant's event stream on its own running task answered %d %s, want 200", resp.StatusCode, b)
	}
	// the stream holds a request slot, not a session: the task's session is the only one
	u := h.usage(key)
	if u["concurrent_sessions"]["used"] != 1.0 {
		t.Fatalf("concurrent_sessions used %v with one task running and a stream open, want 1", u["concurrent_sessions"]["used"])
	}
	if u["inflight_requests"]["used"] != 2.0 || u["inflight_requests"]["limit"] != 32.0 {
		t.Fatalf("inflight_requests %v with a stream open while /v1/usage runs, want used 2 of 32", u["inflight_requests"])
	}
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `"state":"completed"`) {
		t.Fatalf("the stream did not report the completion: %s", body)
	}
	h.waitInflight("fs", 0, "after the stream ended")
}

// The 33rd concurrent request of a tenant is refused with inflight_requests; slots come
// back when requests end: normally, with an error, or by a client disconnect.
func TestInflightRequestsLimit(t *testing.T) {
	t.Parallel()
	h := start(t)
	key := h.tenantWith("ir", "pro", nil, nil)
	var task struct{ ID string }
	if st, _ := h.do("POST", "/v1/tasks", key, `{"agent":"sim","input":{"steps":100,"step_ms":200}}`, &task); st != 202 {
		t.Fatalf("submit: %d", st)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// 33 concurrent slow requests (event streams of a long task): exactly one is refused
	type result struct {
		resp *http.Response
		err  error
	}
	results := make([]result, 33)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			r, err := h.openStream(ctx, key, task.ID)
			results[i] = result{r, err}
		})
	}
	wg.Wait()
	var open []*http.Response
	refused := 0
	for _, r := range results {
		if r.err != nil {
			t.Fatal(r.err)
		}
		switch r.resp.StatusCode {
		case 200:
			open = append(open, r.resp)
		case 429:
			refused++
			var body refusal
			decodeJSON(t, r.resp, &body)
			if body.Error.Code != "CONCURRENCY_LIMIT_EXCEEDED" || body.Error.LimitType != "inflight_requests" ||
				body.Error.RetryAfterSeconds < 1 || body.Error.TenantID != "ir" || body.Error.LimitValue != 32 {
				t.Fatalf("the refused request's body: %+v", body)
			}
			hd := r.resp.Header
			checkContractHeaders(t, "inflight 429", hd)
			if ra, err := strconv.Atoi(hd.Get("Retry-After")); err != nil || ra < 1 {
				t.Fatalf("Retry-After %q", hd.Get("Retry-After"))
			}
			if hd.Get("X-RateLimit-Limit") != "32" || hd.Get("X-RateLimit-Remaining") != "0" ||
				!strings.Contains(hd.Get("RateLimit"), `"inflight";r=0;`) {
				t.Fatalf("inflight 429 headers: X-RateLimit-Limit %q, remaining %q, RateLimit %q",
					hd.Get("X-RateLimit-Limit"), hd.Get("X-RateLimit-Remaining"), hd.Get("RateLimit"))
			}
		default:
			b, _ := io.ReadAll(r.resp.Body)
			t.Fatalf("stream answered %d %s", r.resp.StatusCode, b)
		}
	}
	if refused != 1 || len(open) != 32 {
		t.Fatalf("33 concurrent streams: %d open, %d refused; want 32 and 1", len(open), refused)
	}
	h.waitInflight("ir", 32, "with 32 streams open")
	// every kind of request is counted, not only streams
	var r refusal
	if st, _ := h.do("GET", "/v1/tasks/"+task.ID, key, nil, &r); st != 429 || r.Error.LimitType != "inflight_requests" {
		t.Fatalf("GET task with 32 streams open: %d %+v, want 429 inflight_requests", st, r)
	}
	// a client that disconnects gives its slot back
	open[0].Body.Close()
	h.waitInflight("ir", 31, "after a client closed its stream")
	if st, _ := h.do("GET", "/v1/tasks/"+task.ID, key, nil, nil); st != 200 {
		t.Fatalf("GET task after a stream closed: %d", st)
	}
	for _, resp := range open[1:] {
		resp.Body.Close()
	}
	h.waitInflight("ir", 0, "after every stream closed")

	// error answers release their slot too: far more than 32 of them in a row
	for range 40 {
		if st, _ := h.do("GET", "/v1/tasks/00000000-0000-0000-0000-000000000000", key, nil, nil); st != 404 {
			t.Fatalf("GET unknown task: %d", st)
		}
		if st, _ := h.do("POST", "/v1/tasks", key, `{"agent":"nope"}`, nil); st != 400 {
			t.Fatalf("submit of an unknown agent: %d", st)
		}
	}
	h.waitInflight("ir", 0, "after 80 error answers")
	if st, _ := h.do("POST", "/v1/tasks/"+task.ID+"/cancel", key, nil, nil); st != 200 {
		t.Fatalf("cancel: %d", st)
	}
}

// Reads spend the key bucket, /v1/usage included, and nothing else of the tenant's.
func TestReadsSpendOnlyTheKeyBucket(t *testing.T) {
	t.Parallel()
	h := start(t)
	// a key bucket of burst 3 refilled every 100 s, so the test measures the burst
	key := h.tenantWith("rk", "pro", map[string]client.Limit{"key_rate": 0.01, "key_rate_burst": 3}, nil)
	for i := range 3 {
		if st, hd := h.do("GET", "/v1/usage", key, nil, nil); st != 200 {
			t.Fatalf("GET /v1/usage %d of the burst: %d", i, st)
		} else if !strings.Contains(hd.Get("RateLimit"), `"key";r=`+strconv.Itoa(2-i)+`;`) {
			t.Fatalf("GET /v1/usage %d: RateLimit %q, want the key bucket at %d", i, hd.Get("RateLimit"), 2-i)
		}
	}
	var r refusal
	st, hd := h.do("GET", "/v1/usage", key, nil, &r)
	if st != 429 || r.Error.Code != "RATE_LIMIT_EXCEEDED" || r.Error.LimitType != "key_rate" || hd.Get("Retry-After") == "" {
		t.Fatalf("4th GET /v1/usage with a key burst of 3: %d %+v, want 429 key_rate", st, r)
	}
	for _, path := range []string{"/v1/tasks", "/v1/tasks/00000000-0000-0000-0000-000000000000",
		"/v1/tasks/00000000-0000-0000-0000-000000000000/events"} {
		if st, _ := h.do("GET", path, key, nil, &r); st != 429 || r.Error.LimitType != "key_rate" {
			t.Fatalf("GET %s with the key bucket empty: %d %+v, want 429 key_rate", path, st, r)
		}
	}
	// nothing but the key bucket was touched: no tenant bucket, no user bucket, no lease
	fields, err := h.app.Redis().HKeys(context.Background(), h.app.Keys().AdmissionState("rk")).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fields {
		if f == "t" || strings.HasPrefix(f, "u:") || strings.HasPrefix(f, "a:") {
			t.Fatalf("reads touched the tenant's state field %q (fields %v)", f, fields)
		}
	}
	if n, _ := h.app.Redis().ZCard(context.Background(), h.app.Keys().Sessions("rk")).Result(); n != 0 {
		t.Fatalf("reads hold %d session leases", n)
	}
}

// BenchmarkTenantRead measures what the inflight_requests lease adds to a request: GET
// /v1/tasks/{id} over HTTP for a tenant with the limit off (no Redis call) and on (one
// script call to take the lease, one ZREM to give it back).
func BenchmarkTenantRead(b *testing.B) {
	base, admin, _, _ := countedAPI(b)
	call := func(method, path, token, body string, out any) int {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if out != nil {
			_ = json.Unmarshal(raw, out)
		}
		return resp.StatusCode
	}
	// Alternate the two tenants' reads in one loop, so both see the same load, and
	// report their median latencies.
	var paths, tokens []string
	for _, limit := range []client.Limit{client.Unlimited, 32} {
		id := "b" + strconv.Itoa(int(max(limit, 0)))
		ov := maps.Clone(generous)
		ov["inflight_requests"] = limit
		if st := call("POST", "/v1/admin/tenants", admin, toJSON(map[string]any{"id": id, "plan": "pro", "overrides": ov}), nil); st != 201 {
			b.Fatalf("create tenant: %d", st)
		}
		var k struct{ Key string }
		call("POST", "/v1/admin/tenants/"+id+"/keys", admin, "{}", &k)
		var task struct{ ID string }
		if st := call("POST", "/v1/tasks", k.Key, `{"agent":"sim"}`, &task); st != 202 {
			b.Fatalf("submit: %d", st)
		}
		paths, tokens = append(paths, "/v1/tasks/"+task.ID), append(tokens, k.Key)
	}
	var lat [2][]time.Duration
	for b.Loop() {
		for i := range 2 {
			t0 := time.Now()
			if st := call("GET", paths[i], tokens[i], "", nil); st != 200 {
				b.Fatalf("GET task: %d", st)
			}
			lat[i] = append(lat[i], time.Since(t0))
		}
	}
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds())
	}
	off, on := median(lat[0]), median(lat[1])
	b.ReportMetric(off, "off-p50-us")
	b.ReportMetric(on, "on-p50-us")
	b.ReportMetric(on-off, "added-p50-us")
}

// takeOne decrements n if it is above 0 and reports whether it did.
func takeOne(n *atomic.Int64) bool {
	for {
		v := n.Load()
		if v <= 0 {
			return false
		}
		if n.CompareAndSwap(v, v-1) {
			return true
		}
	}
}

// lateAdmission makes the next admission script call late: Redis runs it, but its
// reply comes after the caller's deadline.
type lateAdmission struct{ late atomic.Int64 }

func (h *lateAdmission) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lateAdmission) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *lateAdmission) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		// The admission script: 8 keys per admission, the first a tenant's state hash.
		// The step scripts (reserve, settle) and the recount start with that hash too,
		// with 2 keys: a step of the test's first task must not take the late turn.
		args := cmd.Args()
		if cmd.Name() != "evalsha" || len(args) < 4 || !strings.Contains(fmt.Sprint(args[3]), ":adm:") {
			return next(ctx, cmd)
		}
		if n, err := strconv.Atoi(fmt.Sprint(args[2])); err != nil || n%8 != 0 || !takeOne(&h.late) {
			return next(ctx, cmd)
		}
		if err := next(context.WithoutCancel(ctx), cmd); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	}
}

// One slow admission answers that request by the degraded rules (503 for a tenant with
// a quota) and nothing more: the next request goes to Redis again, and the lease the
// late call took is given back.
func TestOneSlowAdmissionDoesNotDegradeTheReplica(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hook := &lateAdmission{}
	e.rdb.AddHook(hook)
	h := e.start(t)
	key := h.tenantWith("sl", "pro", nil, nil) // pro has token and money quotas
	submit := func() int {
		st, _ := h.do("POST", "/v1/tasks", key, `{"agent":"sim","input":{"steps":1,"step_ms":1}}`, nil)
		return st
	}
	if st := submit(); st != 202 {
		t.Fatalf("first submission: %d", st)
	}
	hook.late.Store(1)
	if st := submit(); st != 503 {
		t.Fatalf("submission whose admission timed out: %d, want 503 (a quota tenant fails closed)", st)
	}
	if st := submit(); st != 202 {
		t.Fatalf("submission right after one timed-out admission: %d, want 202 (one timeout must not degrade the replica)", st)
	}
	if h.app.Admission().Degraded() {
		t.Fatal("the replica is in degraded mode after one timeout")
	}
	// the late call's lease goes back; the two tasks' leases go at completion
	deadline := time.Now().Add(8 * time.Second)
	for {
		n, err := e.rdb.ZCard(context.Background(), h.app.Keys().Sessions("sl")).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			m, _ := e.rdb.ZRange(context.Background(), h.app.Keys().Sessions("sl"), 0, -1).Result()
			t.Fatalf("session leases %v remain: the timed-out admission's lease was not given back", m)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pipelineLog is a go-redis hook keeping the commands of every round trip (a lone
// command is a round trip of one).
type pipelineLog struct {
	mu    sync.Mutex
	trips [][][]any
}

func (l *pipelineLog) note(cmds []redis.Cmder) {
	trip := make([][]any, len(cmds))
	for i, c := range cmds {
		trip[i] = slices.Clone(c.Args())
	}
	l.mu.Lock()
	l.trips = append(l.trips, trip)
	l.mu.Unlock()
}

func (l *pipelineLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *pipelineLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		l.note([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (l *pipelineLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		l.note(cmds)
		return next(ctx, cmds)
	}
}

// A submission gives its inflight_requests slot back in the round trip that pushes
// its task to the queue, not in one of its own: the slot is free when the 202
// arrives, and no other round trip of the submission releases it.
func TestInflightSlotOfASubmissionGoesBackWithItsQueuePush(t *testing.T) {
	t.Parallel()
	log := &pipelineLog{}
	h := start(t, func(o *agentq.Options) {
		o.Config.Roles = []string{config.RoleAPI}
		o.Redis.AddHook(log)
	})
	key := h.tenantWith("sq", "pro", nil, nil)
	slots, queue := h.app.Keys().InflightRequests("sq"), h.app.Keys().TenantQueue("sq")
	log.mu.Lock()
	log.trips = nil
	log.mu.Unlock()
	for i := range 3 {
		if st, _ := h.do("POST", "/v1/tasks", key, `{"agent":"sim","input":{"steps":1}}`, nil); st != 202 {
			t.Fatalf("submit %d: %d", i, st)
		}
		if n := h.inflightHeld("sq"); n != 0 {
			t.Fatalf("submit %d answered with %d inflight_requests leases still held, want 0", i, n)
		}
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	releases, withPush := 0, 0
	for _, trip := range log.trips {
		release, push := false, false
		for _, args := range trip {
			name := strings.ToLower(fmt.Sprint(args[0]))
			if name == "zrem" && len(args) > 1 && args[1] == slots {
				release = true
				releases++
			}
			if (name == "evalsha" || name == "eval") && len(args) > 3 && args[3] == queue {
				push = true
			}
		}
		if release && push {
			withPush++
		}
	}
	if releases != 3 || withPush != 3 {
		t.Fatalf("3 submissions: %d slot releases, %d of them in a queue push's round trip; want 3 and 3", releases, withPush)
	}
}
