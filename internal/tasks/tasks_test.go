package tasks_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/tasks/change"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
	"github.com/agentq/agentq/scheduler"
)

func ptr[T any](v T) *T { return &v }

// agents knows the agent "sim", which takes any JSON object.
type agents struct{}

func (agents) ValidateTask(_ context.Context, agent string, _ json.RawMessage) error {
	if agent != "sim" {
		return &agentqtype.UnknownAgentError{Agent: agent}
	}
	return nil
}

type env struct {
	svc   *tasks.Service
	deps  tasks.Deps // svc's, for a test's own variant
	st    *store.Store
	rdb   *redis.Client
	rk    rkeys.Keys
	sched *scheduler.Scheduler
}

func setup(t *testing.T, tenantIDs ...string) env {
	t.Helper()
	st := store.New(testenv.Postgres(t))
	rdb, rk := testenv.Redis(t, 1)
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	sched := scheduler.New(rdb, rk, scheduler.Options{})
	for _, id := range tenantIDs {
		if _, err := st.CreateTenant(context.Background(), store.CreateTenantParams{ID: id, Name: id, Plan: "pro"}); err != nil {
			t.Fatal(err)
		}
	}
	guard := admission.NewGuard(admission.New(rdb, rk, nil), admission.GuardOptions{Timeout: time.Second})
	deps := tasks.Deps{
		Store: st, Tenants: tenants.New(st, plans, tenants.Options{}), Admission: guard,
		Queue: sched, Agents: agents{}, Redis: rdb, Keys: rk,
	}
	return env{svc: tasks.New(deps), deps: deps, st: st, rdb: rdb, rk: rk, sched: sched}
}

// keyCount is how many Redis keys the test's prefix holds: a refusal before
// admission must not create any.
func (e env) keyCount(t *testing.T) int {
	t.Helper()
	keys, err := e.rdb.Keys(context.Background(), e.rk.Prefix()+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}

func TestSubmitStoresQueuesAndReplays(t *testing.T) {
	ctx := context.Background()
	e := setup(t, "acme")
	p := tasks.SubmitParams{TenantID: "acme", Kid: "k1", Agent: "sim", Input: json.RawMessage(`{ "b": 1, "a": 2 }`),
		User: "bob", Budget: &tasks.BudgetRequest{MaxSteps: ptr(3)}, IdempotencyKey: "order-1"}
	res, err := e.svc.Submit(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if res.Replayed || res.Decision == nil || !res.Decision.Allowed || res.Task.State != agentqtype.TaskStateQueued {
		t.Fatalf("submit: %+v", res)
	}
	var in map[string]int
	if err := json.Unmarshal(res.Task.Input, &in); err != nil || in["a"] != 2 || in["b"] != 1 || res.Task.User != "bob" || res.Task.Priority != scheduler.DefaultPriority {
		t.Errorf("stored task: input %s user %q priority %d", res.Task.Input, res.Task.User, res.Task.Priority)
	}
	var b quotas.TaskBudget
	if err := json.Unmarshal(res.Task.Budget, &b); err != nil || b.MaxSteps != 3 || b.MaxWallclockS <= 0 || b.MaxCostUSD <= 0 {
		t.Errorf("budget %s: want max_steps 3 and the plan's other defaults", res.Task.Budget)
	}
	got, err := e.svc.Get(ctx, "acme", res.Task.ID)
	if err != nil || got.ID != res.Task.ID || got.WaitReason == nil {
		t.Errorf("get: %+v %v; want the task with a wait reason", got, err)
	}
	if _, err := e.svc.Get(ctx, "globex", res.Task.ID); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Errorf("another tenant's get: %v, want ErrNotFound", err)
	}
	// The same request again (key order differs) is a replay; a different one a conflict.
	p.Input = json.RawMessage(`{"a":2,"b":1}`)
	again, err := e.svc.Submit(ctx, p)
	if err != nil || !again.Replayed || again.Task.ID != res.Task.ID {
		t.Errorf("replay: %+v %v", again, err)
	}
	p.User = "eve"
	var conflict *agentqtype.IdempotencyConflictError
	if _, err := e.svc.Submit(ctx, p); !errors.As(err, &conflict) || conflict.Key != "order-1" {
		t.Errorf("different request with the same key: %v, want an IdempotencyConflictError", err)
	}
	page, err := e.svc.List(ctx, tasks.ListParams{TenantID: "acme"})
	if err != nil || len(page.Tasks) != 1 || page.Next != nil {
		t.Errorf("list: %+v %v; want the one task", page, err)
	}
}

// A submission stores its task through the lifecycle: the new task is a change like
// any other, and when that change's transaction fails nothing is stored, nothing is
// queued and the lease admission took is given back.
func TestSubmissionIsALifecycleChange(t *testing.T) {
	ctx := context.Background()
	e := setup(t, "acme")
	var fail atomic.Bool
	var created atomic.Int32
	errHook := errors.New("the change's transaction fails after the change")
	d := e.deps
	d.Lifecycle = tasks.NewLifecycle(e.st, tasks.LifecycleOptions{Subscribers: []tasks.Subscriber{change.Funcs{Tx: func(_ context.Context, _ *store.Store, c tasks.Change) error {
		if fail.Load() {
			return errHook
		}
		if c.Kind == tasks.ChangeCreated && c.Task.State == agentqtype.TaskStateQueued {
			created.Add(1)
		}
		return nil
	}}}})
	svc := tasks.New(d)
	p := tasks.SubmitParams{TenantID: "acme", Kid: "k1", Agent: "sim", IdempotencyKey: "order-1"}
	fail.Store(true)
	if _, err := svc.Submit(ctx, p); !errors.Is(err, errHook) {
		t.Fatalf("submit whose change fails: %v, want the hook's error", err)
	}
	if n, err := e.st.CountTasks(ctx, store.CountTasksParams{TenantID: "acme"}); err != nil || n != 0 {
		t.Fatalf("a rolled-back submission stored %d tasks (%v)", n, err)
	}
	if sess, long, err := admission.New(e.rdb, e.rk, nil).Leases(ctx, "acme"); err != nil || len(sess)+len(long) != 0 {
		t.Fatalf("a rolled-back submission kept its lease: %v %v %v", sess, long, err)
	}
	if n, err := e.rdb.ZCard(ctx, e.rk.TenantQueue("acme")).Result(); err != nil || n != 0 {
		t.Fatalf("a rolled-back submission queued %d tasks (%v)", n, err)
	}
	fail.Store(false)
	res, err := svc.Submit(ctx, p)
	if err != nil || res.Replayed || created.Load() != 1 {
		t.Fatalf("submit: %+v %v, %d created changes", res, err, created.Load())
	}
	// A replay creates nothing.
	if again, err := svc.Submit(ctx, p); err != nil || !again.Replayed || created.Load() != 1 {
		t.Fatalf("replay: %+v %v, %d created changes", again, err, created.Load())
	}
}

func TestRefusedSubmissionChangesNothing(t *testing.T) {
	ctx := context.Background()
	e := setup(t, "acme")
	before := e.keyCount(t)
	for _, p := range []tasks.SubmitParams{
		{TenantID: "acme", Agent: "sim", Budget: &tasks.BudgetRequest{MaxSteps: ptr(0)}},
		{TenantID: "acme", Agent: "sim", Budget: &tasks.BudgetRequest{MaxCostUSD: ptr(1e6)}},
		{TenantID: "acme", Agent: "sim", Priority: ptr(scheduler.MaxPriority + 1)},
		{TenantID: "acme", Agent: ""},
		{TenantID: "acme", Agent: "sim", StartWithinS: ptr(0.0)},
		{TenantID: "acme", Agent: "sim", StartWithinS: ptr(-1.0)},
		{TenantID: "acme", Agent: "sim", StartWithinS: ptr(math.NaN())},
		{TenantID: "acme", Agent: "sim", StartWithinS: ptr(math.Inf(1))},
		{TenantID: "acme", Agent: "sim", StartWithinS: ptr(tasks.MaxStartWithin.Seconds() + 1)},
	} {
		res, err := e.svc.Submit(ctx, p)
		var inv *agentqtype.InvalidError
		if !errors.As(err, &inv) || res.Decision != nil {
			t.Errorf("%+v: %v (decision %v), want an InvalidError before admission", p, err, res.Decision)
		}
	}
	var unknown *agentqtype.UnknownAgentError
	if _, err := e.svc.Submit(ctx, tasks.SubmitParams{TenantID: "acme", Agent: "nope"}); !errors.As(err, &unknown) {
		t.Errorf("unknown agent: %v", err)
	}
	if after := e.keyCount(t); after != before {
		t.Errorf("refusals touched Redis: %d keys, were %d", after, before)
	}
	page, err := e.svc.List(ctx, tasks.ListParams{TenantID: "acme"})
	if err != nil || len(page.Tasks) != 0 {
		t.Errorf("refusals stored tasks: %+v %v", page, err)
	}
}

func TestEmptyTenantIsRefused(t *testing.T) {
	ctx := context.Background()
	e := setup(t, "acme")
	if _, err := e.svc.Submit(ctx, tasks.SubmitParams{Agent: "sim"}); !errors.Is(err, tasks.ErrNoTenant) {
		t.Errorf("submit: %v", err)
	}
	if _, err := e.svc.Get(ctx, "", [16]byte{1}); !errors.Is(err, tasks.ErrNoTenant) {
		t.Errorf("get: %v", err)
	}
	if _, err := e.svc.List(ctx, tasks.ListParams{}); !errors.Is(err, tasks.ErrNoTenant) {
		t.Errorf("list: %v", err)
	}
	if _, err := e.svc.Cancel(ctx, "", [16]byte{1}); !errors.Is(err, tasks.ErrNoTenant) {
		t.Errorf("cancel: %v", err)
	}
}

func TestCancelQueuedTask(t *testing.T) {
	ctx := context.Background()
	e := setup(t, "acme")
	res, err := e.svc.Submit(ctx, tasks.SubmitParams{TenantID: "acme", Kid: "k1", Agent: "sim"})
	if err != nil {
		t.Fatal(err)
	}
	sub := e.rdb.Subscribe(ctx, e.rk.CancelChannel())
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := e.svc.Cancel(ctx, "acme", res.Task.ID)
	if err != nil || got.State != agentqtype.TaskStateKilled || got.Error == nil || *got.Error != "cancelled by the tenant" {
		t.Fatalf("cancel: %+v %v", got, err)
	}
	select {
	case m := <-sub.Channel():
		if m.Payload != res.Task.ID.String() {
			t.Errorf("cancel published %q, want %s", m.Payload, res.Task.ID)
		}
	case <-time.After(5 * time.Second):
		t.Error("no cancel published")
	}
	if removed, err := e.sched.Remove(ctx, "acme", res.Task.ID); err != nil || removed {
		t.Errorf("the task is still queued: %v %v", removed, err)
	}
	var fin *tasks.FinishedError
	if _, err := e.svc.Cancel(ctx, "acme", res.Task.ID); !errors.As(err, &fin) || fin.State != string(agentqtype.TaskStateKilled) {
		t.Errorf("second cancel: %v, want a FinishedError", err)
	}
	if _, err := e.svc.Cancel(ctx, "globex", res.Task.ID); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Errorf("another tenant's cancel: %v, want ErrNotFound", err)
	}
}

// A submission's start_within_s becomes its start deadline, counted from its creation;
// the same request with another deadline is another request for its idempotency key.
func TestSubmitStoresAStartDeadline(t *testing.T) {
	ctx := context.Background()
	e := setup(t, "acme")
	p := tasks.SubmitParams{TenantID: "acme", Kid: "k1", Agent: "sim", IdempotencyKey: "d1", StartWithinS: ptr(90.5)}
	res, err := e.svc.Submit(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	got := res.Task.StartDeadline
	if got == nil || !got.Equal(res.Task.CreatedAt.Add(90500*time.Millisecond)) {
		t.Fatalf("start deadline %v, created %v", got, res.Task.CreatedAt)
	}
	// The smallest deadline is still one.
	tiny, err := e.svc.Submit(ctx, tasks.SubmitParams{TenantID: "acme", Kid: "k1", Agent: "sim", StartWithinS: ptr(1e-9)})
	if err != nil || tiny.Task.StartDeadline == nil {
		t.Fatalf("a tiny start_within_s: %+v %v", tiny.Task.StartDeadline, err)
	}
	none, err := e.svc.Submit(ctx, tasks.SubmitParams{TenantID: "acme", Kid: "k1", Agent: "sim"})
	if err != nil || none.Task.StartDeadline != nil {
		t.Fatalf("without start_within_s: %v %v", none.Task.StartDeadline, err)
	}
	other := p
	other.StartWithinS = ptr(60.0)
	var conflict *agentqtype.IdempotencyConflictError
	if _, err := e.svc.Submit(ctx, other); !errors.As(err, &conflict) {
		t.Fatalf("the key again with another deadline: %v, want a conflict", err)
	}
}

// countingQueue is the scheduler, counting the Standing reads.
type countingQueue struct {
	*scheduler.Scheduler
	reads atomic.Int64
}

func (q *countingQueue) Standing(ctx context.Context, tenantID string, taskIDs []string) (scheduler.Standing, error) {
	q.reads.Add(1)
	return q.Scheduler.Standing(ctx, tenantID, taskIDs)
}

// A listing gives each queued task its place in its tenant's queue with one read of
// the scheduler for them all; no expected start while nothing was started (no worker
// runs here, so they wait for worker capacity).
func TestListGivesPositionsInOneRead(t *testing.T) {
	ctx := context.Background()
	e := setup(t, "acme")
	q := &countingQueue{Scheduler: e.sched}
	d := e.deps
	d.Queue = q
	svc := tasks.New(d)
	const n = 3 // the pro plan's concurrent sessions
	for i := range n {
		prio := 5
		if i == n-1 {
			prio = 9 // submitted last, dispatched first
		}
		if _, err := svc.Submit(ctx, tasks.SubmitParams{TenantID: "acme", Kid: "k1", Agent: "sim", Priority: &prio}); err != nil {
			t.Fatal(err)
		}
	}
	page, err := svc.List(ctx, tasks.ListParams{TenantID: "acme"})
	if err != nil || len(page.Tasks) != n {
		t.Fatalf("list: %d tasks, %v", len(page.Tasks), err)
	}
	if r := q.reads.Load(); r != 1 {
		t.Fatalf("%d scheduler reads for one tenant's tasks, want 1", r)
	}
	// Newest first: the urgent one is first in the queue, the others follow oldest
	// first.
	want := []int64{1, 3, 2}
	for i, task := range page.Tasks {
		w := task.WaitReason
		if w == nil || w.Position != want[i] || w.ExpectedStart != nil || w.Reason != scheduler.WaitNoWorkerCapacity {
			t.Fatalf("task %d: %+v, want position %d and no expected start", i, w, want[i])
		}
	}
}
