package agentq_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/maintenance"
	"github.com/agentq/agentq/internal/testenv"
)

// apiOnly runs no dispatcher, worker or janitor: the test drives the janitor itself.
func apiOnly(o *agentq.Options) { o.Config.Roles = []string{config.RoleAPI} }

func TestJanitorReconcilesEachKind(t *testing.T) {
	t.Parallel()
	h := start(t, apiOnly)
	ctx := context.Background()
	c, _ := h.tenantClient("jr", "pro", nil)
	db := h.app.Store.Pool()
	sub := func() string {
		task, err := c.SubmitTask(ctx, sim(1, 1))
		if err != nil {
			t.Fatal(err)
		}
		return task.ID
	}
	// 1. a lease of a task that ended while its release was lost
	ended := sub()
	if _, err := db.Exec(ctx, `UPDATE tasks SET state = 'completed', finished_at = now() WHERE id = $1`, ended); err != nil {
		t.Fatal(err)
	}
	// 2. a queued task whose lease and queue entry Redis lost
	lost := sub()
	h.app.Quotas.Release(ctx, "jr", lost)
	h.app.Scheduler.Remove(ctx, "jr", uuid.MustParse(lost))
	// 3. a running task missing from the running set; 4. a running-set entry of an
	// ended task holding a pool slot
	running := sub()
	h.app.Scheduler.Remove(ctx, "jr", uuid.MustParse(running))
	if _, err := db.Exec(ctx, `UPDATE tasks SET state = 'running', started_at = now(), heartbeat_at = now(), attempt = 1 WHERE id = $1`, running); err != nil {
		t.Fatal(err)
	}
	ghost := uuid.Must(uuid.NewV7()).String()
	if err := h.app.Scheduler.AddRunning(ctx, "jr", ghost); err != nil {
		t.Fatal(err)
	}
	h.app.Redis.Set(ctx, h.app.Keys.PoolInflight(), 5, time.Hour) // drifted pool counter

	rep, err := h.app.Janitor().RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.LeasesReleased != 1 || rep.LeasesAdded != 1 || rep.RunningAdded != 1 || rep.RunningRemoved != 1 || rep.Repushed != 1 || rep.PoolCorrected != -5 {
		t.Fatalf("report %+v, want 1 lease released, 1 added, 1 running added, 1 removed, 1 re-pushed, pool -5", rep)
	}
	sess, _, _ := h.app.Quotas.Leases(ctx, "jr")
	slices.Sort(sess)
	want := []string{lost, running}
	slices.Sort(want)
	if !slices.Equal(sess, want) {
		t.Fatalf("leases %v, want the live tasks %v", sess, want)
	}
	if members, _ := h.app.Scheduler.RunningMembers(ctx, "jr"); !slices.Equal(members, []string{running}) {
		t.Fatalf("running set %v", members)
	}
	if h.app.Redis.ZScore(ctx, h.app.Keys.TenantQueue("jr"), lost).Err() != nil {
		t.Fatal("the lost queued task was not pushed back")
	}
	// a second run finds nothing
	if rep, _ := h.app.Janitor().RunOnce(ctx); rep.LeasesReleased+rep.LeasesAdded+rep.RunningAdded+rep.RunningRemoved+rep.Repushed != 0 || rep.PoolCorrected != 0 {
		t.Fatalf("second run: %+v", rep)
	}
}

func TestJanitorRequeuesOrAbandonsTasksWithAStaleHeartbeat(t *testing.T) {
	t.Parallel()
	h := start(t, apiOnly)
	ctx := context.Background()
	c, _ := h.tenantClient("js", "pro", nil)
	db := h.app.Store.Pool()
	retry, _ := c.SubmitTask(ctx, sim(2, 1))
	dead, _ := c.SubmitTask(ctx, sim(2, 1))
	alive, _ := c.SubmitTask(ctx, sim(2, 1))
	for _, id := range []string{retry.ID, dead.ID, alive.ID} {
		h.app.Scheduler.Remove(ctx, "js", uuid.MustParse(id))
	}
	set := func(id string, attempt int, age string) {
		if _, err := db.Exec(ctx, `UPDATE tasks SET state = 'running', started_at = now(), attempt = $2, steps = 1,
			heartbeat_at = now() - $3::interval WHERE id = $1`, id, attempt, age); err != nil {
			t.Fatal(err)
		}
	}
	set(retry.ID, 1, "1 minute")
	set(dead.ID, 3, "1 minute")
	set(alive.ID, 1, "2 seconds")
	rep, err := h.app.Janitor().RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.StaleRequeued != 1 || rep.Abandoned != 1 {
		t.Fatalf("report %+v", rep)
	}
	got := func(id string) *client.Task { tk, _ := c.GetTask(ctx, id); return tk }
	if tk := got(retry.ID); tk.State != "queued" || tk.Usage.Steps != 1 {
		t.Fatalf("stale task with attempts left: %s, %d steps kept", tk.State, tk.Usage.Steps)
	}
	if h.app.Redis.ZScore(ctx, h.app.Keys.TenantQueue("js"), retry.ID).Err() != nil {
		t.Fatal("the re-queued task is not in its tenant's queue")
	}
	if tk := got(dead.ID); tk.State != "abandoned" || tk.FinishedAt == nil {
		t.Fatalf("stale task out of attempts: %s", tk.State)
	}
	if tk := got(alive.ID); tk.State != "running" {
		t.Fatalf("a task with a fresh heartbeat was touched: %s", tk.State)
	}
	sess, _, _ := h.app.Quotas.Leases(ctx, "js")
	if slices.Contains(sess, dead.ID) {
		t.Fatal("the abandoned task still holds its lease")
	}
}

// After Redis lost everything, the queued backlog comes back in admission order.
func TestJanitorRepushesInOrderAfterRedisDataLoss(t *testing.T) {
	t.Parallel()
	h := start(t, apiOnly)
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
	testenv.DeletePrefix(ctx, h.app.Redis, h.app.Keys.Prefix())
	rep, err := h.app.Janitor().RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Repushed != 6 || rep.LeasesAdded != 6 {
		t.Fatalf("report %+v, want 6 re-pushed with their leases", rep)
	}
	got, _ := h.app.Redis.ZRange(ctx, h.app.Keys.TenantQueue("jo"), 0, -1).Result()
	if !slices.Equal(got, ids) {
		t.Fatalf("queue after recovery %v, want admission order %v", got, ids)
	}
}

func TestJanitorLeaderFailover(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	janitorOnly := func(o *agentq.Options) {
		o.Config.Roles = []string{config.RoleJanitor}
		o.Config.JanitorInterval = time.Hour
	}
	a := e.start(t, janitorOnly)
	b := e.start(t, janitorOnly)
	leaders := func() (bool, bool) { return a.app.Janitor().Leader(), b.app.Janitor().Leader() }
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				la, lb := leaders()
				t.Fatalf("%s: leaders a=%v b=%v", what, la, lb)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("one leader", func() bool { la, lb := leaders(); return la != lb })
	first, second := a, b
	if b.app.Janitor().Leader() {
		first, second = b, a
	}
	// The leader's process dies: its loop stops where it is and its database session
	// ends, and with the session the lock. No unlock is sent.
	first.app.Janitor().TestHooks().Halt()
	if first.app.Janitor().Leader() {
		t.Fatal("a halted janitor still says it leads")
	}
	waitFor("the other replica takes over", func() bool { return second.app.Janitor().Leader() })
	// a run on the new leader works
	if _, err := second.app.Janitor().RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
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
	h := start(t, apiOnly)
	ctx := context.Background()
	c, _ := h.tenantClient("ja", "pro", nil)
	task, err := c.SubmitTask(ctx, sim(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.app.Scheduler.Heartbeat(ctx, "fake-worker", 4, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := h.app.Scheduler.Take(ctx); err != nil { // dispatched; asynq never got it
		t.Fatal(err)
	}
	inflight := h.app.Keys.Inflight(0)
	h.app.Redis.ZAdd(ctx, inflight, redis.Z{Score: float64(time.Now().Add(-time.Minute).UnixMilli()), Member: task.ID})
	rep, err := h.app.Janitor().RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Repushed != 1 {
		st, serr := h.app.Scheduler.Stranded(ctx, asynq.NewInspectorFromRedisClient(h.app.Redis), "ja", task.ID, 5, 30*time.Second)
		members, _ := h.app.Scheduler.RunningMembers(ctx, "ja")
		t.Fatalf("report %+v, want the stranded task re-pushed (stranded %v %v; running %v)", rep, st, serr, members)
	}
	if h.app.Redis.ZScore(ctx, h.app.Keys.TenantQueue("ja"), task.ID).Err() != nil {
		t.Fatal("the stranded task is not back in its queue")
	}
	if members, _ := h.app.Scheduler.RunningMembers(ctx, "ja"); len(members) != 0 {
		t.Fatalf("running set still holds %v", members)
	}
	if n, _ := h.app.Redis.Get(ctx, h.app.Keys.PoolInflight()).Int(); n != 0 {
		t.Fatalf("pool counter %d after the rescue, want 0", n)
	}
}

// With 20,000 tenants every pass runs in every run: the tenant passes resume from a
// cursor, each pass has its own budget, and the cursor covers every tenant.
func TestJanitorPassesAllRunWithManyTenants(t *testing.T) {
	t.Parallel()
	h := start(t, apiOnly)
	ctx := context.Background()
	db := h.app.Store.Pool()
	const tenants = 20000
	if _, err := db.Exec(ctx, `INSERT INTO tenants (id, name, plan)
		SELECT 'bulk' || lpad(g::text, 5, '0'), 'Bulk', 'free' FROM generate_series(1, $1) g`, tenants); err != nil {
		t.Fatal(err)
	}
	// The last tenant in id order holds the lease of a task that ended.
	last := fmt.Sprintf("bulk%05d", tenants)
	ended := uuid.Must(uuid.NewV7())
	if _, err := db.Exec(ctx, `INSERT INTO tasks (id, tenant_id, kid, agent, user_id, input, budget, request_hash, state, finished_at)
		VALUES ($1, $2, 'k', 'sim', '', '{}', '{}', '\x01', 'completed', now())`, ended, last); err != nil {
		t.Fatal(err)
	}
	if err := h.app.Quotas.AddLease(ctx, last, ended.String(), false); err != nil {
		t.Fatal(err)
	}
	h.app.Janitor().TestHooks().SetConfig(maintenance.JanitorConfig{TenantBatch: 6000, TenantPage: 500, PassBudget: 20 * time.Second})
	passes := []string{"stale_heartbeats", "leases", "running_sets", "repush", "pool"}
	covered := map[string]int{}
	prevCursor := map[string]string{}
	released := 0
	began := time.Now()
	for run := 1; run <= 4; run++ {
		h.app.Redis.Set(ctx, h.app.Keys.PoolInflight(), 7, time.Hour) // drift for the pool pass to fix
		rep, err := h.app.Janitor().RunOnce(ctx)
		if err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		var names []string
		for _, p := range rep.Passes {
			names = append(names, p.Name)
			if p.Err != "" {
				t.Fatalf("run %d: pass %s failed: %s", run, p.Name, p.Err)
			}
		}
		if !slices.Equal(names, passes) {
			t.Fatalf("run %d ran passes %v, want %v", run, names, passes)
		}
		if rep.PoolCorrected != -7 {
			t.Fatalf("run %d: pool corrected by %d, want -7", run, rep.PoolCorrected)
		}
		for _, p := range rep.Passes[1:3] {
			covered[p.Name] += p.Rows
			if run < 4 {
				// Advanced by a batch, not done, and resuming past where the last run stopped.
				if p.Rows != 6000 || p.Done || p.Cursor <= prevCursor[p.Name] {
					t.Fatalf("run %d: %s pass %+v (previous cursor %q)", run, p.Name, p, prevCursor[p.Name])
				}
			} else if !p.Done || p.Cursor != "" {
				t.Fatalf("run %d: %s pass %+v, want it to reach the last tenant and wrap", run, p.Name, p)
			}
			prevCursor[p.Name] = p.Cursor
		}
		released += rep.LeasesReleased
		t.Logf("run %d: %+v", run, rep.Passes)
	}
	for _, name := range passes[1:3] {
		if covered[name] != tenants {
			t.Fatalf("%s pass reviewed %d tenants over the runs, want all %d", name, covered[name], tenants)
		}
	}
	if released != 1 {
		t.Fatalf("the last tenant's leaked lease: %d released, want 1", released)
	}
	if took := time.Since(began); took > 20*time.Second {
		t.Fatalf("four runs over %d tenants took %v", tenants, took)
	}

	// A pass out of budget stops where it is, and the passes after it still run.
	h.app.Janitor().TestHooks().SetConfig(maintenance.JanitorConfig{TenantBatch: 1 << 20, TenantPage: 50, PassBudget: 40 * time.Millisecond})
	h.app.Redis.Set(ctx, h.app.Keys.PoolInflight(), 3, time.Hour)
	rep, err := h.app.Janitor().RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lp := rep.Passes[1]; lp.Done || lp.Rows == 0 || lp.Rows >= tenants || lp.Cursor == "" {
		t.Fatalf("leases pass with a tiny budget: %+v, want stopped part way with a cursor", lp)
	}
	if rep.Passes[4].Err != "" || rep.PoolCorrected != -3 {
		t.Fatalf("pool pass after a pass ran out of budget: %+v, corrected %d", rep.Passes[4], rep.PoolCorrected)
	}
	next, err := h.app.Janitor().RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if next.Passes[1].Cursor <= rep.Passes[1].Cursor && !next.Passes[1].Done {
		t.Fatalf("the next run did not resume: cursor %q after %q", next.Passes[1].Cursor, rep.Passes[1].Cursor)
	}
}

// A task admitted and dispatched after the running-set pass read Postgres keeps its
// slot: the pass re-checks Postgres before dropping an entry.
func TestJanitorKeepsTheSlotOfATaskDispatchedAfterItsSnapshot(t *testing.T) {
	t.Parallel()
	h := start(t, apiOnly)
	ctx := context.Background()
	c, _ := h.tenantClient("jd", "pro", nil)
	if _, err := c.SubmitTask(ctx, sim(1, 1)); err != nil { // the tenant has a live task
		t.Fatal(err)
	}
	db := h.app.Store.Pool()
	late := uuid.Must(uuid.NewV7())
	var once sync.Once
	h.app.Janitor().TestHooks().AfterSnapshot(func(pass string) {
		if pass != "running_sets" {
			return
		}
		once.Do(func() {
			// admitted and dispatched by another replica meanwhile
			if _, err := db.Exec(ctx, `INSERT INTO tasks (id, tenant_id, kid, agent, user_id, input, budget, request_hash)
				VALUES ($1, 'jd', 'k', 'sim', '', '{}', '{}', '\x01')`, late); err != nil {
				t.Error(err)
			}
			if err := h.app.Scheduler.AddRunning(ctx, "jd", late.String()); err != nil {
				t.Error(err)
			}
		})
	})
	rep, err := h.app.Janitor().RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	members, _ := h.app.Scheduler.RunningMembers(ctx, "jd")
	if rep.RunningRemoved != 0 || !slices.Contains(members, late.String()) {
		t.Fatalf("running set %v, %d removed: the task dispatched after the snapshot lost its slot", members, rep.RunningRemoved)
	}
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
	testenv.DeletePrefix(ctx, h.app.Redis, h.app.Keys.Prefix())
	if loss := waitLog("Redis lost its data"); !strings.Contains(loss, "level=WARN") {
		t.Fatalf("data loss logged as %q", loss)
	}
}
