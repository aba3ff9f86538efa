package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/internal/wire"
)

func (f *fixture) advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.clock += d.Milliseconds()
}

func payloadOf(d Dispatched) wire.Payload {
	return wire.Payload{TaskID: d.TaskID, TenantID: d.TenantID, Priority: d.Priority, EstimateMs: d.EstimateMs, Gen: d.Gen}
}

// park parks a dispatched task, created at the fixture's n-th admission, for wait.
func (f *fixture) park(d Dispatched, createdN int, wait time.Duration) {
	f.t.Helper()
	err := f.s.Park(context.Background(), ParkParams{Payload: payloadOf(d), Took: 20 * time.Millisecond, Wait: wait,
		Priority: d.Priority, CreatedAt: f.base.Add(time.Duration(createdN) * time.Millisecond)})
	if err != nil {
		f.t.Fatal(err)
	}
}

func TestParkFreesTheSlotsAndKeepsThePlace(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1, 0)
	ctx := context.Background()
	first := f.enqueue("a", 5, 1, 1)
	second := f.enqueue("a", 5, 1, 1)
	d := f.mustDispatch()
	if d.TaskID != first.String() || d.Gen != 0 {
		t.Fatalf("dispatched %+v, want the first task, never parked", d)
	}
	f.park(d, 1, 100*time.Millisecond)

	// Its running slot and the worker slot are free: the second task goes at once,
	// although the tenant's cap is 1 and the pool has one slot.
	if parked, err := f.s.IsParked(ctx, "a", first.String()); err != nil || !parked {
		t.Fatalf("IsParked = %v, %v; want true", parked, err)
	}
	if n := f.rdb.SCard(ctx, f.keys.TenantRunning("a")).Val(); n != 0 {
		t.Fatalf("running set holds %d tasks after the park, want 0", n)
	}
	d2 := f.mustDispatch()
	if d2.TaskID != second.String() {
		t.Fatalf("dispatched %s, want the second task", d2.TaskID)
	}
	f.done(d2)

	// Not due yet: nothing moves, and the next one is due in the rest of the wait.
	n, next, err := f.s.Unpark(ctx)
	if err != nil || n != 0 || next != 100*time.Millisecond {
		t.Fatalf("Unpark before due = %d, %v, %v; want 0, 100ms", n, next, err)
	}
	f.advance(100 * time.Millisecond)
	later := f.enqueue("a", 5, 1, 1)
	n, next, err = f.s.Unpark(ctx)
	if err != nil || n != 1 || next != -1 {
		t.Fatalf("Unpark when due = %d, %v, %v; want 1, -1", n, next, err)
	}
	// Back at its place: ahead of a task admitted after it.
	d3 := f.mustDispatch()
	if d3.TaskID != first.String() || d3.Gen != 1 {
		t.Fatalf("dispatched %+v, want the parked task again, its first re-dispatch", d3)
	}
	task, err := NewAsynqTask(f.keys, d3)
	if err != nil {
		t.Fatal(err)
	}
	var p wire.Payload
	if err := json.Unmarshal(task.Payload(), &p); err != nil || p.Gen != 1 || p.TaskID != first.String() {
		t.Fatalf("payload %+v, %v; want the task id and gen 1", p, err)
	}
	f.doneTook(d3, 10*time.Millisecond)
	if g := f.rdb.HExists(ctx, f.keys.TenantConf("a"), "g:"+first.String()).Val(); g {
		t.Fatal("the park count outlived the task's end")
	}
	if d4 := f.mustDispatch(); d4.TaskID != later.String() {
		t.Fatalf("dispatched %s, want the later task", d4.TaskID)
	}
}

func TestParkedTasksAreNotMissingAndCancelTakesThem(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2, 0)
	ctx := context.Background()
	id := f.enqueue("a", 5, 1, 0)
	d := f.mustDispatch()
	f.park(d, 1, time.Minute)
	missing, err := f.s.Missing(ctx, []Queued{{TenantID: "a", TaskID: id}, {TenantID: "a", TaskID: uuid.Must(uuid.NewV7())}})
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) != 1 || missing[0].TaskID == id {
		t.Fatalf("Missing = %v; want only the task Redis never had", missing)
	}
	removed, err := f.s.Remove(ctx, "a", id)
	if err != nil || !removed {
		t.Fatalf("Remove = %v, %v; want true", removed, err)
	}
	if parked, _ := f.s.IsParked(ctx, "a", id.String()); parked {
		t.Fatal("still parked after Remove")
	}
	for _, field := range []string{"pq:", "g:"} {
		if f.rdb.HExists(ctx, f.keys.TenantConf("a"), field+id.String()).Val() {
			t.Fatalf("conf field %s outlived the cancel", field)
		}
	}
	f.advance(2 * time.Minute)
	if n, _, err := f.s.Unpark(ctx); err != nil || n != 0 {
		t.Fatalf("Unpark after cancel = %d, %v; want 0", n, err)
	}
	if _, err := f.dispatch(); err == nil {
		t.Fatal("a cancelled parked task was dispatched")
	}
}

// With several shards, one Unpark reads every shard's parked set and queues the due
// tasks of each, and says when the earliest of the others is due.
func TestUnparkAcrossShards(t *testing.T) {
	t.Parallel()
	f := newShardedFixture(t, 8, 0, 4)
	ctx := context.Background()
	tenants := []string{}
	for i := 0; len(tenants) < 3; i++ {
		name := fmt.Sprintf("t%d", i)
		if slices.IndexFunc(tenants, func(o string) bool { return f.keys.Shard(o) == f.keys.Shard(name) }) < 0 {
			tenants = append(tenants, name)
		}
	}
	for i, tn := range tenants {
		f.enqueue(tn, 5, 1, 0)
		shard := f.keys.Shard(tn)
		d, err := f.s.dispatchOne(ctx, shard, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.park(d, f.n, time.Duration(i+1)*100*time.Millisecond)
	}
	f.advance(200 * time.Millisecond)
	n, next, err := f.s.Unpark(ctx)
	if err != nil || n != 2 || next != 100*time.Millisecond {
		t.Fatalf("Unpark = %d, %v, %v; want the two due tasks of two shards, the third due in 100ms", n, next, err)
	}
	for _, tn := range tenants[:2] {
		if q := f.rdb.ZCard(ctx, f.keys.TenantQueue(tn)).Val(); q != 1 {
			t.Fatalf("tenant %s has %d queued, want its task back", tn, q)
		}
	}
}

func TestParkedMessageRoundTrip(t *testing.T) {
	t.Parallel()
	due := time.UnixMilli(1_800_000_000_123)
	if got, ok := parkedDueOf(parkedMessage(due)); !ok || !got.Equal(due) {
		t.Fatalf("parkedDueOf(parkedMessage) = %v, %v", got, ok)
	}
	for _, m := range []string{"1", "", "p", "px"} {
		if _, ok := parkedDueOf(m); ok {
			t.Fatalf("parkedDueOf(%q) read a due time", m)
		}
	}
}

// A task parked by a process with no dispatcher (a worker-only process) is queued
// again when it is due by the dispatcher of another process, which learns the due
// time from the park's message rather than at its next poll of the parked sets.
func TestParkInAnotherProcessIsUnparkedWhenDue(t *testing.T) {
	t.Parallel()
	rdb, keys := testenv.Redis(t, 1)
	ctx := context.Background()
	here := New(rdb, keys, Options{WakeInProcess: true})
	worker := New(rdb, keys, Options{}) // a worker-only process
	if err := here.Heartbeat(ctx, "w1", 4, time.Minute); err != nil {
		t.Fatal(err)
	}
	enq := &recordingEnqueuer{}
	// a fallback far longer than the test: only the park's message can time the round
	d := NewDispatcher(here, rdb, enq, DispatcherOptions{FallbackEvery: time.Minute})
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	id := uuid.Must(uuid.NewV7())
	created := time.Now()
	if err := here.Enqueue(ctx, EnqueueParams{TenantID: "a", TaskID: id, Priority: 5, CreatedAt: created, Weight: 1}); err != nil {
		t.Fatal(err)
	}
	waitFor := func(what string, n int) {
		t.Helper()
		for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			enq.mu.Lock()
			got := len(enq.tasks)
			enq.mu.Unlock()
			if got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d dispatches, want %d", what, got, n)
			}
		}
	}
	waitFor("first dispatch", 1)
	time.Sleep(50 * time.Millisecond) // past the dispatcher's last read of the parked sets
	p := wire.Payload{TaskID: id.String(), TenantID: "a", Priority: 5, EstimateMs: DefaultEstimateMs}
	parkedAt := time.Now()
	if err := worker.Park(ctx, ParkParams{Payload: p, Took: time.Millisecond, Wait: 400 * time.Millisecond, Priority: 5, CreatedAt: created}); err != nil {
		t.Fatal(err)
	}
	waitFor("dispatch after the wait", 2)
	if took := time.Since(parkedAt); took < 400*time.Millisecond || took > 2*time.Second {
		t.Fatalf("dispatched again %v after the park; want soon after its 400 ms wait", took)
	}
}

// noteDuringHook calls note once, right after the first pipeline that reads the
// parked sets has been answered: a park noted while a dispatcher's read of them is
// under way.
type noteDuringHook struct {
	once sync.Once
	note func()
}

func (h *noteDuringHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *noteDuringHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *noteDuringHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if args := c.Args(); len(args) > 3 && strings.HasSuffix(fmt.Sprint(args[3]), ":parked") {
				h.once.Do(h.note)
				break
			}
		}
		return err
	}
}

// A park noted while the dispatcher reads the parked sets is not lost when the read
// answers (nothing else parked): the dispatcher only lowers a noted due time.
func TestDispatcherKeepsADueNotedDuringItsRead(t *testing.T) {
	t.Parallel()
	rdb, keys := testenv.Redis(t, 1)
	s := New(rdb, keys, Options{WakeInProcess: true})
	d := NewDispatcher(s, rdb, &recordingEnqueuer{}, DispatcherOptions{FallbackEvery: time.Minute})
	due := time.Now().Add(300 * time.Millisecond)
	rdb.AddHook(&noteDuringHook{note: func() { d.parkedDue(due) }})
	if err := d.unparkDue(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.parkMu.Lock()
	defer d.parkMu.Unlock()
	if !d.nextDue.Equal(due) {
		t.Fatalf("next due %v after the read, want the park noted during it, %v", d.nextDue, due)
	}
}
