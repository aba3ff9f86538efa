package maintenance

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/tasks/change"
	"github.com/agentq/agentq/internal/testenv/testfactory"
)

// staleRunning is a dispatched task running under attempt whose heartbeat is age old.
func (f *fixture) staleRunning(tenant string, attempt int, age time.Duration) uuid.UUID {
	f.t.Helper()
	id := f.submit(tenant)
	if _, err := f.sched.Remove(f.ctx, tenant, id); err != nil { // dispatched
		f.t.Fatal(err)
	}
	testfactory.TaskRunningAs(f.t, f.Pool, id, testfactory.Running{Attempt: attempt, Steps: 1, HeartbeatAge: age})
	return id
}

// A running task whose heartbeat went stale goes back to its queue while it has
// attempts left and is abandoned (its lease released) once it has none; a task with a
// fresh heartbeat is left alone.
func TestStaleTasksRequeuesOrAbandons(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("s")
	retry, dead, alive := f.staleRunning("s", 1, time.Minute), f.staleRunning("s", 3, time.Minute), f.staleRunning("s", 1, 2*time.Second)

	p := NewStaleTasks(f.Deps, NewElector(f.Deps, ElectorConfig{}), StaleTasksConfig{})
	res, err := p.runOnce(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Requeued != 1 || res.Abandoned != 1 || res.Deferred || !res.Stats.Done || res.Stats.Rows != 2 {
		t.Fatalf("result %+v, want 1 re-queued and 1 abandoned of 2 stale", res)
	}
	if st := f.state(retry); st != "queued" || !f.queued("s", retry) {
		t.Fatalf("the stale task with attempts left: %s, on its queue %v", st, f.queued("s", retry))
	}
	var steps int
	if err := f.Pool.QueryRow(f.ctx, `SELECT steps FROM tasks WHERE id = $1`, retry).Scan(&steps); err != nil || steps != 1 {
		t.Fatalf("the re-queued task's steps: %d, %v; want its step kept", steps, err)
	}
	if st := f.state(dead); st != "abandoned" {
		t.Fatalf("the stale task out of attempts: %s", st)
	}
	if st := f.state(alive); st != "running" {
		t.Fatalf("a task with a fresh heartbeat was touched: %s", st)
	}
	if sess, _, _ := f.q.Leases(f.ctx, "s"); slices.Contains(sess, dead.String()) {
		t.Fatal("the abandoned task still holds its lease")
	}
	if res, err := p.runOnce(f.ctx); err != nil || res.Requeued+res.Abandoned != 0 {
		t.Fatalf("a second run: %+v, %v", res, err)
	}
}

// A process that has just taken the lead leaves stale tasks alone for one staleness
// period: after a Postgres outage the live workers must stamp their heartbeats first.
func TestStaleTasksWaitAfterANewLeaderIsElected(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("s")
	id := f.submit("s")
	testfactory.TaskRunningAs(t, f.Pool, id, testfactory.Running{HeartbeatAge: time.Minute})
	e := newElector(t, f)
	e.TestSignals.Elected.WaitOrTimeout()
	p := NewStaleTasks(f.Deps, e, StaleTasksConfig{})
	res, err := p.runOnce(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Deferred || !res.Stats.Done || res.Requeued != 0 || f.state(id) != "running" {
		t.Fatalf("a new leader's run: %+v, task %s; want it deferred", res, f.state(id))
	}
}

// The pass's re-queue and abandonment are the task lifecycle's state changes: each
// reaches the lifecycle's after-change step inside its transaction, and a failure
// there rolls the change back and leaves Redis as it was (lease held, not queued).
func TestStaleTasksChangeStateThroughTheLifecycle(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("s")
	retry, dead := f.staleRunning("s", 1, time.Minute), f.staleRunning("s", 3, time.Minute)

	errHook := errors.New("the change's transaction fails after the change")
	var mu sync.Mutex
	var fail bool
	var changes []tasks.Change
	f.Lifecycle = tasks.NewLifecycle(store.New(f.Pool), tasks.LifecycleOptions{
		Subscribers: []tasks.Subscriber{change.Funcs{Tx: func(ctx context.Context, tx *store.Store, c tasks.Change) error {
			mu.Lock()
			defer mu.Unlock()
			if fail {
				return errHook
			}
			changes = append(changes, c)
			return nil
		}}},
	})
	p := NewStaleTasks(f.Deps, NewElector(f.Deps, ElectorConfig{}), StaleTasksConfig{})

	mu.Lock()
	fail = true
	mu.Unlock()
	if _, err := p.runOnce(f.ctx); !errors.Is(err, errHook) {
		t.Fatalf("a run whose changes fail: %v, want the hook's error", err)
	}
	for _, id := range []uuid.UUID{retry, dead} {
		if st := f.state(id); st != "running" || f.queued("s", id) {
			t.Fatalf("a rolled-back change left the task %s, on its queue %v", st, f.queued("s", id))
		}
	}
	if sess, _, _ := f.q.Leases(f.ctx, "s"); !slices.Contains(sess, dead.String()) {
		t.Fatal("a rolled-back abandonment released the task's lease")
	}

	mu.Lock()
	fail = false
	mu.Unlock()
	res, err := p.runOnce(f.ctx)
	if err != nil || res.Requeued != 1 || res.Abandoned != 1 {
		t.Fatalf("run: %+v, %v", res, err)
	}
	mu.Lock()
	defer mu.Unlock()
	got := map[uuid.UUID]tasks.ChangeKind{}
	for _, c := range changes {
		got[c.Task.ID] = c.Kind
	}
	if len(changes) != 2 || got[retry] != tasks.ChangeRequeued || got[dead] != tasks.ChangeAbandoned {
		t.Fatalf("changes %+v, want the re-queue of %s and the abandonment of %s", changes, retry, dead)
	}
}
