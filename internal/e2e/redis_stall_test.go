package e2e_test

import (
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/internal/redisx"
)

// stallProxy stands between a process and the test's Redis. Stalled, it takes every
// byte and answers none, on the connections it holds and on new ones: a Redis node
// that stopped answering without closing anything, which only a deadline ends.
type stallProxy struct {
	ln       net.Listener
	upstream string
	stalled  atomic.Bool
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func newStallProxy(t *testing.T, upstream string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, upstream: upstream}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *stallProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.track(c)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			up, err := net.Dial("tcp", p.upstream)
			if err != nil {
				c.Close()
				return
			}
			p.track(up)
			p.wg.Add(1)
			go func() { defer p.wg.Done(); p.pipe(up, c) }()
			p.pipe(c, up)
		}()
	}
}

func (p *stallProxy) track(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns = append(p.conns, c)
}

// pipe copies from src to dst until either closes, dropping what it reads while
// stalled.
func (p *stallProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.stalled.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *stallProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// client is a client of the proxy on the test's Redis database, with the options
// agentq's own Redis connection has (redisx.Connect).
func (p *stallProxy) client(t *testing.T, of redis.UniversalClient) *redis.Client {
	t.Helper()
	base, ok := of.(*redis.Client)
	if !ok {
		t.Skip("the test's Redis is not a single node")
	}
	opt := *base.Options()
	opt.Addr = p.ln.Addr().String()
	opt.PoolSize = 64
	c := redis.NewClient(redisx.Options(&opt))
	t.Cleanup(func() { c.Close() })
	return c
}

// readBudget bounds a read while Redis does not answer: a few calls of the
// admission's deadline (redisTimeout), the rest slack for the race detector.
const (
	redisStallTimeout = 200 * time.Millisecond
	readBudget        = 2 * time.Second
)

// While the Redis node holding a tenant's keys takes requests and answers none, the
// reads that only decorate Postgres's answer with Redis (a queued task's place and
// expected start, the usage report's live counters, the panel) answer within the
// admission's Redis deadline, without the decoration, and say so (degraded); once
// Redis answers again, they are whole again.
func TestReadsAnswerWithoutRedisWithinItsDeadline(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up, ok := e.rdb.(*redis.Client)
	if !ok {
		t.Skip("the test's Redis is not a single node")
	}
	proxy := newStallProxy(t, up.Options().Addr)
	h := e.start(t, func(o *agentq.Options) {
		o.Redis = proxy.client(t, e.rdb)
		o.Config.Roles = []string{"api"} // nothing dispatches: the tasks stay queued
		o.Config.RedisTimeout = redisStallTimeout
	})
	c, k := h.tenantClient("stall", "pro", nil)
	for range 3 {
		if _, err := c.SubmitTask(t.Context(), sim(1, 1)); err != nil {
			t.Fatal(err)
		}
	}
	st, link := h.panelLink("stall", map[string]any{})
	if st != 201 {
		t.Fatalf("panel link: %d", st)
	}
	panelUsage := strings.TrimPrefix(strings.Replace(link, "/panel/t?", "/panel/t/usage?", 1), h.base)

	type read struct {
		name, path, token string
		check             func(t *testing.T, body map[string]any, whole bool)
	}
	var one string
	reads := []read{
		{"task list", "/v1/tasks?state=queued", k.Key, func(t *testing.T, b map[string]any, whole bool) {
			tasks, _ := b["tasks"].([]any)
			if len(tasks) != 3 {
				t.Fatalf("%d queued tasks listed, want 3: %v", len(tasks), b)
			}
			for _, x := range tasks {
				checkWaitReason(t, x.(map[string]any), whole)
			}
			one = tasks[0].(map[string]any)["id"].(string)
		}},
		{"one task", "", k.Key, func(t *testing.T, b map[string]any, whole bool) { checkWaitReason(t, b, whole) }},
		{"usage", "/v1/usage", k.Key, func(t *testing.T, b map[string]any, whole bool) { checkUsage(t, b, whole) }},
		{"panel", panelUsage, "", func(t *testing.T, b map[string]any, whole bool) { checkUsage(t, b, whole) }},
	}
	do := func(r read, whole bool) {
		t.Helper()
		path := r.path
		if path == "" {
			path = "/v1/tasks/" + one
		}
		var body map[string]any
		t0 := time.Now()
		status, _ := h.do("GET", path, r.token, nil, &body)
		took := time.Since(t0)
		if status != 200 {
			t.Fatalf("%s (Redis answering: %v): %d %v", r.name, whole, status, body)
		}
		if !whole {
			t.Logf("%s answered in %v while Redis did not answer", r.name, took)
		}
		if !whole && took > readBudget {
			t.Errorf("%s took %v while Redis did not answer: want at most %v (its deadline is %v)", r.name, took, readBudget, redisStallTimeout)
		}
		r.check(t, body, whole)
	}
	for _, r := range reads {
		do(r, true)
	}
	proxy.stalled.Store(true)
	for _, r := range reads {
		do(r, false)
	}
	proxy.stalled.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for _, r := range reads {
		for {
			var body map[string]any
			path := r.path
			if path == "" {
				path = "/v1/tasks/" + one
			}
			if st, _ := h.do("GET", path, r.token, nil, &body); st == 200 && !degraded(body) {
				r.check(t, body, true)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s is still degraded 10 s after Redis answers again", r.name)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// checkWaitReason: a queued task says where it stands while Redis answers; without
// Redis it says degraded and has no wait_reason.
func checkWaitReason(t *testing.T, task map[string]any, whole bool) {
	t.Helper()
	wr, _ := task["wait_reason"].(map[string]any)
	switch {
	case whole && (wr == nil || wr["position"] == nil || task["degraded"] != nil):
		t.Errorf("task %v with Redis answering: want its position and no degraded", task)
	case !whole && (task["wait_reason"] != nil || task["degraded"] != true):
		t.Errorf("task %v without Redis: want wait_reason null and degraded true", task)
	}
}

// checkUsage: the usage report counts live use while Redis answers; without Redis it
// says degraded, has no live counts, and still has what Postgres holds.
func checkUsage(t *testing.T, rep map[string]any, whole bool) {
	t.Helper()
	limits, _ := rep["limits"].(map[string]any)
	steps, _ := limits["agent_steps_daily"].(map[string]any)
	queue, _ := rep["queue"].(map[string]any)
	tasks, _ := rep["tasks"].([]any)
	if steps == nil || steps["limit"] == nil || queue["depth"] != 3.0 || len(tasks) != 3 || rep["plan"] != "pro" {
		t.Fatalf("usage report %v: want the plan's limits, 3 queued tasks and the plan", rep)
	}
	switch {
	case whole && (rep["degraded"] != nil || steps["used"] == nil):
		t.Errorf("usage report with Redis answering: degraded %v, steps %v", rep["degraded"], steps)
	case !whole && (rep["degraded"] != true || steps["used"] != nil || tasks[0].(map[string]any)["wait_reason"] != nil):
		t.Errorf("usage report without Redis: degraded %v, steps %v, task %v; want degraded, no live counts", rep["degraded"], steps, tasks[0])
	}
}

// degraded tells whether a read says it lacks what Redis holds: the usage report or
// one task says so itself, a listing in its tasks.
func degraded(body map[string]any) bool {
	if body["degraded"] != nil {
		return true
	}
	tasks, _ := body["tasks"].([]any)
	for _, x := range tasks {
		if t, _ := x.(map[string]any); t["degraded"] != nil {
			return true
		}
	}
	return false
}
