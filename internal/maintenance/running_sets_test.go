package maintenance

import (
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/testenv/testfactory"
)

// The running-set pass re-adds a running task missing from its tenant's set, frees the
// entry of a task Postgres does not know, and frees and re-queues a dispatched task
// asynq lost before starting it.
func TestRunningSetsFixesEntriesAndStrandedTasks(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("r")
	running := f.submit("r")
	if _, err := f.sched.Remove(f.ctx, "r", running); err != nil {
		t.Fatal(err)
	}
	testfactory.TaskRunning(t, f.Pool, running)
	ghost := uuid.Must(uuid.NewV7()).String()
	if err := f.sched.AddRunning(f.ctx, "r", ghost); err != nil {
		t.Fatal(err)
	}
	p := NewRunningSets(f.Deps, NewElector(f.Deps, ElectorConfig{}), RunningSetsConfig{})
	res, err := p.runOnce(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Added != 1 || res.Removed != 1 || res.Stranded != 0 || !res.Stats.Done {
		t.Fatalf("result %+v, want 1 entry re-added and 1 removed", res)
	}
	if members, _ := f.sched.RunningMembers(f.ctx, "r"); !slices.Equal(members, []string{running.String()}) {
		t.Fatalf("running set %v, want the running task only", members)
	}

	// Dispatched a minute ago; asynq never got it.
	stranded := f.submit("r")
	if err := f.sched.Heartbeat(f.ctx, "fake-worker", 4, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := f.sched.Take(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.Redis.ZAdd(f.ctx, f.Keys.Inflight(0), redis.Z{Score: float64(time.Now().Add(-time.Minute).UnixMilli()), Member: stranded.String()})
	if res, err = p.runOnce(f.ctx); err != nil {
		t.Fatal(err)
	}
	if res.Stranded != 1 || res.Removed+res.Added != 0 {
		t.Fatalf("result %+v, want the stranded task re-queued", res)
	}
	if !f.queued("r", stranded) {
		t.Fatal("the stranded task is not back in its queue")
	}
	if members, _ := f.sched.RunningMembers(f.ctx, "r"); slices.Contains(members, stranded.String()) {
		t.Fatalf("running set still holds the stranded task: %v", members)
	}
}

// A task admitted and dispatched after the pass read a page's live tasks keeps its
// slot: the pass re-checks Postgres before dropping an entry.
func TestRunningSetsKeepTheSlotOfATaskDispatchedAfterTheSnapshot(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("d")
	f.submit("d") // the tenant has a live task
	snapshot, err := f.Store.UnscopedLiveTasksOf(f.ctx, []string{"d"})
	if err != nil {
		t.Fatal(err)
	}
	// admitted and dispatched by another replica meanwhile
	late := f.task("d")
	if err := f.sched.AddRunning(f.ctx, "d", late.String()); err != nil {
		t.Fatal(err)
	}
	p := NewRunningSets(f.Deps, NewElector(f.Deps, ElectorConfig{}), RunningSetsConfig{})
	var res RunningSetsResult
	if err := p.review(f.ctx, []string{"d"}, snapshot, &res); err != nil {
		t.Fatal(err)
	}
	members, _ := f.sched.RunningMembers(f.ctx, "d")
	if res.Removed != 0 || !slices.Contains(members, late.String()) {
		t.Fatalf("running set %v, %d removed: the task dispatched after the snapshot lost its slot", members, res.Removed)
	}
}

// A paused task holds no dispatch slot: the running-set pass frees the entry a paused
// task kept (its worker died between the pause and the release) as it does an ended
// task's, and names the task's next dispatch anew.
func TestRunningSetsFreeAPausedTasksSlot(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("p")
	paused := f.submit("p")
	if _, err := f.sched.Remove(f.ctx, "p", paused); err != nil {
		t.Fatal(err)
	}
	testfactory.TaskInState(t, f.Pool, paused, "paused")
	if err := f.sched.AddRunning(f.ctx, "p", paused.String()); err != nil {
		t.Fatal(err)
	}
	p := NewRunningSets(f.Deps, NewElector(f.Deps, ElectorConfig{}), RunningSetsConfig{})
	res, err := p.runOnce(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if members, _ := f.sched.RunningMembers(f.ctx, "p"); res.Removed != 1 || len(members) != 0 {
		t.Fatalf("result %+v, running set %v; want the paused task's entry freed", res, members)
	}
	if g, _ := f.Redis.HGet(f.ctx, f.Keys.TenantConf("p"), "g:"+paused.String()).Int(); g != 1 {
		t.Fatalf("generation %d after the pass, want 1: the next dispatch is a new asynq message", g)
	}
}
