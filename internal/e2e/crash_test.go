package e2e_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/appparts"
	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/internal/testenv/testfactory"
	"github.com/agentq/agentq/internal/wire"
)

// Tasks admitted while Redis was down (degraded mode) wait in Postgres; once a
// scheduler runs against a live Redis, the recovery sweep pushes them, in order, and
// they run.
func TestQueuedTasksMissingFromRedisAreRecovered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dead := testenv.DeadRedis(t)
	down := e.start(t, func(o *agentq.Options) {
		o.Redis = dead
		o.Config.Roles = []string{config.RoleAPI}
	})
	key := down.tenantWith("rc", "enterprise", map[string]client.Limit{"agent_steps_daily": client.Unlimited, "ai_tokens_monthly": client.Unlimited, "usd_monthly": client.Unlimited}, nil)
	var ids []string
	for range 3 {
		var task struct{ ID string }
		if st, _ := down.do("POST", "/v1/tasks", key, `{"agent":"sim","input":{"steps":1,"step_ms":1}}`, &task); st != 202 {
			t.Fatalf("degraded submit: %d", st)
		}
		ids = append(ids, task.ID)
	}
	down.stop()

	// Redis is back: a process without the janitor (whose generation check would
	// repair this too) recovers the tasks once they are older than the sweep's grace
	// period (5 s: a push may still be on its way).
	up := e.start(t, func(o *agentq.Options) {
		o.Config.Roles = []string{config.RoleAPI, config.RoleScheduler, config.RoleWorker}
		appparts.SetRecoveryEvery(o, 500*time.Millisecond)
	})
	c := client.New(up.base, key)
	for _, id := range ids {
		waitState(t, c, id, "completed", 20*time.Second)
	}
}

// A task whose Redis entry vanished (FLUSHDB without persistence) is pushed again.
func TestRecoveryAfterRedisDataLoss(t *testing.T) {
	t.Parallel()
	h := start(t, func(o *agentq.Options) { o.Config.WorkerConcurrency = 1 })
	ctx := context.Background()
	c, _ := h.tenantClient("dl", "pro", map[string]client.Limit{"running": 1})
	blocker, _ := c.SubmitTask(ctx, sim(1, 1500))
	waitState(t, c, blocker.ID, "running", 10*time.Second)
	queued, _ := c.SubmitTask(ctx, sim(1, 1))
	// The tenant queues are gone, and the janitor's generation marker with them: the
	// leader notices within a second and pushes the queued task back.
	testenv.DeletePrefix(ctx, h.app.Redis(), h.app.Keys().Prefix()+"{")
	waitState(t, c, queued.ID, "completed", 20*time.Second)
}

// A task whose worker died mid-run (kill -9) is redelivered by asynq; the new worker
// sees the stale heartbeat, takes the task over and resumes after its last step. A
// redelivery while the first worker is alive leaves the task alone.
func TestRedeliveredTaskOfADeadWorkerIsTakenOver(t *testing.T) {
	t.Parallel()
	h := start(t, func(o *agentq.Options) { o.Config.Roles = []string{config.RoleAPI} })
	ctx := context.Background()
	c, _ := h.tenantClient("crash", "pro", nil)
	task, err := c.SubmitTask(ctx, sim(3, 1))
	if err != nil {
		t.Fatal(err)
	}
	// The dead worker had started the task and finished one step.
	testfactory.TaskRunningAs(t, h.app.Store().Pool(), task.ID,
		testfactory.Running{Steps: 1, AgentState: []byte(`{"done":1}`), HeartbeatAge: 5 * time.Second})
	payload := []byte(`{"task_id":"` + task.ID + `","tenant_id":"crash","priority":5}`)
	if err := h.app.Worker().ProcessTask(ctx, asynq.NewTask(wire.TaskType, payload)); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.GetTask(ctx, task.ID); got.State != "running" || got.Usage.Steps != 1 {
		t.Fatalf("a redelivery took over a task whose worker is alive: %s, %d steps", got.State, got.Usage.Steps)
	}
	testfactory.TaskHeartbeatAgo(t, h.app.Store().Pool(), task.ID, time.Minute)
	if err := h.app.Worker().ProcessTask(ctx, asynq.NewTask(wire.TaskType, payload)); err != nil {
		t.Fatal(err)
	}
	if err := h.app.Worker().Flush(ctx); err != nil { // the end is recorded after the delivery returns
		t.Fatal(err)
	}
	got, _ := c.GetTask(ctx, task.ID)
	if got.State != "completed" || got.Usage.Steps != 3 || got.Attempt != 2 {
		t.Fatalf("after takeover: %s, %d steps, attempt %d; want completed, 3 steps (resumed at step 2), attempt 2", got.State, got.Usage.Steps, got.Attempt)
	}
}

// A worker that stalled past its lease, whose task another attempt took over, stops
// at its next write: its step is recorded nowhere (ledger, usage, Redis quota), and
// the task's lease and running slot, which belong to the new owner, stay as they are.
func TestStalledWorkerStopsWhenItsTaskWasTakenOver(t *testing.T) {
	t.Parallel()
	h := start(t, func(o *agentq.Options) { o.Config.Roles = []string{config.RoleAPI} })
	ctx := context.Background()
	c, k := h.tenantClient("fence", "pro", nil)
	task, err := c.SubmitTask(ctx, sim(3, 400))
	if err != nil {
		t.Fatal(err)
	}
	payload := []byte(`{"task_id":"` + task.ID + `","tenant_id":"fence","priority":5}`)
	done := make(chan error, 1)
	go func() { done <- h.app.Worker().ProcessTask(ctx, asynq.NewTask(wire.TaskType, payload)) }()
	waitState(t, c, task.ID, "running", 5*time.Second)
	// Attempt 1 is in its first step. Another worker takes the task over, as
	// TakeOverTask does, and holds its running slot.
	db := h.app.Store().Pool()
	testfactory.TaskTakenOver(t, db, task.ID)
	if err := h.app.Scheduler().AddRunning(ctx, "fence", task.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the stalled delivery returned %v, want nil (the task is the new owner's)", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stalled worker kept working on a task it lost")
	}
	got, _ := c.GetTask(ctx, task.ID)
	if got.State != "running" || got.Attempt != 2 || got.Usage.Steps != 0 {
		t.Fatalf("task after the stalled attempt stopped: %s, attempt %d, %d steps; want running, attempt 2, 0 steps", got.State, got.Attempt, got.Usage.Steps)
	}
	if rows, _ := h.app.Store().TaskLedger(ctx, store.TaskLedgerParams{TenantID: task.TenantID, TaskID: uuid.MustParse(task.ID)}); len(rows) != 0 {
		t.Fatalf("the stalled attempt's step is in the ledger: %v", rows)
	}
	if used := h.usage(k.Key)["agent_steps_daily"]["used"]; used != 0.0 {
		t.Fatalf("agent_steps_daily used %v, want the stalled step's reservation refunded", used)
	}
	if sess, _, _ := h.app.Quotas().Leases(ctx, "fence"); !slices.Contains(sess, task.ID) {
		t.Fatalf("the new owner's lease was released: %v", sess)
	}
	if members, _ := h.app.Scheduler().RunningMembers(ctx, "fence"); !slices.Contains(members, task.ID) {
		t.Fatalf("the new owner's running slot was freed: %v", members)
	}
}
