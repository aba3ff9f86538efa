package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/internal/testenv/testfactory"
)

func newTask(t *testing.T, ctx context.Context, st *store.Store, tenant string) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	if _, _, err := st.InsertTask(ctx, store.InsertTaskParams{ID: id, TenantID: tenant, Kid: "k", Agent: "sim",
		Input: json.RawMessage(`{}`), Budget: json.RawMessage(`{}`), RequestHash: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	return id
}

// recordStep is UnscopedRecordStep for tests that look at its error only.
func recordStep(ctx context.Context, st *store.Store, p store.RecordStepParams) error {
	_, _, err := st.UnscopedRecordStep(ctx, p)
	return err
}

// requeue is UnscopedRequeueTask for tests that look at its error only.
func requeue(ctx context.Context, st *store.Store, c store.Claim) error {
	_, err := st.UnscopedRequeueTask(ctx, c)
	return err
}

func setup(t *testing.T) (context.Context, *store.Store, *pgxpool.Pool) {
	pool := testenv.Postgres(t)
	st := store.New(pool)
	ctx := context.Background()
	if _, err := st.CreateTenant(ctx, store.CreateTenantParams{ID: "acme", Name: "Acme", Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	return ctx, st, pool
}

// A worker that stalled past its lease, whose task another worker took over, can no
// longer write anything on it.
func TestStalledWorkerWritesAreFenced(t *testing.T) {
	t.Parallel()
	ctx, st, pool := setup(t)
	id := newTask(t, ctx, st, "acme")
	a, ok, err := st.UnscopedStartTask(ctx, id)
	if err != nil || !ok || a.Attempt != 1 {
		t.Fatalf("start: %v %v attempt %d", ok, err, a.Attempt)
	}
	claimA := store.Claim{ID: id, Attempt: a.Attempt}
	if err := recordStep(ctx, st, store.RecordStepParams{ID: id, Attempt: claimA.Attempt, Step: 1, Tokens: 10, CostMicro: 5}); err != nil {
		t.Fatal(err)
	}
	// A stalls: its heartbeat goes stale, and a redelivery takes the task over.
	testfactory.TaskHeartbeatAgo(t, pool, id, time.Minute)
	b, ok, err := st.UnscopedTakeOverTask(ctx, id, 30*time.Second)
	if err != nil || !ok || b.Attempt != 2 {
		t.Fatalf("take over: %v %v attempt %d", ok, err, b.Attempt)
	}
	before, _ := st.GetTask(ctx, store.GetTaskParams{TenantID: "acme", ID: id})
	heartbeat := func() (hb time.Time) {
		if err := pool.QueryRow(ctx, `SELECT heartbeat_at FROM tasks WHERE id = $1`, id).Scan(&hb); err != nil {
			t.Fatal(err)
		}
		return hb
	}
	hbBefore := heartbeat()

	lost := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, store.ErrLostClaim) {
			t.Errorf("%s by the stalled attempt: %v, want ErrLostClaim", what, err)
		}
	}
	lost("RecordStep", recordStep(ctx, st, store.RecordStepParams{ID: id, Attempt: claimA.Attempt, Step: 2, Tokens: 10, CostMicro: 5}))
	lost("Heartbeat", st.UnscopedHeartbeat(ctx, claimA))
	lost("RequeueTask", requeue(ctx, st, claimA))
	_, ok, err = st.UnscopedFinishTask(ctx, store.UnscopedFinishTaskParams{ID: id, Attempt: claimA.Attempt, From: []store.TaskState{agentqtype.TaskStateRunning},
		To: agentqtype.TaskStateFailed, Error: "stalled"})
	if ok {
		t.Error("FinishTask by the stalled attempt won the terminal transition")
	}
	lost("FinishTask", err)

	after, _ := st.GetTask(ctx, store.GetTaskParams{TenantID: "acme", ID: id})
	if after.State != agentqtype.TaskStateRunning || after.Attempt != 2 || after.Usage != before.Usage || after.Error != nil ||
		!after.CreatedAt.Equal(before.CreatedAt) {
		t.Fatalf("the stalled attempt changed the task: %+v (before %+v)", after, before)
	}
	if !heartbeat().Equal(hbBefore) {
		t.Fatal("the stalled attempt's heartbeat was written")
	}
	if rows, _ := st.TaskLedger(ctx, store.TaskLedgerParams{TenantID: "acme", TaskID: id}); len(rows) != 3 {
		t.Fatalf("ledger has %d rows, want the 3 of step 1 only", len(rows))
	}
	// The new owner's writes go through.
	claimB := store.Claim{ID: id, Attempt: b.Attempt}
	if err := st.UnscopedHeartbeat(ctx, claimB); err != nil {
		t.Fatal(err)
	}
	if err := recordStep(ctx, st, store.RecordStepParams{ID: id, Attempt: claimB.Attempt, Step: 2, Tokens: 10, CostMicro: 5}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := st.UnscopedFinishTask(ctx, store.UnscopedFinishTaskParams{ID: id, Attempt: claimB.Attempt, From: []store.TaskState{agentqtype.TaskStateRunning},
		To: agentqtype.TaskStateCompleted}); err != nil || !ok {
		t.Fatalf("finish by the owner: %v %v", ok, err)
	}
	// After the end, the owner's late writes say the task ended.
	if err := st.UnscopedHeartbeat(ctx, claimB); !errors.Is(err, store.ErrTaskEnded) {
		t.Fatalf("heartbeat after the end: %v, want ErrTaskEnded", err)
	}
}

// A re-queued task (the janitor found its heartbeat stale) is not the stalled
// worker's any more, even before another worker starts it.
func TestRequeuedTaskIsFenced(t *testing.T) {
	t.Parallel()
	ctx, st, pool := setup(t)
	id := newTask(t, ctx, st, "acme")
	a, _, _ := st.UnscopedStartTask(ctx, id)
	testfactory.TaskHeartbeatAgo(t, pool, id, time.Minute)
	if _, ok, err := st.UnscopedRequeueStale(ctx, id, 30*time.Second); err != nil || !ok {
		t.Fatalf("requeue stale: %v %v", ok, err)
	}
	claim := store.Claim{ID: id, Attempt: a.Attempt}
	if err := recordStep(ctx, st, store.RecordStepParams{ID: id, Attempt: a.Attempt, Step: 1}); !errors.Is(err, store.ErrLostClaim) {
		t.Fatalf("record on a re-queued task: %v", err)
	}
	if err := requeue(ctx, st, claim); !errors.Is(err, store.ErrLostClaim) {
		t.Fatalf("requeue on a re-queued task: %v", err)
	}
	if got, _ := st.GetTask(ctx, store.GetTaskParams{TenantID: "acme", ID: id}); got.State != agentqtype.TaskStateQueued || got.Usage.Steps != 0 {
		t.Fatalf("task %s, %d steps", got.State, got.Usage.Steps)
	}
}

// ledgerAndUsage returns the task's steps as the ledger bills them and as its usage
// counts them.
func ledgerAndUsage(t *testing.T, ctx context.Context, st *store.Store, id uuid.UUID) (ledger, usage store.Usage, state store.TaskState) {
	t.Helper()
	rows, err := st.TaskLedger(ctx, store.TaskLedgerParams{TenantID: "acme", TaskID: id})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		switch r.Meter {
		case "steps":
			ledger.Steps += int(r.Quantity)
		case "tokens":
			ledger.Tokens += r.Quantity
		case "cost_micro_usd":
			ledger.CostMicroUSD += r.Quantity
		}
	}
	tk, err := st.GetTask(ctx, store.GetTaskParams{TenantID: "acme", ID: id})
	if err != nil {
		t.Fatal(err)
	}
	return ledger, tk.Usage, tk.State
}

// A cancel that commits while a step record is between its ledger insert and its
// usage update: the record must wait for the cancel and then write nothing.
func TestCancelCommittingDuringStepRecord(t *testing.T) {
	t.Parallel()
	ctx, st, pool := setup(t)
	id := newTask(t, ctx, st, "acme")
	task, _, _ := st.UnscopedStartTask(ctx, id)
	// The cancel's UPDATE holds the row lock, uncommitted, while the record runs.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	testfactory.TaskEnded(t, tx, id, "killed")
	done := make(chan error, 1)
	go func() {
		done <- recordStep(ctx, st, store.RecordStepParams{ID: id, Attempt: task.Attempt, Step: 1, Tokens: 100, CostMicro: 1000})
	}()
	// Wait until the record blocks on the task's row lock.
	deadline := time.Now().Add(5 * time.Second)
	for {
		var waiting int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query ILIKE '%tasks%'
			AND datname = current_database()`).Scan(&waiting)
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the step record never waited for the cancel's lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, store.ErrTaskEnded) {
		t.Fatalf("record after the cancel: %v, want ErrTaskEnded", err)
	}
	ledger, usage, state := ledgerAndUsage(t, ctx, st, id)
	if state != agentqtype.TaskStateKilled || ledger != (store.Usage{}) || usage != (store.Usage{}) {
		t.Fatalf("state %s, ledger %+v, usage %+v: want killed with nothing billed", state, ledger, usage)
	}
}

// Cancel and step record racing freely, many times: each time the step is in the
// ledger and in the task's usage, or in neither.
func TestCancelRacingStepRecordBillsConsistently(t *testing.T) {
	t.Parallel()
	ctx, st, _ := setup(t)
	const rounds = 150
	recorded, refused := 0, 0
	for i := range rounds {
		id := newTask(t, ctx, st, "acme")
		task, _, _ := st.UnscopedStartTask(ctx, id)
		var wg sync.WaitGroup
		var recErr, finErr error
		var won bool
		start := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			recErr = recordStep(ctx, st, store.RecordStepParams{ID: id, Attempt: task.Attempt, Step: 1, Tokens: 100, CostMicro: 1000})
		}()
		go func() {
			defer wg.Done()
			<-start
			if i%2 == 1 {
				time.Sleep(time.Duration(i%7) * 100 * time.Microsecond)
			}
			_, won, finErr = st.FinishTask(ctx, store.FinishTaskParams{ID: id, TenantID: "acme",
				From: []store.TaskState{agentqtype.TaskStateQueued, agentqtype.TaskStateRunning}, To: agentqtype.TaskStateKilled, Error: "cancelled"})
		}()
		close(start)
		wg.Wait()
		if finErr != nil || !won {
			t.Fatalf("round %d: cancel %v %v", i, won, finErr)
		}
		switch {
		case recErr == nil:
			recorded++
		case errors.Is(recErr, store.ErrTaskEnded):
			refused++
		default:
			t.Fatalf("round %d: record: %v", i, recErr)
		}
		ledger, usage, state := ledgerAndUsage(t, ctx, st, id)
		if state != agentqtype.TaskStateKilled || ledger != usage {
			t.Fatalf("round %d: state %s, ledger bills %+v, usage counts %+v (record err %v)", i, state, ledger, usage, recErr)
		}
		want := store.Usage{}
		if recErr == nil {
			want = store.Usage{Steps: 1, Tokens: 100, CostMicroUSD: 1000}
		}
		if usage != want {
			t.Fatalf("round %d: usage %+v, want %+v (record err %v)", i, usage, want, recErr)
		}
	}
	t.Logf("%d rounds: step recorded before the cancel %d times, refused after it %d times", rounds, recorded, refused)
}

// Completing last steps together writes each task's step once, by its first entry,
// skips a stale claim and a task whose step was recorded before, and adds to the
// rollups only what it wrote.
func TestCompleteLastStepsWritesEachStepOnce(t *testing.T) {
	ctx, st, pool := setup(t)
	if _, err := st.CreateTenant(ctx, store.CreateTenantParams{ID: "globex", Name: "Globex", Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	for i := range 4 {
		tenant := "acme"
		if i == 3 {
			tenant = "globex" // a second tenant in the batch: its own rollups
		}
		id := newTask(t, ctx, st, tenant)
		if _, ok, err := st.UnscopedStartTask(ctx, id); err != nil || !ok {
			t.Fatal(ok, err)
		}
		ids = append(ids, id)
	}
	step := func(id uuid.UUID, attempt int, tokens int64) store.LastStep {
		return store.LastStep{RecordStepParams: store.RecordStepParams{ID: id, Attempt: attempt, Step: 1, Tokens: tokens}, Output: json.RawMessage(`{}`)}
	}
	got, err := st.UnscopedCompleteLastSteps(ctx, []store.LastStep{
		step(ids[0], 1, 5), step(ids[0], 1, 7), // twice: the first counts
		step(ids[1], 2, 9), // another attempt's claim
		step(ids[3], 1, 100),
		step(ids[2], 1, 3),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Task.ID != ids[0] || got[1].Task.ID != ids[3] || got[2].Task.ID != ids[2] {
		t.Fatalf("written %+v, want ids[0], ids[3] and ids[2]", got)
	}
	if g := got[1]; g.Tenant.ID != "globex" || g.Usage.PeriodTokens != 100 || g.Usage.PeriodSteps != 1 || g.Usage.DaySteps != 1 {
		t.Fatalf("globex's step: tenant %s, usage %+v", g.Tenant.ID, g.Usage)
	}
	got = []store.RecordedStep{got[0], got[2]}
	if got[0].Task.Usage.Tokens != 5 || got[0].Usage.PeriodTokens != 5 || got[1].Usage.PeriodTokens != 8 || got[1].Usage.DaySteps != 2 {
		t.Fatalf("usage: %+v / %+v", got[0].Usage, got[1].Usage)
	}
	var steps, tokens int64
	if err := pool.QueryRow(ctx, `SELECT steps, tokens FROM usage_rollup_period WHERE tenant_id = 'acme'`).Scan(&steps, &tokens); err != nil || steps != 2 || tokens != 8 {
		t.Fatalf("period rollup %d steps %d tokens (%v), want 2, 8", steps, tokens, err)
	}
	// Again: recorded before, nothing written.
	if again, err := st.UnscopedCompleteLastSteps(ctx, []store.LastStep{step(ids[0], 1, 5)}); err != nil || len(again) != 0 {
		t.Fatalf("a retry wrote %+v, %v", again, err)
	}
	if task, err := st.GetTask(ctx, store.GetTaskParams{TenantID: "acme", ID: ids[1]}); err != nil || task.State != agentqtype.TaskStateRunning {
		t.Fatalf("the stale claim's task: %+v %v", task, err)
	}
}
