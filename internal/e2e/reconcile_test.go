package e2e_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/internal/testenv/testfactory"
)

// apiOnly runs no dispatcher, worker or janitor: nothing moves or repairs what the
// test sets up until it starts a janitor.
func apiOnly(o *agentq.Options) { o.Config.Roles = []string{config.RoleAPI} }

// startJanitor starts a janitor-only process on the env, its passes on a short
// interval.
func startJanitor(t *testing.T, e *env) *harness {
	t.Helper()
	return e.start(t, func(o *agentq.Options) {
		o.Config.Roles = []string{config.RoleJanitor}
		o.Config.JanitorInterval = 100 * time.Millisecond
	})
}

// eventually polls cond until it holds, or fails the test after within.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A janitor process started on drifted state puts it right, every kind: leases,
// running sets, the queue and the pool counter. (Each pass has its own tests in
// internal/maintenance.)
func TestJanitorReconcilesEachKind(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.start(t, apiOnly)
	ctx := context.Background()
	c, _ := h.tenantClient("jr", "pro", nil)
	db := e.pool
	sub := func() string {
		task, err := c.SubmitTask(ctx, sim(1, 1))
		if err != nil {
			t.Fatal(err)
		}
		return task.ID
	}
	// 1. a lease of a task that ended while its release was lost
	ended := sub()
	testfactory.TaskEnded(t, db, ended, "completed")
	// 2. a queued task whose lease and queue entry Redis lost
	lost := sub()
	h.app.Quotas().Release(ctx, nil, "jr", lost)
	h.app.Scheduler().Remove(ctx, "jr", uuid.MustParse(lost))
	// 3. a running task missing from the running set; 4. a running-set entry of an
	// ended task holding a worker slot
	running := sub()
	h.app.Scheduler().Remove(ctx, "jr", uuid.MustParse(running))
	testfactory.TaskRunning(t, db, running)
	ghost := uuid.Must(uuid.NewV7()).String()
	if err := h.app.Scheduler().AddRunning(ctx, "jr", ghost); err != nil {
		t.Fatal(err)
	}
	h.app.Redis().Set(ctx, h.app.Keys().SlotsInflight(), 5, time.Hour) // drifted pool counter

	startJanitor(t, e)
	want := []string{lost, running}
	slices.Sort(want)
	eventually(t, 10*time.Second, "leases of the live tasks only", func() bool {
		sess, _, _ := h.app.Quotas().Leases(ctx, "jr")
		slices.Sort(sess)
		return slices.Equal(sess, want)
	})
	eventually(t, 10*time.Second, "the running task alone in the running set", func() bool {
		members, _ := h.app.Scheduler().RunningMembers(ctx, "jr")
		return slices.Equal(members, []string{running})
	})
	eventually(t, 10*time.Second, "the lost queued task back on its queue", func() bool {
		return h.app.Redis().ZScore(ctx, h.app.Keys().TenantQueue("jr"), lost).Err() == nil
	})
	eventually(t, 10*time.Second, "the pool counter recounted", func() bool {
		n, _ := h.app.Redis().Get(ctx, h.app.Keys().SlotsInflight()).Int()
		return n == 0
	})
}

// After Redis lost everything, the janitor leader notices at once (its generation
// marker is gone too) and the queued backlog comes back in admission order.
func TestJanitorRepushesInOrderAfterRedisDataLoss(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.start(t, apiOnly)
	ctx := context.Background()
	c, _ := h.tenantClient("jo", "pro", nil)
	var ids []string
	for i := range 6 {
		task, err := c.SubmitTask(ctx, client.SubmitTaskRequest{Agent: "sim", Input: map[string]int{"steps": 1, "step_ms": i + 1}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, task.ID)
	}
	j := e.start(t, func(o *agentq.Options) {
		o.Config.Roles = []string{config.RoleJanitor}
		o.Config.JanitorInterval = time.Hour // only the generation check repairs
	})
	eventually(t, 10*time.Second, "a janitor leader", j.app.JanitorLeads)
	testenv.DeletePrefix(ctx, h.app.Redis(), h.app.Keys().Prefix())
	eventually(t, 10*time.Second, "the backlog back in admission order", func() bool {
		got, _ := h.app.Redis().ZRange(ctx, h.app.Keys().TenantQueue("jo"), 0, -1).Result()
		return slices.Equal(got, ids)
	})
	// (The queue can come back before the leases: a repair that was under way when
	// Redis lost its data re-pushes first, and the next check repairs again.)
	eventually(t, 10*time.Second, "the 6 queued tasks' leases back", func() bool {
		sess, _, _ := h.app.Quotas().Leases(ctx, "jo")
		return len(sess) == 6
	})
}

// Of two janitor processes one leads; when it stops, the other takes over.
func TestJanitorLeaderFailover(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	janitorOnly := func(o *agentq.Options) {
		o.Config.Roles = []string{config.RoleJanitor}
		o.Config.JanitorInterval = time.Hour
	}
	a := e.start(t, janitorOnly)
	b := e.start(t, janitorOnly)
	eventually(t, 5*time.Second, "one leader", func() bool { return a.app.JanitorLeads() != b.app.JanitorLeads() })
	first, second := a, b
	if b.app.JanitorLeads() {
		first, second = b, a
	}
	first.stop()
	if first.app.JanitorLeads() {
		t.Fatal("a stopped janitor still says it leads")
	}
	eventually(t, 5*time.Second, "the other process takes over", second.app.JanitorLeads)
}

func schemaOf(t *testing.T, e *env) string {
	var s string
	if err := e.pool.QueryRow(context.Background(), `SELECT current_schema()`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// A Postgres connection loss under load (every session of the process terminated,
// as a restart does) loses no task: workers hold results and retry, requests see 503s
// at worst, and everything completes.
func TestPostgresConnectionLossDuringLoad(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.start(t)
	ctx := context.Background()
	c, _ := h.tenantClient("pg", "pro", nil)
	var ids []string
	for range 20 {
		task, err := c.SubmitTask(ctx, sim(4, 50))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, task.ID)
	}
	time.Sleep(150 * time.Millisecond)
	schema := schemaOf(t, e)
	admin, err := pgConnect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for range 3 {
		if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, "agentq:"+schema); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, id := range ids {
		if got := waitTerminal(t, c, id, 60*time.Second); got.State != "completed" {
			t.Fatalf("task %s ended %s (%s)", id, got.State, deref(got.Error))
		}
	}
}

func waitTerminal(t *testing.T, c *client.Client, id string, within time.Duration) *client.Task {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		task, err := c.GetTask(context.Background(), id)
		if err == nil && task.Terminal() {
			return task
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s not terminal after %v (%v, %v)", id, within, task, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A task dispatched to asynq and never started, whose message asynq lost (a data
// loss, or archived after its retries), is freed and queued again.
func TestJanitorRescuesTasksLostToAsynq(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.start(t, apiOnly)
	ctx := context.Background()
	c, _ := h.tenantClient("ja", "pro", nil)
	task, err := c.SubmitTask(ctx, sim(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.app.Scheduler().Heartbeat(ctx, "fake-worker", 4, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := h.app.Scheduler().Take(ctx); err != nil { // dispatched; asynq never got it
		t.Fatal(err)
	}
	inflight := h.app.Keys().Inflight(0)
	h.app.Redis().ZAdd(ctx, inflight, redis.Z{Score: float64(time.Now().Add(-time.Minute).UnixMilli()), Member: task.ID})
	startJanitor(t, e)
	eventually(t, 10*time.Second, "the stranded task back in its queue", func() bool {
		return h.app.Redis().ZScore(ctx, h.app.Keys().TenantQueue("ja"), task.ID).Err() == nil
	})
	if members, _ := h.app.Scheduler().RunningMembers(ctx, "ja"); len(members) != 0 {
		t.Fatalf("running set still holds %v", members)
	}
	eventually(t, 10*time.Second, "the pool counter back to 0", func() bool {
		n, _ := h.app.Redis().Get(ctx, h.app.Keys().SlotsInflight()).Int()
		return n == 0
	})
}

// A first start on an empty Redis is logged as such, at info; a later loss of Redis's
// data is a warning.
func TestJanitorFirstStartIsNotDataLoss(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	h := start(t, func(o *agentq.Options) {
		o.Config.Roles = []string{config.RoleAPI, config.RoleJanitor}
		o.Config.JanitorInterval = time.Hour
		o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	ctx := context.Background()
	waitLog := func(what string) string {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, what) {
					return line
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no log line %q in:\n%s", what, logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	first := waitLog("generation marker written")
	if !strings.Contains(first, "level=INFO") || !strings.Contains(first, "first start") {
		t.Fatalf("first start logged as %q", first)
	}
	if strings.Contains(logs.String(), "Redis lost its data") {
		t.Fatalf("a first start was logged as data loss:\n%s", logs.String())
	}
	c, _ := h.tenantClient("jf", "pro", nil)
	if _, err := c.SubmitTask(ctx, sim(1, 1)); err != nil {
		t.Fatal(err)
	}
	testenv.DeletePrefix(ctx, h.app.Redis(), h.app.Keys().Prefix())
	if loss := waitLog("Redis lost its data"); !strings.Contains(loss, "level=WARN") {
		t.Fatalf("data loss logged as %q", loss)
	}
}
