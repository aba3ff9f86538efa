package tasks_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/tasks/change"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/internal/testenv/testfactory"
)

// lcEnv is a Lifecycle on its own schema with tenants acme and globex. Every change
// the lifecycle makes is kept in changes; while fail is set, the change's transaction
// is made to fail after the change.
type lcEnv struct {
	lc   *tasks.Lifecycle
	st   *store.Store
	pool *pgxpool.Pool

	mu      sync.Mutex
	changes []tasks.Change
	fail    bool
	failOn  tasks.ChangeKind               // when set, only changes of this kind fail
	at      map[tasks.ChangeKind]time.Time // when the hook last saw a change of each kind
	probes  int                            // rows written by the hook, committed or not
	probe   string                         // the last one's tenant id
}

func lifecycleSetup(t *testing.T) *lcEnv {
	t.Helper()
	e := &lcEnv{pool: testenv.Postgres(t)}
	e.st = store.New(e.pool)
	for _, id := range []string{"acme", "globex"} {
		if _, err := e.st.CreateTenant(context.Background(), store.CreateTenantParams{ID: id, Name: id, Plan: "pro"}); err != nil {
			t.Fatal(err)
		}
	}
	e.lc = tasks.NewLifecycle(e.st, tasks.LifecycleOptions{Subscribers: []tasks.Subscriber{change.Funcs{Tx: e.afterChange}}})
	return e
}

var errHook = errors.New("the change's transaction fails after the change")

// afterChange writes a row in the change's transaction, as an outbox would (a tenant
// named after the change), and then fails when told to.
func (e *lcEnv) afterChange(ctx context.Context, tx *store.Store, c tasks.Change) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	// The change is visible inside its own transaction.
	if got, err := tx.GetTask(ctx, store.GetTaskParams{TenantID: c.Task.TenantID, ID: c.Task.ID}); err != nil ||
		got.State != c.Task.State || got.Attempt != c.Task.Attempt {
		return fmt.Errorf("the hook does not see the change in its transaction: %+v, %v", got, err)
	}
	e.probes++
	e.probe = fmt.Sprintf("probe-%d", e.probes)
	if e.at == nil {
		e.at = map[tasks.ChangeKind]time.Time{}
	}
	e.at[c.Kind] = time.Now()
	if _, err := tx.CreateTenant(ctx, store.CreateTenantParams{ID: e.probe, Name: string(c.Kind), Plan: "pro"}); err != nil {
		return err
	}
	if e.fail && (e.failOn == "" || e.failOn == c.Kind) {
		return errHook
	}
	e.changes = append(e.changes, c)
	return nil
}

// took returns the changes made since the last call.
func (e *lcEnv) took() []tasks.Change {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.changes
	e.changes = nil
	return out
}

func (e *lcEnv) setFail(v bool) {
	e.mu.Lock()
	e.fail = v
	e.mu.Unlock()
}

func (e *lcEnv) insert(t *testing.T, tenant string) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	if _, _, err := e.st.InsertTask(context.Background(), store.InsertTaskParams{ID: id, TenantID: tenant, Kid: "k", Agent: "sim",
		Input: json.RawMessage(`{}`), Budget: json.RawMessage(`{}`), RequestHash: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	return id
}

func (e *lcEnv) get(t *testing.T, id uuid.UUID) store.Task {
	t.Helper()
	got, err := e.st.GetTask(context.Background(), store.GetTaskParams{TenantID: "acme", ID: id})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func (e *lcEnv) staleHeartbeat(t *testing.T, id uuid.UUID) {
	t.Helper()
	testfactory.TaskHeartbeatAgo(t, e.pool, id, time.Minute)
}

func (e *lcEnv) start(t *testing.T, id uuid.UUID, want tasks.StartOutcome) store.Task {
	t.Helper()
	task, out, err := e.lc.Start(context.Background(), id)
	if err != nil || out != want {
		t.Fatalf("start: %v, %v; want %v", out, err, want)
	}
	return task
}

// wantChanges checks the kinds of the changes made since the last check.
func (e *lcEnv) wantChanges(t *testing.T, kinds ...tasks.ChangeKind) []tasks.Change {
	t.Helper()
	got := e.took()
	if len(got) != len(kinds) {
		t.Fatalf("changes %+v, want kinds %v", got, kinds)
	}
	for i, c := range got {
		if c.Kind != kinds[i] {
			t.Fatalf("change %d is %s, want %s", i, c.Kind, kinds[i])
		}
	}
	return got
}

func claimOf(t store.Task) store.Claim { return store.Claim{ID: t.ID, Attempt: t.Attempt} }

func TestLifecycleCreate(t *testing.T) {
	t.Parallel()
	e := lifecycleSetup(t)
	ctx := context.Background()
	p := store.InsertTaskParams{ID: uuid.Must(uuid.NewV7()), TenantID: "acme", Kid: "k", Agent: "sim",
		Input: json.RawMessage(`{}`), Budget: json.RawMessage(`{}`), IdempotencyKey: "order-1", RequestHash: []byte{1}}
	task, created, err := e.lc.Create(ctx, p)
	if err != nil || !created || task.State != agentqtype.TaskStateQueued {
		t.Fatalf("create: %v %v %s", created, err, task.State)
	}
	if c := e.wantChanges(t, tasks.ChangeCreated); c[0].Task.ID != p.ID {
		t.Fatalf("change %+v", c[0])
	}
	// The same idempotency key again: the existing task, and no change.
	again := p
	again.ID = uuid.Must(uuid.NewV7())
	if got, created, err := e.lc.Create(ctx, again); err != nil || created || got.ID != p.ID {
		t.Fatalf("create with a used key: %v %v %s", created, err, got.ID)
	}
	e.wantChanges(t)
	if _, _, err := e.lc.Create(ctx, store.InsertTaskParams{ID: again.ID}); !errors.Is(err, store.ErrNoTenant) {
		t.Fatalf("create without a tenant: %v, want ErrNoTenant", err)
	}
}

func TestLifecycleStart(t *testing.T) {
	t.Parallel()
	e := lifecycleSetup(t)
	ctx := context.Background()
	id := e.insert(t, "acme")
	task := e.start(t, id, tasks.Started)
	if task.State != agentqtype.TaskStateRunning || task.Attempt != 1 || task.StartedAt == nil {
		t.Fatalf("started task: %s, attempt %d", task.State, task.Attempt)
	}
	if c := e.wantChanges(t, tasks.ChangeStarted); c[0].Task.ID != id || c[0].Task.Attempt != 1 {
		t.Fatalf("change %+v", c[0])
	}
	// A second delivery while the first attempt heartbeats: it owns the task.
	e.start(t, id, tasks.Busy)
	if got := e.get(t, id); got.Attempt != 1 {
		t.Fatalf("a busy start changed the attempt to %d", got.Attempt)
	}
	// A delivery of an ended task, or of one that is gone, has nothing to run.
	if ok, err := e.lc.Finish(ctx, tasks.FinishParams{Claim: claimOf(task), To: agentqtype.TaskStateCompleted}); err != nil || !ok {
		t.Fatalf("finish: %v %v", ok, err)
	}
	e.took()
	e.start(t, id, tasks.Ended)
	e.start(t, uuid.Must(uuid.NewV7()), tasks.Ended)
	e.wantChanges(t)
}

// A running task whose heartbeat went silent is taken over by the next delivery,
// under a new attempt; the stalled attempt can no longer write on it.
func TestLifecycleTakesOverAStaleClaim(t *testing.T) {
	t.Parallel()
	e := lifecycleSetup(t)
	ctx := context.Background()
	id := e.insert(t, "acme")
	first := e.start(t, id, tasks.Started)
	if err := e.lc.RecordStep(ctx, store.RecordStepParams{ID: id, Attempt: first.Attempt, Step: 1, Tokens: 5}); err != nil {
		t.Fatal(err)
	}
	e.staleHeartbeat(t, id)
	e.took()
	second := e.start(t, id, tasks.TookOver)
	if second.Attempt != 2 || second.State != agentqtype.TaskStateRunning || second.Usage.Steps != 1 {
		t.Fatalf("taken over: attempt %d, %s, %d steps", second.Attempt, second.State, second.Usage.Steps)
	}
	e.wantChanges(t, tasks.ChangeTakenOver)

	old := claimOf(first)
	if err := e.lc.RecordStep(ctx, store.RecordStepParams{ID: id, Attempt: old.Attempt, Step: 2}); !errors.Is(err, store.ErrLostClaim) {
		t.Errorf("step by the stale attempt: %v, want ErrLostClaim", err)
	}
	if err := e.lc.Heartbeat(ctx, old); !errors.Is(err, store.ErrLostClaim) {
		t.Errorf("heartbeat by the stale attempt: %v, want ErrLostClaim", err)
	}
	if err := e.lc.Requeue(ctx, old); !errors.Is(err, store.ErrLostClaim) {
		t.Errorf("requeue by the stale attempt: %v, want ErrLostClaim", err)
	}
	if ok, err := e.lc.Finish(ctx, tasks.FinishParams{Claim: old, To: agentqtype.TaskStateFailed}); ok || !errors.Is(err, store.ErrLostClaim) {
		t.Errorf("finish by the stale attempt: %v %v, want ErrLostClaim", ok, err)
	}
	if ok, err := e.lc.Finish(ctx, abandon(old, "gone")); ok || !errors.Is(err, store.ErrLostClaim) {
		t.Errorf("abandon by the stale attempt: %v %v, want ErrLostClaim", ok, err)
	}
	e.wantChanges(t)
	if got := e.get(t, id); got.State != agentqtype.TaskStateRunning || got.Attempt != 2 || got.Usage.Steps != 1 {
		t.Fatalf("the stale attempt changed the task: %s, attempt %d, %d steps", got.State, got.Attempt, got.Usage.Steps)
	}
}

func TestLifecycleRecordStepIsFencedByAttempt(t *testing.T) {
	t.Parallel()
	e := lifecycleSetup(t)
	ctx := context.Background()
	id := e.insert(t, "acme")
	task := e.start(t, id, tasks.Started)
	e.took()
	step := store.RecordStepParams{ID: id, Attempt: task.Attempt, Step: 1, AgentState: json.RawMessage(`{"n":1}`), Tokens: 7, CostMicro: 9}
	if err := e.lc.RecordStep(ctx, step); err != nil {
		t.Fatal(err)
	}
	c := e.wantChanges(t, tasks.ChangeStep)
	if c[0].Step != 1 || c[0].Task.Usage != (store.Usage{Steps: 1, Tokens: 7, CostMicroUSD: 9}) {
		t.Fatalf("step change %+v", c[0])
	}
	// A retry of the same step (its reply was lost) counts nothing and changes nothing.
	if err := e.lc.RecordStep(ctx, step); err != nil {
		t.Fatal(err)
	}
	e.wantChanges(t)
	// Another attempt number is not this task's claim.
	wrong := step
	wrong.Attempt, wrong.Step = task.Attempt+1, 2
	if err := e.lc.RecordStep(ctx, wrong); !errors.Is(err, store.ErrLostClaim) {
		t.Fatalf("step with another attempt: %v, want ErrLostClaim", err)
	}
	// After the task ended under this attempt, its step is refused as ended.
	if _, ok, err := e.st.FinishTask(ctx, store.FinishTaskParams{TenantID: "acme", ID: id,
		From: []store.TaskState{agentqtype.TaskStateRunning}, To: agentqtype.TaskStateKilled}); err != nil || !ok {
		t.Fatalf("cancel: %v %v", ok, err)
	}
	late := step
	late.Step = 2
	if err := e.lc.RecordStep(ctx, late); !errors.Is(err, store.ErrTaskEnded) {
		t.Fatalf("step after the end: %v, want ErrTaskEnded", err)
	}
	e.wantChanges(t)
	if got := e.get(t, id); got.Usage.Steps != 1 || string(got.AgentState) != `{"n": 1}` {
		t.Fatalf("task after the refused steps: %d steps, state %s", got.Usage.Steps, got.AgentState)
	}
	if rows, _ := e.st.TaskLedger(ctx, store.TaskLedgerParams{TenantID: "acme", TaskID: id}); len(rows) != 3 {
		t.Fatalf("ledger: %d rows, want step 1's 3", len(rows))
	}
}

func TestLifecycleFinish(t *testing.T) {
	t.Parallel()
	e := lifecycleSetup(t)
	ctx := context.Background()
	id := e.insert(t, "acme")
	task := e.start(t, id, tasks.Started)
	e.took()
	if _, err := e.lc.Finish(ctx, tasks.FinishParams{Claim: claimOf(task), To: agentqtype.TaskStateQueued}); err == nil {
		t.Fatal("finish to a state that is not terminal was accepted")
	}
	p := tasks.FinishParams{Claim: claimOf(task), To: agentqtype.TaskStateCompleted, Output: json.RawMessage(`{"answer":42}`)}
	if ok, err := e.lc.Finish(ctx, p); err != nil || !ok {
		t.Fatalf("finish: %v %v", ok, err)
	}
	c := e.wantChanges(t, tasks.ChangeFinished)
	if c[0].Task.State != agentqtype.TaskStateCompleted || c[0].Task.FinishedAt == nil {
		t.Fatalf("finish change %+v", c[0].Task)
	}
	// The second end of the same attempt does not win the transition.
	if ok, err := e.lc.Finish(ctx, tasks.FinishParams{Claim: claimOf(task), To: agentqtype.TaskStateFailed, Error: "late"}); err != nil || ok {
		t.Fatalf("second finish: %v %v, want not won and no error", ok, err)
	}
	e.wantChanges(t)
	if got := e.get(t, id); got.State != agentqtype.TaskStateCompleted || string(got.Output) != `{"answer": 42}` || got.Error != nil {
		t.Fatalf("finished task: %s, %s, %v", got.State, got.Output, got.Error)
	}
	if err := e.lc.Heartbeat(ctx, claimOf(task)); !errors.Is(err, store.ErrTaskEnded) {
		t.Fatalf("heartbeat after the end: %v, want ErrTaskEnded", err)
	}
}

// A re-queued task keeps its steps and resumes under the next attempt; the attempt
// that handed it back holds no claim on it any more.
func TestLifecycleRequeue(t *testing.T) {
	t.Parallel()
	e := lifecycleSetup(t)
	ctx := context.Background()
	id := e.insert(t, "acme")
	task := e.start(t, id, tasks.Started)
	if err := e.lc.RecordStep(ctx, store.RecordStepParams{ID: id, Attempt: task.Attempt, Step: 1}); err != nil {
		t.Fatal(err)
	}
	e.took()
	if err := e.lc.Requeue(ctx, claimOf(task)); err != nil {
		t.Fatal(err)
	}
	if c := e.wantChanges(t, tasks.ChangeRequeued); c[0].Task.State != agentqtype.TaskStateQueued || c[0].Task.Usage.Steps != 1 {
		t.Fatalf("requeue change %+v", c[0].Task)
	}
	if err := e.lc.Requeue(ctx, claimOf(task)); !errors.Is(err, store.ErrLostClaim) {
		t.Fatalf("second requeue: %v, want ErrLostClaim", err)
	}
	next := e.start(t, id, tasks.Started)
	if next.Attempt != 2 || next.Usage.Steps != 1 || !next.StartedAt.Equal(*task.StartedAt) {
		t.Fatalf("resumed: attempt %d, %d steps, started %v (first %v)", next.Attempt, next.Usage.Steps, next.StartedAt, task.StartedAt)
	}
}

// The janitor re-queues a task only while its heartbeat is silent, whatever attempt
// runs it: a worker that stamped its heartbeat since keeps its task.
func TestLifecycleRequeueStale(t *testing.T) {
	t.Parallel()
	e := lifecycleSetup(t)
	ctx := context.Background()
	id := e.insert(t, "acme")
	task := e.start(t, id, tasks.Started)
	if err := e.lc.RecordStep(ctx, store.RecordStepParams{ID: id, Attempt: task.Attempt, Step: 1}); err != nil {
		t.Fatal(err)
	}
	e.took()
	if _, ok, err := e.lc.RequeueStale(ctx, id, tasks.DefaultStaleAfter); ok || err != nil {
		t.Fatalf("requeue of a task with a fresh heartbeat: %v %v", ok, err)
	}
	e.wantChanges(t)
	e.staleHeartbeat(t, id)
	got, ok, err := e.lc.RequeueStale(ctx, id, tasks.DefaultStaleAfter)
	if err != nil || !ok || got.State != agentqtype.TaskStateQueued || got.Usage.Steps != 1 {
		t.Fatalf("requeue of a stale task: %v %v, %s with %d steps", ok, err, got.State, got.Usage.Steps)
	}
	if c := e.wantChanges(t, tasks.ChangeRequeued); c[0].Task.State != agentqtype.TaskStateQueued || c[0].Task.ID != id {
		t.Fatalf("requeue change %+v", c[0].Task)
	}
	if _, ok, err := e.lc.RequeueStale(ctx, id, tasks.DefaultStaleAfter); ok || err != nil {
		t.Fatalf("requeue of a queued task: %v %v", ok, err)
	}
	e.wantChanges(t)
}

func TestLifecycleAbandon(t *testing.T) {
	t.Parallel()
	e := lifecycleSetup(t)
	ctx := context.Background()
	id := e.insert(t, "acme")
	task := e.start(t, id, tasks.Started)
	e.took()
	if ok, err := e.lc.Finish(ctx, abandon(claimOf(task), agentqtype.AbandonedAfter(3))); err != nil || !ok {
		t.Fatalf("abandon: %v %v", ok, err)
	}
	if c := e.wantChanges(t, tasks.ChangeAbandoned); c[0].Task.State != agentqtype.TaskStateAbandoned {
		t.Fatalf("abandon change %+v", c[0].Task)
	}
	if got := e.get(t, id); got.State != agentqtype.TaskStateAbandoned || got.Error == nil || *got.Error != agentqtype.AbandonedAfter(3) {
		t.Fatalf("abandoned task: %s, %v", got.State, got.Error)
	}
}

func TestLifecycleCancel(t *testing.T) {
	t.Parallel()
	e := lifecycleSetup(t)
	ctx := context.Background()
	id := e.insert(t, "acme")
	if _, ok, err := e.lc.Cancel(ctx, tasks.CancelParams{ID: id}); ok || !errors.Is(err, store.ErrNoTenant) {
		t.Fatalf("cancel without a tenant: %v %v, want ErrNoTenant", ok, err)
	}
	if _, ok, err := e.lc.Cancel(ctx, tasks.CancelParams{TenantID: "globex", ID: id}); ok || err != nil {
		t.Fatalf("cancel by another tenant: %v %v", ok, err)
	}
	e.wantChanges(t)
	task, ok, err := e.lc.Cancel(ctx, tasks.CancelParams{TenantID: "acme", ID: id, Reason: "cancelled by the tenant"})
	if err != nil || !ok || task.State != agentqtype.TaskStateKilled {
		t.Fatalf("cancel: %v %v %s", ok, err, task.State)
	}
	e.wantChanges(t, tasks.ChangeCancelled)
	if _, ok, err := e.lc.Cancel(ctx, tasks.CancelParams{TenantID: "acme", ID: id}); ok || err != nil {
		t.Fatalf("second cancel: %v %v", ok, err)
	}
}

// A change whose transaction fails after it (where the outbox row is written)
// leaves nothing: neither the change nor what was written with it.
func TestLifecycleRolledBackChangeLeavesNothing(t *testing.T) {
	t.Parallel()
	e := lifecycleSetup(t)
	ctx := context.Background()
	queued := e.insert(t, "acme")
	running := e.insert(t, "acme")
	stale := e.insert(t, "acme")
	silent := e.insert(t, "acme")
	run := e.start(t, running, tasks.Started)
	e.start(t, silent, tasks.Started)
	e.staleHeartbeat(t, silent)
	old := e.start(t, stale, tasks.Started)
	e.staleHeartbeat(t, stale)
	e.took()
	tables := func() (out [3]string) {
		for i, q := range []string{
			`SELECT string_agg(x::text, E'\n' ORDER BY id) FROM tasks x`,
			`SELECT COALESCE(string_agg(x::text, E'\n' ORDER BY task_id, step, meter), '') FROM usage_ledger x`,
			`SELECT string_agg(id, ',' ORDER BY id) FROM tenants`,
		} {
			if err := e.pool.QueryRow(ctx, q).Scan(&out[i]); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	before := tables()
	e.setFail(true)
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"create", func() error {
			_, _, err := e.lc.Create(ctx, store.InsertTaskParams{ID: uuid.Must(uuid.NewV7()), TenantID: "acme", Kid: "k", Agent: "sim",
				Input: json.RawMessage(`{}`), Budget: json.RawMessage(`{}`), RequestHash: []byte{1}})
			return err
		}},
		{"start", func() error { _, _, err := e.lc.Start(ctx, queued); return err }},
		{"take over", func() error { _, _, err := e.lc.Start(ctx, stale); return err }},
		{"record step", func() error {
			return e.lc.RecordStep(ctx, store.RecordStepParams{ID: running, Attempt: run.Attempt, Step: 1, Tokens: 5, CostMicro: 5})
		}},
		{"finish", func() error {
			_, err := e.lc.Finish(ctx, tasks.FinishParams{Claim: claimOf(run), To: agentqtype.TaskStateCompleted})
			return err
		}},
		{"requeue", func() error { return e.lc.Requeue(ctx, claimOf(run)) }},
		{"abandon", func() error { _, err := e.lc.Finish(ctx, abandon(claimOf(old), "gone")); return err }},
		{"requeue stale", func() error { _, _, err := e.lc.RequeueStale(ctx, silent, tasks.DefaultStaleAfter); return err }},
		{"cancel", func() error {
			_, _, err := e.lc.Cancel(ctx, tasks.CancelParams{TenantID: "acme", ID: queued})
			return err
		}},
	} {
		if err := c.call(); !errors.Is(err, errHook) {
			t.Fatalf("%s: %v, want the hook's error", c.name, err)
		}
		if after := tables(); after != before {
			t.Fatalf("%s rolled back but left:\n%v\nbefore:\n%v", c.name, after, before)
		}
	}
	e.wantChanges(t)
	// The same change commits with what was written with it once nothing fails.
	e.setFail(false)
	e.start(t, queued, tasks.Started)
	e.wantChanges(t, tasks.ChangeStarted)
	if _, err := e.st.GetTenant(ctx, e.probe); err != nil {
		t.Fatalf("the row written with the change: %v", err)
	}
}

// The last step and the end are one transaction: the ledger row of the step and the
// task's terminal row are written by the same transaction, each with its change; a
// failing hook rolls both back; a stale attempt changes neither.
func TestLifecycleRecordLastStepIsOneTransaction(t *testing.T) {
	t.Parallel()
	e := lifecycleSetup(t)
	ctx := context.Background()
	id := e.insert(t, "acme")
	task := e.start(t, id, tasks.Started)
	e.wantChanges(t, tasks.ChangeStarted)
	last := store.RecordStepParams{ID: id, Attempt: task.Attempt, Step: 1, Tokens: 4, CostMicro: 2}
	fin := tasks.FinishParams{Claim: claimOf(task), To: agentqtype.TaskStateCompleted, Output: json.RawMessage(`{"ok":true}`)}

	// The end's change fails after the step's succeeded: if they were two
	// transactions, the step would stay recorded.
	e.mu.Lock()
	e.fail, e.failOn = true, tasks.ChangeFinished
	e.mu.Unlock()
	if ok, err := e.lc.RecordLastStep(ctx, last, fin); ok || !errors.Is(err, errHook) {
		t.Fatalf("with a failing end: ok %v, %v", ok, err)
	}
	e.mu.Lock()
	e.fail, e.failOn = false, ""
	e.mu.Unlock()
	e.took()
	if got := e.get(t, id); got.State != agentqtype.TaskStateRunning || got.Usage.Steps != 0 {
		t.Fatalf("after the end's rollback: %s, %d steps; want running, 0 (the step rolled back with it)", got.State, got.Usage.Steps)
	}
	var ledger int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM usage_ledger WHERE task_id = $1`, id).Scan(&ledger); err != nil || ledger != 0 {
		t.Fatalf("ledger rows after the rollback: %d %v", ledger, err)
	}

	stale := last
	stale.Attempt = task.Attempt + 1
	if _, err := e.lc.RecordLastStep(ctx, stale, fin); !errors.Is(err, store.ErrLostClaim) {
		t.Fatalf("another attempt's last step: %v, want ErrLostClaim", err)
	}
	if ok, err := e.lc.RecordLastStep(ctx, last, fin); !ok || err != nil {
		t.Fatalf("last step: ok %v, %v", ok, err)
	}
	e.wantChanges(t, tasks.ChangeStep, tasks.ChangeFinished)
	got := e.get(t, id)
	var out struct{ OK bool }
	if got.State != agentqtype.TaskStateCompleted || got.Usage.Steps != 1 || got.Usage.Tokens != 4 || json.Unmarshal(got.Output, &out) != nil || !out.OK {
		t.Fatalf("after the last step: %+v", got)
	}
	// The end's time is when it happened, after the step's record, not when their
	// shared transaction began: worker time read from the rows (started to finished)
	// must cover the step's record, as it did when the end was a transaction of its own.
	var stepAt time.Time
	if err := e.pool.QueryRow(ctx, `SELECT recorded_at FROM usage_ledger WHERE task_id = $1 AND meter = 'steps'`, id).Scan(&stepAt); err != nil {
		t.Fatal(err)
	}
	if got.FinishedAt == nil || !got.FinishedAt.After(stepAt) {
		t.Fatalf("finished at %v, not after the step's record at %v", got.FinishedAt, stepAt)
	}
	// Again (a retry after a lost answer): nothing more is recorded, and the end is
	// not won twice.
	if ok, err := e.lc.RecordLastStep(ctx, last, fin); ok || err != nil {
		t.Fatalf("the retry: ok %v, %v; want false, nil", ok, err)
	}
	e.wantChanges(t)
}

// Concurrent creates and starts share statements and commits (group commit) and keep
// their one-at-a-time outcomes: a reused idempotency key creates one task, which every
// call using it gets back; a task started twice at once starts once.
func TestConcurrentCreatesAndStartsKeepTheirOutcomes(t *testing.T) {
	t.Run("with a change hook", func(t *testing.T) { concurrentCreatesAndStarts(t, true) })
	// Without one, as the library runs: the shared writes are single statements.
	t.Run("without", func(t *testing.T) { concurrentCreatesAndStarts(t, false) })
}

func concurrentCreatesAndStarts(t *testing.T, hooked bool) {
	e := lifecycleSetup(t)
	if !hooked {
		e.lc = tasks.NewLifecycle(e.st, tasks.LifecycleOptions{})
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	type made struct {
		t       store.Task
		created bool
		err     error
	}
	results := make([]made, 30)
	for i := range results {
		wg.Go(func() {
			p := store.InsertTaskParams{ID: uuid.Must(uuid.NewV7()), TenantID: "acme", Kid: "k", Agent: "sim",
				Input: json.RawMessage(`{"n":1}`), Budget: json.RawMessage(`{}`), RequestHash: []byte{1}}
			if i%3 == 0 {
				p.IdempotencyKey = "same" // 10 calls with one key
			}
			tk, created, err := e.lc.Create(ctx, p)
			results[i] = made{tk, created, err}
		})
	}
	wg.Wait()
	var keyed []uuid.UUID
	createdKeyed, fresh := 0, map[uuid.UUID]bool{}
	for i, r := range results {
		if r.err != nil {
			t.Fatal(r.err)
		}
		if i%3 == 0 {
			keyed = append(keyed, r.t.ID)
			if r.created {
				createdKeyed++
			}
			continue
		}
		if !r.created || r.t.State != agentqtype.TaskStateQueued || string(r.t.Input) != `{"n": 1}` {
			t.Fatalf("create %d: %+v", i, r)
		}
		fresh[r.t.ID] = true
	}
	if createdKeyed != 1 {
		t.Fatalf("the reused key created %d tasks, want 1", createdKeyed)
	}
	for _, id := range keyed {
		if id != keyed[0] {
			t.Fatalf("calls with one key got different tasks: %v", keyed)
		}
	}
	if n, err := e.st.CountTasks(ctx, store.CountTasksParams{TenantID: "acme"}); err != nil || n != 21 {
		t.Fatalf("%d tasks stored, %v; want 21", n, err)
	}
	e.took()

	// Each fresh task started by two calls at once: one starts it, the other finds it
	// running under a live attempt.
	outcomes := map[tasks.StartOutcome]int{}
	var mu sync.Mutex
	for id := range fresh {
		for range 2 {
			wg.Go(func() {
				_, out, err := e.lc.Start(ctx, id)
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				outcomes[out]++
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	if outcomes[tasks.Started] != len(fresh) || outcomes[tasks.Busy] != len(fresh) {
		t.Fatalf("start outcomes %v, want %d started and %d busy", outcomes, len(fresh), len(fresh))
	}
	for id := range fresh {
		if got := e.get(t, id); got.State != agentqtype.TaskStateRunning || got.Attempt != 1 {
			t.Fatalf("after two starts: %s attempt %d, want running attempt 1", got.State, got.Attempt)
		}
	}
	if n := len(e.took()); hooked && n != len(fresh) {
		t.Fatalf("%d start changes, want %d", n, len(fresh))
	}
}

// insertDue writes a queued task whose start deadline has just passed.
func (e *lcEnv) insertDue(t *testing.T, tenant string) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	if _, _, err := e.st.InsertTask(context.Background(), store.InsertTaskParams{ID: id, TenantID: tenant, Kid: "k", Agent: "sim",
		Input: json.RawMessage(`{}`), Budget: json.RawMessage(`{}`), RequestHash: []byte{1}, StartWithin: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	testfactory.TaskStartOverdue(t, e.pool, id)
	return id
}

// Start never starts a task past its start deadline: the same statement ends it
// expired, and the caller gets it back as Ended. A task that started once (parked
// since) is past the deadline's reach, and one within its deadline starts.
func TestLifecycleStartExpiresAnOverdueTask(t *testing.T) {
	t.Parallel()
	e := lifecycleSetup(t)
	ctx := context.Background()
	id := e.insertDue(t, "acme")
	e.took()
	task := e.start(t, id, tasks.Ended)
	if task.State != agentqtype.TaskStateExpired || task.StartedAt != nil || task.Attempt != 0 || task.FinishedAt == nil ||
		task.Error == nil || *task.Error != agentqtype.NotStartedByDeadline() {
		t.Fatalf("expired task %+v", task)
	}
	if c := e.wantChanges(t, tasks.ChangeExpired); c[0].Task.ID != id {
		t.Fatalf("change %+v", c[0])
	}
	// A second delivery finds it ended, and changes nothing.
	if again := e.start(t, id, tasks.Ended); again.State != "" {
		t.Fatalf("a second delivery got the end: %+v", again)
	}
	e.wantChanges(t)

	// Started once, then parked back to queued: the deadline no longer applies.
	resumed := e.insert(t, "acme")
	run := e.start(t, resumed, tasks.Started)
	if err := e.lc.Park(ctx, tasks.ParkParams{Claim: claimOf(run), Reason: "tokens_per_minute", Until: time.Now()}); err != nil {
		t.Fatal(err)
	}
	testfactory.TaskStartOverdue(t, e.pool, resumed)
	e.took()
	if again := e.start(t, resumed, tasks.Started); again.State != agentqtype.TaskStateRunning || again.Attempt != 2 {
		t.Fatalf("a parked task past its deadline: %+v", again)
	}
	e.wantChanges(t, tasks.ChangeStarted)

	// Within its deadline: it starts.
	timely := e.insert(t, "acme")
	testfactory.TaskStartDeadlineIn(t, e.pool, timely, time.Hour)
	if got := e.start(t, timely, tasks.Started); got.State != agentqtype.TaskStateRunning {
		t.Fatalf("a task within its deadline: %s", got.State)
	}
}

// ExpireOverdue ends the queued tasks past their start deadline once, whoever else
// tries at the same time, and leaves running, parked and timely tasks alone.
func TestLifecycleExpireOverdue(t *testing.T) {
	t.Parallel()
	e := lifecycleSetup(t)
	ctx := context.Background()
	due := []uuid.UUID{e.insertDue(t, "acme"), e.insertDue(t, "globex"), e.insertDue(t, "acme")}
	timely := e.insert(t, "acme")
	running := e.insertDue(t, "acme")
	testfactory.TaskRunning(t, e.pool, running)
	e.took()
	var mu sync.Mutex
	won := map[uuid.UUID]int{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			ts, err := e.lc.ExpireOverdue(ctx, 10)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, x := range ts {
				if x.State != agentqtype.TaskStateExpired {
					t.Errorf("returned %s", x.State)
				}
				won[x.ID]++
			}
		})
	}
	wg.Wait()
	if len(won) != len(due) {
		t.Fatalf("expired %v, want %v", won, due)
	}
	for _, id := range due {
		if won[id] != 1 {
			t.Errorf("task %s expired %d times", id, won[id])
		}
	}
	e.wantChanges(t, tasks.ChangeExpired, tasks.ChangeExpired, tasks.ChangeExpired)
	if got := e.get(t, timely); got.State != agentqtype.TaskStateQueued {
		t.Errorf("a task without a deadline: %s", got.State)
	}
	if got := e.get(t, running); got.State != agentqtype.TaskStateRunning {
		t.Errorf("a running task: %s", got.State)
	}
	if ts, err := e.lc.ExpireOverdue(ctx, 10); err != nil || len(ts) != 0 {
		t.Errorf("a second pass: %v %v", ts, err)
	}
}

// abandon are the janitor's FinishParams abandoning the task claim names.
func abandon(claim store.Claim, reason string) tasks.FinishParams {
	return tasks.FinishParams{Claim: claim, To: agentqtype.TaskStateAbandoned, Error: reason, Abandoned: true}
}
