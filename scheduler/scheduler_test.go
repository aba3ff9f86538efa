package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/internal/wire"
)

type fixture struct {
	t     *testing.T
	rdb   *redis.Client
	keys  rkeys.Keys
	s     *Scheduler
	clock int64
	mu    sync.Mutex
	base  time.Time
	n     int
}

func newFixture(t *testing.T, slots, prefetch int) *fixture {
	return newShardedFixture(t, slots, prefetch, 1)
}

func newShardedFixture(t *testing.T, slots, prefetch, shards int) *fixture {
	rdb, keys := testenv.Redis(t, shards)
	f := &fixture{t: t, rdb: rdb, keys: keys, clock: 1_800_000_000_000, base: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	f.s = New(rdb, keys, Options{Prefetch: prefetch, NowMs: f.now, WakeInProcess: true})
	if slots > 0 {
		if err := f.s.Heartbeat(context.Background(), "w1", slots, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func (f *fixture) now() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.clock
}

// enqueue adds a task; each one is admitted 1 ms after the previous.
func (f *fixture) enqueue(tenant string, priority, weight, cap int) uuid.UUID {
	f.t.Helper()
	id := uuid.Must(uuid.NewV7())
	f.n++
	err := f.s.Enqueue(context.Background(), EnqueueParams{
		TenantID: tenant, TaskID: id, Priority: priority, CreatedAt: f.base.Add(time.Duration(f.n) * time.Millisecond),
		Weight: weight, RunningCap: cap,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return id
}

// dispatch is one dispatcher step on shard 0: take a worker slot, pop a task.
func (f *fixture) dispatch() (Dispatched, error) {
	ctx := context.Background()
	ok, err := f.s.reserve(ctx)
	if err != nil {
		return Dispatched{}, err
	}
	if !ok {
		return Dispatched{}, errNoCapacity
	}
	d, err := f.s.dispatchOne(ctx, 0, 0)
	if err != nil {
		_ = f.s.release(ctx)
	}
	return d, err
}

func (f *fixture) mustDispatch() Dispatched {
	f.t.Helper()
	d, err := f.dispatch()
	if err != nil {
		f.t.Fatalf("dispatch: %v", err)
	}
	if err := f.s.confirm(context.Background(), d); err != nil {
		f.t.Fatal(err)
	}
	return d
}

func (f *fixture) done(d Dispatched) { f.doneTook(d, -1) }

// doneTook completes a task that took took of worker time (-1: unknown).
func (f *fixture) doneTook(d Dispatched, took time.Duration) {
	f.t.Helper()
	p := wire.Payload{TaskID: d.TaskID, TenantID: d.TenantID, Priority: d.Priority, EstimateMs: d.EstimateMs}
	if err := f.s.Done(context.Background(), p, took); err != nil {
		f.t.Fatal(err)
	}
}

func TestQueueScoreOrdersPriorityThenTime(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name       string
		a, b       float64
		aFirstWant bool
	}{
		{"higher priority first", QueueScore(9, t0.Add(time.Hour)), QueueScore(5, t0), true},
		{"same priority, earlier first", QueueScore(5, t0), QueueScore(5, t0.Add(time.Millisecond)), true},
		{"lower priority later", QueueScore(0, t0), QueueScore(1, t0.Add(100*365*24*time.Hour)), false},
	}
	for _, c := range cases {
		if got := c.a < c.b; got != c.aFirstWant {
			t.Errorf("%s: a<b = %v, want %v", c.name, got, c.aFirstWant)
		}
	}
	if s := QueueScore(0, t0.Add(200*365*24*time.Hour)); s >= 1<<53 {
		t.Errorf("score %g leaves float64's exact range", s)
	}
}

// queue_backlog counts an admitted task in the tenant's admitted-not-yet-queued set
// until it is in its queue; the enqueue itself ends that count, in the same script, so
// a task is never counted twice nor, in between, not at all.
func TestEnqueueEndsTheAdmittedNotYetQueuedCount(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0, 0)
	ctx := context.Background()
	other := uuid.Must(uuid.NewV7()).String()
	pending := f.keys.PendingQueue("a")
	f.rdb.ZAdd(ctx, pending, redis.Z{Score: float64(f.clock + 60_000), Member: other})
	id := uuid.Must(uuid.NewV7())
	f.rdb.ZAdd(ctx, pending, redis.Z{Score: float64(f.clock + 60_000), Member: id.String()})
	f.n++
	if err := f.s.Enqueue(ctx, EnqueueParams{TenantID: "a", TaskID: id, Priority: 5, CreatedAt: f.base, Weight: 1}); err != nil {
		t.Fatal(err)
	}
	left, err := f.rdb.ZRange(ctx, pending, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0] != other {
		t.Fatalf("admitted-not-yet-queued after the enqueue: %v, want only the other task %s", left, other)
	}
	if _, err := f.rdb.ZScore(ctx, f.keys.TenantQueue("a"), id.String()).Result(); err != nil {
		t.Fatalf("the task is not in its queue: %v", err)
	}
}

// Calls riding along with a push go in its round trip; a rider's failed command is
// its own, not the push's.
func TestEnqueueCarriesCallsAlong(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0, 0)
	ctx := context.Background()
	wrong := f.keys.Prefix() + "along-wrong-type"
	f.rdb.Set(ctx, wrong, "x", 0)
	for _, tc := range []struct {
		name    string
		rider   func(pipe redis.Pipeliner) redis.Cmder
		wantErr bool
	}{
		{"answered", func(pipe redis.Pipeliner) redis.Cmder { return pipe.Set(ctx, f.keys.Prefix()+"along-ok", "1", 0) }, false},
		{"failed", func(pipe redis.Pipeliner) redis.Cmder { return pipe.ZRem(ctx, wrong, "m") }, true},
	} {
		id := uuid.Must(uuid.NewV7())
		var cmd redis.Cmder
		err := f.s.Enqueue(ctx, EnqueueParams{TenantID: "a", TaskID: id, Priority: 5, CreatedAt: f.base, Weight: 1},
			func(pipe redis.Pipeliner) { cmd = tc.rider(pipe) })
		if err != nil {
			t.Fatalf("%s: the push failed: %v", tc.name, err)
		}
		if cmd == nil || (cmd.Err() != nil) != tc.wantErr {
			t.Fatalf("%s: the rider's command %v, want an error: %v", tc.name, cmd, tc.wantErr)
		}
		if _, err := f.rdb.ZScore(ctx, f.keys.TenantQueue("a"), id.String()).Result(); err != nil {
			t.Fatalf("%s: the task is not in its queue: %v", tc.name, err)
		}
	}
}

func TestDispatchPriorityThenFIFOWithinTenant(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100, 0)
	low1 := f.enqueue("a", 1, 1, 0)
	hi := f.enqueue("a", 8, 1, 0)
	low2 := f.enqueue("a", 1, 1, 0)
	mid := f.enqueue("a", 5, 1, 0)
	want := []uuid.UUID{hi, mid, low1, low2}
	for i, w := range want {
		d := f.mustDispatch()
		if d.TaskID != w.String() {
			t.Fatalf("dispatch %d = %s, want %s", i, d.TaskID, w)
		}
	}
	if _, err := f.dispatch(); err != errEmpty {
		t.Fatalf("after draining: %v, want errEmpty", err)
	}
}

func TestDispatchWeightedShares(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1000, 0)
	for range 60 {
		f.enqueue("light", 5, 1, 0)
		f.enqueue("heavy", 5, 2, 0)
	}
	counts := map[string]int{}
	for range 30 {
		counts[f.mustDispatch().TenantID]++
	}
	if counts["light"] != 10 || counts["heavy"] != 20 {
		t.Fatalf("shares of 30 dispatches = %v, want light 10, heavy 20 (weights 1:2)", counts)
	}
}

func TestDispatchNoBankedCredit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1000, 0)
	for range 20 {
		f.enqueue("busy", 5, 1, 0)
	}
	for range 10 {
		if d := f.mustDispatch(); d.TenantID != "busy" {
			t.Fatalf("dispatched %s", d.TenantID)
		}
	}
	// "late" was idle while busy ran 10 tasks: it starts at the current virtual time
	// and shares from now on; it does not get 10 tasks in a row.
	for range 10 {
		f.enqueue("late", 5, 1, 0)
	}
	var order []string
	for range 6 {
		order = append(order, f.mustDispatch().TenantID)
	}
	late := 0
	for _, o := range order {
		if o == "late" {
			late++
		}
	}
	if late != 3 {
		t.Fatalf("after becoming backlogged, late got %d of the next 6 dispatches (%v), want 3", late, order)
	}
}

func TestDispatchRunningCap(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1000, 0)
	a1 := f.enqueue("capped", 5, 1, 1)
	f.enqueue("capped", 5, 1, 1)
	b := f.enqueue("free", 5, 1, 0)

	first := f.mustDispatch()
	if first.TaskID != a1.String() {
		t.Fatalf("first dispatch %s, want %s", first.TaskID, a1)
	}
	second := f.mustDispatch()
	if second.TaskID != b.String() {
		t.Fatalf("second dispatch %v, want the uncapped tenant's %s", second, b)
	}
	if _, err := f.dispatch(); err != errEmpty {
		t.Fatalf("capped tenant dispatched past its cap: %v", err)
	}
	if n := f.rdb.ZCard(context.Background(), f.keys.Capped(0)).Val(); n != 1 {
		t.Fatalf("capped set holds %d tenants, want 1", n)
	}
	f.done(first)
	if d := f.mustDispatch(); d.TenantID != "capped" {
		t.Fatalf("after completion, dispatch %v, want the capped tenant back", d)
	}
}

func TestDispatchBackpressure(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2, 1)
	for range 10 {
		f.enqueue("a", 5, 1, 0)
	}
	var got []Dispatched
	for {
		d, err := f.dispatch()
		if err == errNoCapacity {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := f.s.confirm(context.Background(), d); err != nil {
			t.Fatal(err)
		}
		got = append(got, d)
	}
	if len(got) != 3 {
		t.Fatalf("dispatched %d with 2 worker slots + prefetch 1, want 3", len(got))
	}
	f.done(got[0])
	if _, err := f.dispatch(); err != nil {
		t.Fatalf("after one completion: %v, want a dispatch", err)
	}
}

func TestDispatchNoWorkersNoDispatch(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0, 0)
	f.enqueue("a", 5, 1, 0)
	if _, err := f.dispatch(); err != errNoCapacity {
		t.Fatalf("with no live worker: %v, want errNoCapacity", err)
	}
	// A worker whose heartbeat expired counts for nothing.
	if err := f.s.Heartbeat(context.Background(), "old", 5, time.Second); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.clock += 2000
	f.mu.Unlock()
	if _, err := f.dispatch(); err != errNoCapacity {
		t.Fatalf("with an expired worker: %v, want errNoCapacity", err)
	}
}

func TestConcurrentDispatchersNeverDuplicate(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10000, 0)
	want := map[string]bool{}
	for i := range 400 {
		want[f.enqueue(fmt.Sprintf("t%d", i%7), i%10, 1+i%3, 0).String()] = true
	}
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				d, err := f.dispatch()
				if err == errEmpty {
					return
				}
				if err != nil && err != errBusy {
					t.Error(err)
					return
				}
				if err == nil {
					mu.Lock()
					seen[d.TaskID]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(seen) != len(want) {
		t.Fatalf("dispatched %d distinct tasks, want %d", len(seen), len(want))
	}
	for id, n := range seen {
		if n != 1 || !want[id] {
			t.Fatalf("task %s dispatched %d times (known: %v)", id, n, want[id])
		}
	}
}

// recordingEnqueuer stands in for asynq's client where a test needs to fail or count
// hand-offs; asynq itself is exercised end to end in the root package's tests.
type recordingEnqueuer struct {
	mu    sync.Mutex
	fail  bool
	tasks []string
}

func (r *recordingEnqueuer) EnqueueContext(_ context.Context, t *asynq.Task, _ ...asynq.Option) (*asynq.TaskInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail {
		return nil, fmt.Errorf("asynq unavailable")
	}
	r.tasks = append(r.tasks, string(t.Payload()))
	return &asynq.TaskInfo{}, nil
}

func TestDispatcherRecoversDispatchingSet(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100, 0)
	enq := &recordingEnqueuer{fail: true}
	d := NewDispatcher(f.s, f.rdb, enq, DispatcherOptions{ResendAfter: time.Second})
	f.enqueue("a", 5, 1, 0)
	if _, err := d.RunOnce(context.Background()); err == nil {
		t.Fatal("RunOnce succeeded though asynq failed")
	}
	ctx := context.Background()
	if n := f.rdb.ZCard(ctx, f.keys.Dispatching(0)).Val(); n != 1 {
		t.Fatalf("dispatching holds %d, want the popped task", n)
	}
	// asynq is back; the entry is not yet stale, so nothing is re-sent.
	enq.fail = false
	if _, err := d.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if len(enq.tasks) != 0 {
		t.Fatalf("re-sent a fresh dispatching entry")
	}
	f.mu.Lock()
	f.clock += 1500
	f.mu.Unlock()
	if _, err := d.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if len(enq.tasks) != 1 {
		t.Fatalf("re-sent %d tasks, want 1", len(enq.tasks))
	}
	if n := f.rdb.ZCard(ctx, f.keys.Dispatching(0)).Val(); n != 0 {
		t.Fatalf("dispatching still holds %d", n)
	}
	if n := f.rdb.ZCard(ctx, f.keys.Inflight(0)).Val(); n != 1 {
		t.Fatalf("inflight holds %d, want 1", n)
	}
}

func TestDoneIsIdempotentAndConfirmAfterDoneLeaksNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100, 0)
	f.enqueue("a", 5, 1, 0)
	d, err := f.dispatch()
	if err != nil {
		t.Fatal(err)
	}
	// The worker finishes before the dispatcher confirms.
	f.done(d)
	f.done(d)
	if err := f.s.confirm(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, key := range map[string]string{"inflight": f.keys.Inflight(0), "dispatching": f.keys.Dispatching(0)} {
		if n := f.rdb.ZCard(ctx, key).Val(); n != 0 {
			t.Errorf("%s holds %d after done", name, n)
		}
	}
	if n, _ := f.rdb.Get(ctx, f.keys.SlotsInflight()).Int(); n != 0 {
		t.Errorf("the pool counts %d tasks in flight after done, want 0 (released exactly once)", n)
	}
	// An idle tenant keeps only its conf (estimate, finish pass), and only with a TTL.
	if ttl := f.rdb.TTL(ctx, f.keys.TenantConf("a")).Val(); ttl <= 0 {
		t.Errorf("an idle tenant's conf has TTL %v, want one", ttl)
	}
	if n := f.rdb.Exists(ctx, f.keys.TenantQueue("a"), f.keys.TenantRunning("a")).Val(); n != 0 {
		t.Errorf("%d of an idle tenant's queue and running keys stayed", n)
	}
	if n := f.rdb.SCard(ctx, f.keys.TenantRunning("a")).Val(); n != 0 {
		t.Errorf("running set holds %d after done", n)
	}
}

// A task sent before the payload carried its priority as a number is still in asynq
// after an upgrade: its "band":"pN" payload must rebuild the dispatching member, or
// its dispatch slot stays taken when its worker ends it before the confirm.
// The release repeated after a task's end is recorded frees a running-set entry a
// janitor pass put back in between (with its tenant's cap), and otherwise changes
// nothing: the worker slot goes back once.
func TestDoneAgainFreesWhatTheJanitorPutBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100, 0)
	ctx := context.Background()
	f.enqueue("a", 5, 1, 1)
	f.enqueue("a", 5, 1, 1)
	d := f.mustDispatch()
	if _, err := f.dispatch(); !errors.Is(err, errEmpty) {
		t.Fatalf("a second dispatch under a cap of 1: %v, want none", err)
	}
	p := wire.Payload{TaskID: d.TaskID, TenantID: d.TenantID, Priority: d.Priority, EstimateMs: d.EstimateMs}
	f.done(d)
	if err := f.s.DoneAgain(ctx, p); err != nil {
		t.Fatal(err)
	}
	if n, _ := f.rdb.Get(ctx, f.keys.SlotsInflight()).Int(); n != 0 {
		t.Fatalf("the pool counts %d tasks in flight, want 0 (the task's slot released once)", n)
	}
	// The tenant's second task is dispatched; the first one is put back in the running
	// set, as a janitor pass that saw it running in Postgres does.
	d2 := f.mustDispatch()
	if err := f.s.AddRunning(ctx, "a", d.TaskID); err != nil {
		t.Fatal(err)
	}
	if err := f.s.DoneAgain(ctx, p); err != nil {
		t.Fatal(err)
	}
	if got := f.rdb.SMembers(ctx, f.keys.TenantRunning("a")).Val(); !slices.Equal(got, []string{d2.TaskID}) {
		t.Fatalf("running set %v, want only the second task", got)
	}
	if n, _ := f.rdb.Get(ctx, f.keys.SlotsInflight()).Int(); n != 1 {
		t.Fatalf("the pool counts %d tasks in flight, want 1 (the second task)", n)
	}
}

// The repeated release of a task its first release freed (nearly every task) costs
// one look at its running set in the round trip of the calls along, not a script call.
func TestDoneAgainOfAFreedTaskRunsNoScript(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100, 0)
	ctx := context.Background()
	f.enqueue("a", 5, 1, 1)
	d := f.mustDispatch()
	f.done(d)
	h := &sentCommands{}
	f.rdb.AddHook(h.hook())
	p := wire.Payload{TaskID: d.TaskID, TenantID: d.TenantID, Priority: d.Priority, EstimateMs: d.EstimateMs}
	along := func(pipe redis.Pipeliner) { pipe.Get(ctx, "along") }
	if err := f.s.DoneAgain(ctx, p, along); err != nil {
		t.Fatal(err)
	}
	if got := h.names(); !slices.Equal(got, []string{"sismember", "get"}) {
		t.Fatalf("DoneAgain sent %v, want [sismember get] in one round trip", got)
	}
}

// pipelineHook is a redis.Hook that hands each pipeline's commands to its func before
// they go out (the Batch's round trips); single commands, such as a dispatcher
// wake-up's PUBLISH, pass untouched.
type pipelineHook func(cmds []redis.Cmder)

func (pipelineHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (pipelineHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h pipelineHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h(cmds)
		return next(ctx, cmds)
	}
}

// sentCommands records the names of the commands a client sends in pipelines.
type sentCommands struct {
	mu   sync.Mutex
	sent []string
}

func (h *sentCommands) hook() pipelineHook {
	return func(cmds []redis.Cmder) {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, c := range cmds {
			h.sent = append(h.sent, c.Name())
		}
	}
}

func (h *sentCommands) names() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.sent)
}

func TestDoneWithLegacyBandPayloadFreesTheDispatchingEntry(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100, 0)
	f.enqueue("a", 8, 1, 0)
	d, err := f.dispatch()
	if err != nil {
		t.Fatal(err)
	}
	var p wire.Payload
	legacy := fmt.Sprintf(`{"task_id":%q,"tenant_id":%q,"band":"p%d","estimate_ms":%d}`, d.TaskID, d.TenantID, d.Priority, d.EstimateMs)
	if err := json.Unmarshal([]byte(legacy), &p); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := f.s.Done(ctx, p, -1); err != nil {
		t.Fatal(err)
	}
	if n := f.rdb.ZCard(ctx, f.keys.Dispatching(0)).Val(); n != 0 {
		t.Errorf("dispatching holds %d after done with %s", n, legacy)
	}
	if n, _ := f.rdb.Get(ctx, f.keys.SlotsInflight()).Int(); n != 0 {
		t.Errorf("the pool counts %d tasks in flight after done, want 0", n)
	}
}

func TestEveryKeyExpires(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100, 0)
	f.enqueue("a", 5, 1, 1)
	f.enqueue("a", 5, 1, 1)
	f.mustDispatch()
	ctx := context.Background()
	keys, err := f.rdb.Keys(ctx, f.keys.Prefix()+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) == 0 {
		t.Fatal("no keys")
	}
	for _, k := range keys {
		if ttl := f.rdb.TTL(ctx, k).Val(); ttl < 0 {
			// ready/capped/inflight/dispatching are bounded by the number of tenants and
			// worker slots; they empty as work drains.
			switch k {
			case f.keys.Ready(0), f.keys.Capped(0), f.keys.Inflight(0), f.keys.Dispatching(0), f.keys.SlotsInflight():
				continue
			}
			t.Errorf("key %s has no TTL", k)
		}
	}
}

func TestWorkerTimeCorrection(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1000, 0)
	for range 200 {
		f.enqueue("slow", 5, 1, 0)
		f.enqueue("fast", 5, 1, 0)
	}
	took := map[string]time.Duration{"slow": 300 * time.Millisecond, "fast": 100 * time.Millisecond}
	spent := map[string]time.Duration{}
	for range 120 {
		d := f.mustDispatch()
		spent[d.TenantID] += took[d.TenantID]
		f.doneTook(d, took[d.TenantID])
	}
	share := float64(spent["slow"]) / float64(spent["slow"]+spent["fast"])
	if share < 0.45 || share > 0.55 {
		t.Fatalf("equal weights, 3x longer tasks: slow tenant got %.2f of worker time (%v), want 0.5", share, spent)
	}
}

func TestConfigureAppliesToTheBacklog(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1000, 0)
	f.enqueue("a", 5, 1, 1)
	f.enqueue("a", 5, 1, 1)
	f.mustDispatch()
	if _, err := f.dispatch(); err != errEmpty {
		t.Fatalf("capped tenant dispatched: %v", err)
	}
	if err := f.s.Configure(context.Background(), "a", 1, 2); err != nil {
		t.Fatal(err)
	}
	if d := f.mustDispatch(); d.TenantID != "a" {
		t.Fatalf("raising the cap did not free the backlog: %v", d)
	}
}

func TestShardsShareOneVirtualTimeAndThePool(t *testing.T) {
	t.Parallel()
	f := newShardedFixture(t, 70, 0, 16)
	names := []string{"w1", "w2", "w4"}
	if a, b, c := f.keys.Shard(names[0]), f.keys.Shard(names[1]), f.keys.Shard(names[2]); a == b || b == c || a == c {
		t.Fatalf("the test's tenants share a shard (%d %d %d): pick other names", a, b, c)
	}
	for range 100 {
		f.enqueue("w1", 5, 1, 0)
		f.enqueue("w2", 5, 2, 0)
		f.enqueue("w4", 5, 4, 0)
	}
	enq := &recordingEnqueuer{}
	d := NewDispatcher(f.s, f.rdb, enq, DispatcherOptions{})
	n, err := d.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n != 70 {
		t.Fatalf("dispatched %d with a 70-slot pool across 16 shards, want 70", n)
	}
	counts := map[string]int{}
	for _, p := range enq.tasks {
		for _, name := range names {
			if strings.Contains(p, `"tenant_id":"`+name+`"`) {
				counts[name]++
			}
		}
	}
	if abs(counts["w1"]-10) > 1 || abs(counts["w2"]-20) > 1 || abs(counts["w4"]-40) > 1 {
		t.Fatalf("weights 1:2:4 over 16 shards dispatched %v, want about 10/20/40", counts)
	}
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

func TestWaitReason(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1, 0)
	ctx := context.Background()
	f.enqueue("a", 5, 1, 0)
	if r, _ := f.s.WaitReason(ctx, "a"); r != WaitBehindFairShare {
		t.Fatalf("with a free slot: %s", r)
	}
	f.mustDispatch()
	f.enqueue("a", 5, 1, 0)
	if r, _ := f.s.WaitReason(ctx, "a"); r != WaitNoWorkerCapacity {
		t.Fatalf("with the pool full: %s", r)
	}
	f.enqueue("c", 5, 1, 1)
	f.enqueue("c", 5, 1, 1)
	_ = f.s.Heartbeat(ctx, "w2", 10, time.Hour)
	f.mustDispatch() // a's second
	f.mustDispatch() // c's first; c is now at its cap
	if _, err := f.dispatch(); err != errEmpty {
		t.Fatalf("dispatch: %v", err)
	}
	if r, _ := f.s.WaitReason(ctx, "c"); r != WaitTenantRunningCap {
		t.Fatalf("at its cap: %s", r)
	}
}

// shallowRun dispatches 40 tasks while "deep" is backlogged and "shallow" keeps one
// task queued: it submits its next task right after each dispatch of the previous one
// (before or after that task completes), so every dispatch of it empties its queue.
func shallowRun(t *testing.T, resubmitAfterDone bool) (map[string]int, float64) {
	f := newFixture(t, 1000, 0)
	for range 60 {
		f.enqueue("deep", 5, 1, 0)
	}
	f.enqueue("shallow", 5, 1, 0)
	counts := map[string]int{}
	for range 40 {
		d := f.mustDispatch()
		counts[d.TenantID]++
		if d.TenantID == "shallow" && !resubmitAfterDone {
			f.enqueue("shallow", 5, 1, 0)
		}
		f.doneTook(d, 100*time.Millisecond)
		if d.TenantID == "shallow" && resubmitAfterDone {
			f.enqueue("shallow", 5, 1, 0)
		}
	}
	vt, _ := f.rdb.Get(context.Background(), f.keys.VirtualTime(0)).Float64()
	return counts, vt
}

func TestShallowTenantIsChargedLikeABackloggedOne(t *testing.T) {
	for _, after := range []bool{false, true} {
		t.Run(fmt.Sprintf("resubmit_after_done=%v", after), func(t *testing.T) {
			t.Parallel()
			counts, vt := shallowRun(t, after)
			if abs(counts["shallow"]-20) > 1 {
				t.Fatalf("equal weights: shallow tenant got %d of 40 dispatches (%v), want 20", counts["shallow"], counts)
			}
			// 40 tasks of 100 ms shared by two tenants of weight 1: the virtual time
			// reached about 20 × 100 ms.
			if vt < 1800 {
				t.Fatalf("virtual time %.0f after 40 dispatches, want about 1900", vt)
			}
		})
	}
}

func TestCompletionCorrectsAnIdleTenantsFinishPass(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1000, 0)
	ctx := context.Background()
	f.enqueue("a", 5, 2, 0)
	d := f.mustDispatch() // charged 100 ms ÷ 2: finish pass 50, and a's queue is empty
	f.doneTook(d, time.Second)
	// corrected by (1000 − 100) ÷ 2: finish pass 500
	f.enqueue("a", 5, 2, 0)
	pass, err := f.rdb.ZScore(ctx, f.keys.Ready(0), "a").Result()
	if err != nil {
		t.Fatal(err)
	}
	if pass != 500 {
		t.Fatalf("re-entered at pass %g, want its corrected finish pass 500", pass)
	}
}

func TestEstimateSurvivesAnIdlePeriod(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1000, 0)
	ctx := context.Background()
	f.enqueue("a", 5, 1, 0)
	f.doneTook(f.mustDispatch(), 500*time.Millisecond) // a is idle now
	if ttl := f.rdb.TTL(ctx, f.keys.TenantConf("a")).Val(); ttl <= 0 {
		t.Fatalf("an idle tenant's estimate is kept with a TTL; TTL = %v", ttl)
	}
	f.enqueue("a", 5, 1, 0)
	if d := f.mustDispatch(); d.EstimateMs != 500 {
		t.Fatalf("after an idle period the task was charged %d ms, want the tenant's estimate 500 (not the %d ms default)",
			d.EstimateMs, DefaultEstimateMs)
	}
}

func TestStrandedAgesByTheSchedulerClock(t *testing.T) {
	t.Parallel()
	// The fixture's clock stands for Redis TIME and is ahead of this host's clock.
	f := newFixture(t, 100, 0)
	ctx := context.Background()
	f.enqueue("a", 5, 1, 0)
	d := f.mustDispatch()
	insp := asynq.NewInspectorFromRedisClient(f.rdb)
	stranded, err := f.s.Stranded(ctx, insp, "a", d.TaskID, d.Priority, 30*time.Second)
	if err != nil || stranded {
		t.Fatalf("a task confirmed just now: stranded=%v err=%v", stranded, err)
	}
	f.mu.Lock()
	f.clock += 60_000
	f.mu.Unlock()
	stranded, err = f.s.Stranded(ctx, insp, "a", d.TaskID, d.Priority, 30*time.Second)
	if err != nil || !stranded {
		t.Fatalf("in flight for 60 s with no asynq message: stranded=%v err=%v, want true", stranded, err)
	}
}

// Tasks of every priority go to the one task queue, in the order they were
// dispatched, so a worker's fetch is one script call.
func TestDispatcherSendsEveryPriorityToTheTaskQueue(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100, 0)
	ctx := context.Background()
	t.Cleanup(func() {
		f.rdb.SRem(context.Background(), "asynq:queues", append(LegacyQueues(f.keys), f.keys.TaskQueue()))
	})
	for i, prio := range []int{9, 5, 0} {
		f.enqueue(fmt.Sprintf("t%d", i), prio, 1, 0)
	}
	d := NewDispatcher(f.s, f.rdb, asynq.NewClientFromRedisClient(f.rdb), DispatcherOptions{})
	if n, err := d.RunOnce(ctx); err != nil || n != 3 {
		t.Fatalf("RunOnce = %d, %v; want 3 dispatched", n, err)
	}
	insp := asynq.NewInspectorFromRedisClient(f.rdb)
	pending, err := insp.ListPendingTasks(f.keys.TaskQueue())
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 3 {
		t.Fatalf("the task queue holds %d messages, want the 3 tasks of priorities 9, 5 and 0", len(pending))
	}
	for _, q := range LegacyQueues(f.keys) {
		if qi, err := insp.GetQueueInfo(q); err == nil && qi.Size > 0 {
			t.Fatalf("queue %s holds %d messages, want none", q, qi.Size)
		}
	}
}

// A message an earlier version sent to its priority band's queue is live: the task is
// not stranded while it waits there (the workers drain those queues), and is once the
// message is gone.
func TestStrandedLooksInTheLegacyQueueOfTheTasksPriority(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100, 0)
	ctx := context.Background()
	legacy := f.keys.AsynqQueue("high")
	t.Cleanup(func() { f.rdb.SRem(context.Background(), "asynq:queues", legacy) })
	f.enqueue("a", 8, 1, 0)
	d := f.mustDispatch()
	cl := asynq.NewClientFromRedisClient(f.rdb)
	if _, err := cl.EnqueueContext(ctx, asynq.NewTask(wire.TaskType, nil), asynq.Queue(legacy), asynq.TaskID(d.asynqID())); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.clock += 60_000
	f.mu.Unlock()
	insp := asynq.NewInspectorFromRedisClient(f.rdb)
	stranded, err := f.s.Stranded(ctx, insp, "a", d.TaskID, d.Priority, 30*time.Second)
	if err != nil || stranded {
		t.Fatalf("a task whose message waits in its band's queue: stranded=%v err=%v, want false", stranded, err)
	}
	if err := insp.DeleteTask(legacy, d.asynqID()); err != nil {
		t.Fatal(err)
	}
	stranded, err = f.s.Stranded(ctx, insp, "a", d.TaskID, d.Priority, 30*time.Second)
	if err != nil || !stranded {
		t.Fatalf("no message in either queue: stranded=%v err=%v, want true", stranded, err)
	}
}

// releaseCalls counts the release script's calls on a key and the slots each gives
// back, and holds the first pipeline until gate is closed.
type releaseCalls struct {
	key   string
	gate  chan struct{}
	first atomic.Bool
	mu    sync.Mutex
	calls []int64
}

// hook counts the pipelines' release calls, and holds the first pipeline until gate
// is closed.
func (h *releaseCalls) hook() pipelineHook {
	return func(cmds []redis.Cmder) {
		for _, c := range cmds {
			if a := c.Args(); len(a) == 5 && a[0] == "evalsha" && a[1] == releaseScript.Hash() && a[3] == h.key {
				n, _ := strconv.ParseInt(fmt.Sprint(a[4]), 10, 64)
				h.mu.Lock()
				h.calls = append(h.calls, n)
				h.mu.Unlock()
			}
		}
		if h.first.CompareAndSwap(false, true) {
			<-h.gate
		}
	}
}

func (h *releaseCalls) sum() (n int64, calls int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.calls {
		n += c
	}
	return n, len(h.calls)
}

// Worker slots released at the same moment go back in one call of the release script,
// and the counter ends exact.
func TestConcurrentReleasesShareOneScriptCall(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100, 0)
	ctx := context.Background()
	if n, err := f.s.reserveN(ctx, 8); err != nil || n != 8 {
		t.Fatalf("reserveN = %d, %v", n, err)
	}
	if err := releaseScript.Load(ctx, f.rdb).Err(); err != nil {
		t.Fatal(err)
	}
	h := &releaseCalls{key: f.keys.SlotsInflight(), gate: make(chan struct{})}
	f.rdb.AddHook(h.hook())
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if err := f.s.release(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	// The first release's pipeline is held; the others wait for the next one.
	for deadline := time.Now().Add(5 * time.Second); ; runtime.Gosched() {
		if sent, _ := h.sum(); sent+f.s.owed.Load() == 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Error("the releases behind the held pipeline are not all owed")
			break
		}
	}
	close(h.gate)
	wg.Wait()
	if sent, calls := h.sum(); sent != 8 || calls > 2 {
		t.Fatalf("8 releases: %d script calls giving back %d slots, want at most 2 calls giving back 8", calls, sent)
	}
	if v := f.rdb.Get(ctx, f.keys.SlotsInflight()).Val(); v != "0" {
		t.Fatalf("slot counter %s after every slot went back, want 0", v)
	}
}

// scriptCalls counts the calls of one script.
type scriptCalls struct {
	sha string
	n   atomic.Int64
}

// hook counts the pipelines' calls of the script.
func (h *scriptCalls) hook() pipelineHook {
	return func(cmds []redis.Cmder) {
		for _, c := range cmds {
			if a := c.Args(); len(a) > 1 && (a[0] == "evalsha" && a[1] == h.sha) {
				h.n.Add(1)
			}
		}
	}
}

// A round's tasks are confirmed by one script call per shard: each is moved from
// dispatching to inflight (not one that finished meanwhile) and counted among its
// tenant's starts.
func TestConfirmAllIsOneScriptCall(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100, 0)
	ctx := context.Background()
	f.enqueue("a", 5, 1, 0)
	f.enqueue("a", 5, 1, 0)
	f.enqueue("b", 5, 1, 0)
	var ds []Dispatched
	for range 3 {
		d, err := f.dispatch()
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	f.done(ds[2]) // its worker was quicker than the confirm
	if err := confirmScript.Load(ctx, f.rdb).Err(); err != nil {
		t.Fatal(err)
	}
	h := &scriptCalls{sha: confirmScript.Hash()}
	f.rdb.AddHook(h.hook())
	if err := f.s.confirmAll(ctx, ds); err != nil {
		t.Fatal(err)
	}
	if n := h.n.Load(); n != 1 {
		t.Fatalf("%d confirm script calls for a round of 3 tasks on one shard, want 1", n)
	}
	if n := f.rdb.ZCard(ctx, f.keys.Dispatching(0)).Val(); n != 0 {
		t.Fatalf("dispatching holds %d, want 0", n)
	}
	inflight := f.rdb.ZRange(ctx, f.keys.Inflight(0), 0, -1).Val()
	if want := []string{ds[0].TaskID, ds[1].TaskID}; !slices.Equal(sorted(inflight), sorted(want)) {
		t.Fatalf("inflight holds %v, want %v (not the finished task)", inflight, want)
	}
	for _, tenant := range []string{ds[0].TenantID, ds[2].TenantID} {
		got := f.rdb.ZCard(ctx, f.keys.TenantStarts(tenant)).Val()
		n := int64(0)
		for _, d := range ds {
			if d.TenantID == tenant {
				n++
			}
		}
		if got != n {
			t.Fatalf("tenant %s: %d starts recorded, want %d", tenant, got, n)
		}
		if ttl := f.rdb.PTTL(ctx, f.keys.TenantStarts(tenant)).Val(); ttl <= 0 {
			t.Fatalf("tenant %s: starts have no ttl", tenant)
		}
	}
}

func TestHeartbeatScoresWithRedisTime(t *testing.T) {
	t.Parallel()
	rdb, keys := testenv.Redis(t, 1)
	s := New(rdb, keys, Options{}) // no test clock: every score comes from Redis TIME
	ctx := context.Background()
	if err := s.Heartbeat(ctx, "w", 4, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	score, err := rdb.ZScore(ctx, keys.Workers(), "w").Result()
	if err != nil {
		t.Fatal(err)
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if left := int64(score) - now.UnixMilli(); left < 9000 || left > 10000 {
		t.Fatalf("heartbeat expires %d ms after Redis TIME, want 10 s", left)
	}
	if ok, err := s.reserve(ctx); err != nil || !ok {
		t.Fatalf("a live worker adds no capacity: ok=%v err=%v", ok, err)
	}
}

func TestLongIdleTenantBanksNoCreditFromItsFinishPass(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1000, 0)
	f.enqueue("late", 5, 1, 0)
	f.done(f.mustDispatch()) // late's finish pass: 100
	for range 20 {
		f.enqueue("busy", 5, 1, 0)
	}
	for range 10 {
		f.done(f.mustDispatch())
	}
	// late's finish pass is far behind the virtual time now: it restarts level with
	// busy, not 9 tasks ahead of it.
	for range 10 {
		f.enqueue("late", 5, 1, 0)
	}
	late := 0
	for range 6 {
		if f.mustDispatch().TenantID == "late" {
			late++
		}
	}
	if late != 3 {
		t.Fatalf("back after a long idle period, late got %d of the next 6 dispatches, want 3", late)
	}
}

func TestShallowTenantAcrossShards(t *testing.T) {
	t.Parallel()
	// One worker slot: each dispatcher round hands out one task; the shallow tenant,
	// on another shard than the backlogged one, resubmits after each of its dispatches.
	f := newShardedFixture(t, 1, 0, 16)
	if f.keys.Shard("deep") == f.keys.Shard("shallow1") {
		t.Fatal("the test's tenants share a shard: pick other names")
	}
	for range 60 {
		f.enqueue("deep", 5, 1, 0)
	}
	f.enqueue("shallow1", 5, 1, 0)
	enq := &recordingEnqueuer{}
	d := NewDispatcher(f.s, f.rdb, enq, DispatcherOptions{})
	ctx := context.Background()
	counts := map[string]int{}
	for i := range 40 {
		if n, err := d.RunOnce(ctx); err != nil || n != 1 {
			t.Fatalf("round %d dispatched %d (%v), want 1", i, n, err)
		}
		var p wire.Payload
		if err := json.Unmarshal([]byte(enq.tasks[len(enq.tasks)-1]), &p); err != nil {
			t.Fatal(err)
		}
		counts[p.TenantID]++
		if err := f.s.Done(ctx, p, 100*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if p.TenantID == "shallow1" {
			f.enqueue("shallow1", 5, 1, 0)
		}
	}
	if abs(counts["shallow1"]-20) > 1 {
		t.Fatalf("equal weights on two shards: shallow tenant got %d of 40 dispatches (%v), want 20", counts["shallow1"], counts)
	}
}

// The operator view's reads: per-tenant depths and the pool as dispatch counts it
// (live workers only, by the scheduler's clock).
func TestDepthsAndPoolUsage(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 2)
	ctx := context.Background()
	if err := f.s.Heartbeat(ctx, "w2", 5, time.Second); err != nil {
		t.Fatal(err)
	}
	f.enqueue("a", 5, 1, 0)
	f.enqueue("a", 5, 1, 0)
	f.enqueue("b", 5, 1, 0)
	if _, err := f.dispatch(); err != nil {
		t.Fatal(err)
	}
	ds, err := f.s.Depths(ctx, []string{"a", "b", "idle"})
	if err != nil {
		t.Fatal(err)
	}
	if got := ds[0].Queued + ds[1].Queued; got != 2 || ds[0].Running+ds[1].Running != 1 || ds[2] != (Depth{}) {
		t.Fatalf("depths %+v: want 2 queued and 1 running over a and b, nothing for idle", ds)
	}
	p, err := f.s.SlotUsage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p != (WorkerSlots{Workers: 2, Capacity: 8, Busy: 1, Prefetch: 2}) {
		t.Fatalf("pool %+v", p)
	}
	f.mu.Lock()
	f.clock += 2000 // w2's registration lapses
	f.mu.Unlock()
	if p, err = f.s.SlotUsage(ctx); err != nil || p.Workers != 1 || p.Capacity != 3 {
		t.Fatalf("pool after w2 lapsed %+v, %v", p, err)
	}
}

// A process with a running dispatcher wakes it in process: an enqueue is dispatched
// at once (long before the fallback timer) and nothing is published. Without a
// dispatcher of its own, the process publishes the wake-up for the others.
func TestWakeUpGoesToTheDispatcherOfThisProcess(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100, 0)
	ctx := context.Background()
	sub := f.rdb.Subscribe(ctx, f.keys.WakeChannel())
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription is in place
		t.Fatal(err)
	}
	published := func() bool {
		t.Helper()
		m, err := sub.ReceiveTimeout(ctx, 200*time.Millisecond)
		var nerr net.Error
		if errors.As(err, &nerr) && nerr.Timeout() {
			return false // nothing within the time
		}
		if err != nil { // a broken subscription must not pass for silence
			t.Fatal(err)
		}
		if _, ok := m.(*redis.Message); !ok {
			t.Fatalf("unexpected %T on the wake-up channel", m)
		}
		return true
	}

	f.enqueue("a", 5, 1, 0)
	if !published() {
		t.Fatal("with no dispatcher in this process, the enqueue's wake-up was not published")
	}

	enq := &recordingEnqueuer{}
	d := NewDispatcher(f.s, f.rdb, enq, DispatcherOptions{FallbackEvery: time.Hour})
	dctx, stop := context.WithCancel(ctx)
	if err := d.Start(dctx); err != nil {
		t.Fatal(err)
	}
	defer func() { stop(); <-d.Stopped() }()
	dispatched := func(n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			enq.mu.Lock()
			got := len(enq.tasks)
			enq.mu.Unlock()
			if got >= n {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("%d tasks dispatched, want %d", len(enq.tasks), n)
	}
	dispatched(1) // the start's first round
	f.enqueue("a", 5, 1, 0)
	dispatched(2)
	if published() {
		t.Fatal("the wake-up was published though this process's dispatcher took it")
	}

	stop()
	<-d.Stopped()
	f.enqueue("a", 5, 1, 0)
	if !published() {
		t.Fatal("after its dispatcher stopped, the process did not publish its wake-up")
	}
}

// Standing gives each asked task its place in its tenant's queue (priority first,
// then admission; 0 when not in it) in one round trip, and the tenant's start rate
// measured on its dispatches: none before two, then the starts after the first over
// the time since it, until they leave the window.
func TestStandingPositionsAndStartRate(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10, 0)
	ctx := context.Background()
	first := f.enqueue("a", 5, 1, 0)
	second := f.enqueue("a", 5, 1, 0)
	urgent := f.enqueue("a", 9, 1, 0)
	ids := []string{first.String(), second.String(), urgent.String(), uuid.NewString()}
	st, err := f.s.Standing(ctx, "a", ids)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{2, 3, 1, 0}; !slices.Equal(st.Positions, want) || st.Reason != WaitBehindFairShare {
		t.Fatalf("positions %v (%s), want %v", st.Positions, st.Reason, want)
	}
	if _, ok := st.ExpectedStart(1); ok || st.StartRate != 0 {
		t.Fatalf("a rate %v before any start", st.StartRate)
	}
	if d := f.mustDispatch(); d.TaskID != urgent.String() {
		t.Fatalf("dispatched %s first, want the urgent task", d.TaskID)
	}
	if st, _ = f.s.Standing(ctx, "a", ids); st.StartRate != 0 || st.Positions[0] != 1 || st.Positions[2] != 0 {
		t.Fatalf("after one start: rate %v, positions %v", st.StartRate, st.Positions)
	}
	f.advance(2 * time.Second)
	f.mustDispatch()
	st, _ = f.s.Standing(ctx, "a", ids)
	if st.StartRate != 0.5 || st.Positions[1] != 1 {
		t.Fatalf("two starts 2 s apart: rate %v, positions %v", st.StartRate, st.Positions)
	}
	if at, ok := st.ExpectedStart(3); !ok || !at.Equal(time.UnixMilli(f.now()).Add(6*time.Second)) {
		t.Fatalf("expected start of position 3: %v %v", at, ok)
	}
	f.advance(2 * time.Second) // nothing started since: the rate falls
	if st, _ = f.s.Standing(ctx, "a", nil); st.StartRate != 0.25 {
		t.Fatalf("2 s later: rate %v", st.StartRate)
	}
	f.advance(startWindow)
	if st, _ = f.s.Standing(ctx, "a", nil); st.StartRate != 0 {
		t.Fatalf("past the window: rate %v", st.StartRate)
	}
}
