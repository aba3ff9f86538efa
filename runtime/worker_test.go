package runtime_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/tasks/change"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/internal/testenv/testfactory"
	"github.com/agentq/agentq/internal/wire"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
	"github.com/agentq/agentq/quotas/capacity"
	"github.com/agentq/agentq/runtime"
	"github.com/agentq/agentq/scheduler"
)

// stepFunc is a Go handler agent.
type stepFunc func(ctx context.Context, req runtime.StepRequest) (runtime.StepResult, error)

// limits are the worker's limits as the App gives them: the limit store and the model
// pools.
type limits struct {
	*admission.Store
	*capacity.Pools
}

func (f stepFunc) Step(ctx context.Context, req runtime.StepRequest) (runtime.StepResult, error) {
	return f(ctx, req)
}

// logBuffer is the worker's log, written from its goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

const tenant = "acme"

// rig is a Worker over its own schema and Redis prefix, with the services around it
// that the library assembles: tasks are submitted through the tasks service, which
// admits them and puts them on the scheduler's queues.
type rig struct {
	t      testing.TB
	ctx    context.Context
	st     *store.Store
	rdb    *redis.Client
	keys   rkeys.Keys
	sched  *scheduler.Scheduler
	q      limits
	lc     *tasks.Lifecycle
	svc    *tasks.Service
	agents *runtime.Registry
	w      *runtime.Worker
	trees  *tasks.Trees
	log    *logBuffer
}

func newRig(t testing.TB, lifecycle ...tasks.LifecycleOptions) *rig {
	t.Helper()
	lcOpts := tasks.LifecycleOptions{}
	if len(lifecycle) > 0 {
		lcOpts = lifecycle[0]
	}
	return newRigWith(t, lcOpts, 2, nil)
}

// newRigWith is newRig with slots worker slots and the worker's lifecycle wrapped by
// wrap (nil: as it is), for a test that acts at a given point of a delivery.
func newRigWith(t testing.TB, lcOpts tasks.LifecycleOptions, slots int, wrap func(*rig, runtime.Lifecycle) runtime.Lifecycle) *rig {
	t.Helper()
	st := store.New(testenv.Postgres(t))
	rdb, keys := testenv.Redis(t, 1)
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, ctx: context.Background(), st: st, rdb: rdb, keys: keys,
		sched: scheduler.New(rdb, keys, scheduler.Options{WakeInProcess: true}), q: limits{admission.New(rdb, keys, nil), capacity.NewPools(rdb, keys, nil)},
		agents: runtime.NewRegistry(), log: &logBuffer{}}
	// Every end's effects, as the App's lifecycle has them.
	guard := admission.NewGuard(r.q.Store, admission.GuardOptions{Timeout: time.Second})
	r.trees = tasks.NewTrees(tasks.TreesDeps{Store: st, Queue: r.sched, Agents: r.agents, Quotas: guard, Events: outbox.Events{}})
	lcOpts.Subscribers = append(slices.Clip(lcOpts.Subscribers), tasks.NewEnds(tasks.EndsDeps{
		Leases: r.q.Store, Queue: r.sched, Pools: r.q.Pools, Redis: rdb, Keys: keys}), r.trees)
	r.lc = tasks.NewLifecycle(st, lcOpts)
	r.trees.Use(r.lc)
	if _, err := st.CreateTenant(r.ctx, store.CreateTenantParams{ID: tenant, Name: tenant, Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(r.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r.svc = tasks.New(tasks.Deps{
		Store: st, Tenants: tenants.New(st, plans, tenants.Options{}),
		Admission: guard,
		Queue:     r.sched, Agents: r.agents, Redis: rdb, Keys: keys, Lifecycle: r.lc, Archetype: &baseservice.Archetype{Logger: logger},
	})
	queues := map[string]int{keys.TaskQueue(): 1}
	var lc runtime.Lifecycle = r.lc
	if wrap != nil {
		lc = wrap(r, lc)
	}
	r.w = runtime.NewWorker(lc, st, r.agents, r.sched, r.q, rdb, runtime.WorkerOptions{
		// Asynq servers of one slot each (two by default), as a loaded worker runs several.
		Concurrency: slots, Fetchers: slots, Queues: queues, DrainQueues: scheduler.LegacyQueues(keys), CancelChannel: keys.CancelChannel(),
		ShutdownTimeout: time.Second, TaskCheckInterval: 10 * time.Millisecond,
		Archetype: &baseservice.Archetype{Logger: logger}, Policies: tenants.NewPolicies(plans, 16), Events: keys.TaskEvents,
		Trees: r.trees,
	})
	return r
}

// start runs the worker and a dispatcher feeding it, as the worker and scheduler
// roles do, until the test ends.
func (r *rig) start() {
	r.t.Helper()
	if err := r.w.Start(r.ctx); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(r.w.Stop)
	d := scheduler.NewDispatcher(r.sched, r.rdb, asynq.NewClientFromRedisClient(r.rdb), scheduler.DispatcherOptions{
		FallbackEvery: 20 * time.Millisecond,
	})
	if err := d.Start(r.ctx); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(d.Stop)
}

func (r *rig) submit(agent, input string, b *tasks.BudgetRequest) uuid.UUID {
	r.t.Helper()
	res, err := r.svc.Submit(r.ctx, tasks.SubmitParams{TenantID: tenant, Kid: "k", Agent: agent,
		Input: json.RawMessage(input), Budget: b})
	if err != nil {
		r.t.Fatal(err)
	}
	return res.Task.ID
}

// take dispatches the next task as the dispatcher would and returns the asynq task
// it would have sent, for a call of the worker's handler: no asynq server runs.
func (r *rig) take() *asynq.Task {
	r.t.Helper()
	if err := r.sched.Heartbeat(r.ctx, "test-pool", 4, time.Minute); err != nil { // the pool's capacity
		r.t.Fatal(err)
	}
	p, err := r.sched.Take(r.ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	body, err := json.Marshal(p)
	if err != nil {
		r.t.Fatal(err)
	}
	return asynq.NewTask(wire.TaskType, body)
}

// process runs the worker's handler on the next dispatched task to its end.
func (r *rig) process() {
	r.t.Helper()
	if err := r.w.ProcessTask(r.ctx, r.take()); err != nil {
		r.t.Fatalf("process: %v", err)
	}
	if err := r.w.Flush(r.ctx); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) task(id uuid.UUID) store.Task {
	r.t.Helper()
	t, err := r.st.GetTask(r.ctx, store.GetTaskParams{TenantID: tenant, ID: id})
	if err != nil {
		r.t.Fatal(err)
	}
	return t
}

func (r *rig) waitState(id uuid.UUID, want store.TaskState) store.Task {
	r.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		t := r.task(id)
		if t.State == want {
			return t
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("task %s is %s, want %s; log:\n%s", id, t.State, want, r.log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (r *rig) ledgerRows(id uuid.UUID) int {
	r.t.Helper()
	rows, err := r.st.TaskLedger(r.ctx, store.TaskLedgerParams{TenantID: tenant, TaskID: id})
	if err != nil {
		r.t.Fatal(err)
	}
	return len(rows)
}

func (r *rig) leaseHeld(id uuid.UUID) bool {
	r.t.Helper()
	sess, long, err := r.q.Leases(r.ctx, tenant)
	if err != nil {
		r.t.Fatal(err)
	}
	return slices.Contains(sess, id.String()) || slices.Contains(long, id.String())
}

func (r *rig) slotHeld(id uuid.UUID) bool {
	r.t.Helper()
	running, err := r.sched.RunningMembers(r.ctx, tenant)
	if err != nil {
		r.t.Fatal(err)
	}
	return slices.Contains(running, id.String())
}

// wantReleased checks that the ended task holds neither its session lease nor its
// dispatch slot: the worker's release comes right after the terminal state.
func (r *rig) wantReleased(id uuid.UUID) {
	r.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for r.leaseHeld(id) || r.slotHeld(id) {
		if time.Now().After(deadline) {
			r.t.Fatalf("the ended task still holds its lease (%v) or its slot (%v)", r.leaseHeld(id), r.slotHeld(id))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// counter counts steps in its state and is done after "steps" steps (never with
// steps 0), reporting tokens and cost_usd per step.
func counter(t testing.TB) stepFunc {
	return func(_ context.Context, req runtime.StepRequest) (runtime.StepResult, error) {
		var in struct {
			Steps  int     `json:"steps"`
			Tokens int64   `json:"tokens"`
			Cost   float64 `json:"cost_usd"`
		}
		var st struct{ N int }
		if err := json.Unmarshal(req.Input, &in); err != nil {
			return runtime.StepResult{}, err
		}
		if len(req.State) > 0 && string(req.State) != "null" {
			if err := json.Unmarshal(req.State, &st); err != nil {
				return runtime.StepResult{}, err
			}
		}
		if st.N != req.Step-1 {
			t.Errorf("step %d got the state of step %d", req.Step, st.N)
		}
		st.N = req.Step
		state, _ := json.Marshal(st)
		res := runtime.StepResult{State: state, Done: in.Steps > 0 && req.Step >= in.Steps,
			Usage: runtime.StepUsage{Tokens: in.Tokens, CostUSD: in.Cost}}
		if res.Done {
			res.Output = json.RawMessage(fmt.Sprintf(`{"n":%d}`, st.N))
		}
		return res, nil
	}
}

// A task submitted for a Go handler goes from the scheduler's queue through the
// dispatcher and asynq to the worker, which runs its steps, handing each one the
// state the previous one returned, records each step's usage and ends it completed,
// giving back its lease and its slot.
func TestWorkerRunsAGoHandlerToCompletion(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.agents.Register("counter", counter(t))
	r.start()
	id := r.submit("counter", `{"steps":3,"tokens":10,"cost_usd":0.001}`, nil)
	got := r.waitState(id, agentqtype.TaskStateCompleted)
	if got.Usage != (store.Usage{Steps: 3, Tokens: 30, CostMicroUSD: 3000}) || got.Attempt != 1 || got.Error != nil {
		t.Fatalf("completed task: usage %+v, attempt %d, error %v", got.Usage, got.Attempt, got.Error)
	}
	var out struct{ N int }
	if err := json.Unmarshal(got.Output, &out); err != nil || out.N != 3 {
		t.Fatalf("output %s", got.Output)
	}
	if n := r.ledgerRows(id); n != 9 {
		t.Fatalf("ledger: %d rows, want 3 meters for each of 3 steps", n)
	}
	r.wantReleased(id)
}

// A task an earlier version sent to the asynq queue of its priority band (high or
// low) is still run: the worker drains those queues.
func TestWorkerDrainsTheLegacyPriorityQueues(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	legacy := scheduler.LegacyQueues(r.keys)
	t.Cleanup(func() { r.rdb.SRem(context.Background(), "asynq:queues", append(legacy, r.keys.TaskQueue())) })
	r.agents.Register("counter", counter(t))
	id := r.submit("counter", `{"steps":1}`, nil)
	msg := r.take()
	if _, err := asynq.NewClientFromRedisClient(r.rdb).EnqueueContext(r.ctx, msg, asynq.Queue(legacy[1]), asynq.TaskID(id.String())); err != nil {
		t.Fatal(err)
	}
	r.start()
	r.waitState(id, agentqtype.TaskStateCompleted)
	r.wantReleased(id)
}

// A pro task pauses when its next step would take it past its cost or its wall
// clock (a step still running at the deadline is stopped and not recorded; no step
// runs that would pass the cost cap by what the previous step cost), naming the limit
// and keeping its usage; at max_steps it stops (pro's on_limit for the step cap), and
// so it does at a cost cap whose plan ceiling has no room for the next step.
func TestWorkerPausesATaskAtItsBudget(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		input  string
		budget tasks.BudgetRequest
		usage  store.Usage
		limit  string
		state  store.TaskState
	}{
		{"wall clock", `{"block":true}`, tasks.BudgetRequest{MaxWallclockS: ptr(0.2)},
			store.Usage{}, "task_max_wallclock_s", agentqtype.TaskStatePaused},
		{"cost", `{"tokens":1,"cost_usd":0.3}`, tasks.BudgetRequest{MaxCostUSD: ptr(0.5)},
			store.Usage{Steps: 1, Tokens: 1, CostMicroUSD: 300_000}, "task_max_cost_usd", agentqtype.TaskStatePaused},
		{"cost at the ceiling", `{"tokens":1,"cost_usd":0.6}`, tasks.BudgetRequest{MaxCostUSD: ptr(1.0)},
			store.Usage{Steps: 1, Tokens: 1, CostMicroUSD: 600_000}, "task_max_cost_usd", agentqtype.TaskStateBudgetExceeded},
		{"steps", `{"tokens":1}`, tasks.BudgetRequest{MaxSteps: ptr(2)},
			store.Usage{Steps: 2, Tokens: 2}, "task_max_steps", agentqtype.TaskStateBudgetExceeded},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			count := counter(t)
			var stopped bool
			r.agents.Register("a", stepFunc(func(ctx context.Context, req runtime.StepRequest) (runtime.StepResult, error) {
				if strings.Contains(string(req.Input), "block") {
					<-ctx.Done()
					stopped = true
					return runtime.StepResult{}, ctx.Err()
				}
				return count(ctx, req)
			}))
			id := r.submit("a", c.input, &c.budget)
			began := time.Now()
			r.process()
			got := r.task(id)
			paused := got.State == agentqtype.TaskStatePaused && got.Pause.Reason != nil && *got.Pause.Reason == c.limit && got.Error == nil
			ended := got.State == agentqtype.TaskStateBudgetExceeded && got.Error != nil && strings.Contains(*got.Error, strings.TrimPrefix(c.limit, "task_"))
			if got.State != c.state || !(paused || ended) || got.Usage != c.usage {
				t.Fatalf("task: %s at %v, error %v, usage %+v; want %s at %s, %+v", got.State, got.Pause.Reason, deref(got.Error), got.Usage, c.state, c.limit, c.usage)
			}
			if strings.Contains(c.input, "block") && (!stopped || time.Since(began) > 2*time.Second) {
				t.Fatalf("the step past the deadline was not stopped at it (stopped %v after %v)", stopped, time.Since(began))
			}
			if n := r.ledgerRows(id); n != 3*c.usage.Steps {
				t.Fatalf("ledger: %d rows, want %d", n, 3*c.usage.Steps)
			}
			r.wantReleased(id)
		})
	}
}

// A tenant's cancel reaches the worker running the task: the step's context ends at
// once (long before the task's heartbeat would notice), nothing of the step is
// recorded and the task stays killed; the worker gives its slot back.
func TestWorkerStopsACancelledStep(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	started, stopped := make(chan struct{}), make(chan error, 1)
	r.agents.Register("slow", stepFunc(func(ctx context.Context, _ runtime.StepRequest) (runtime.StepResult, error) {
		close(started)
		<-ctx.Done()
		stopped <- ctx.Err()
		return runtime.StepResult{Done: true, Usage: runtime.StepUsage{Tokens: 5}}, nil
	}))
	r.start()
	id := r.submit("slow", `{}`, nil)
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatalf("the step never started; log:\n%s", r.log)
	}
	if _, err := r.svc.Cancel(r.ctx, tenant, id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		t.Fatal("the cancelled step's context did not end")
	}
	r.wantReleased(id)
	got := r.task(id)
	if got.State != agentqtype.TaskStateKilled || got.Usage != (store.Usage{}) || got.Error == nil || *got.Error != "cancelled by the tenant" {
		t.Fatalf("cancelled task: %s, usage %+v, error %v", got.State, got.Usage, deref(got.Error))
	}
	if n := r.ledgerRows(id); n != 0 {
		t.Fatalf("the interrupted step wrote %d ledger rows", n)
	}
}

// A worker whose task was taken over by another attempt while its step ran (it
// stalled past its heartbeat) stops when it finds out: it records neither the step
// nor an end, and leaves the lease and the slot to the attempt that owns them now.
//
// A take-over needs the heartbeat silent for the lifecycle's StaleAfter; with 1 ms,
// the worker too knows that its claim may have lapsed by its last step's end, so it
// lets the end's write decide whose the slots are before it gives any back.
func TestWorkerThatLostItsClaimStopsWithoutWriting(t *testing.T) {
	t.Parallel()
	r := newRig(t, tasks.LifecycleOptions{StaleAfter: time.Millisecond})
	started, proceed := make(chan struct{}), make(chan struct{})
	r.agents.Register("stalled", stepFunc(func(context.Context, runtime.StepRequest) (runtime.StepResult, error) {
		close(started)
		<-proceed
		return runtime.StepResult{Done: true, Output: json.RawMessage(`{}`), Usage: runtime.StepUsage{Tokens: 5, CostUSD: 0.01}}, nil
	}))
	id := r.submit("stalled", `{}`, nil)
	done := make(chan error, 1)
	go func() { done <- r.w.ProcessTask(r.ctx, r.take()) }()
	<-started
	testfactory.TaskHeartbeatAgo(t, r.st.Pool(), id, time.Minute)
	if next, out, err := r.lc.Start(r.ctx, id); err != nil || out != tasks.TookOver || next.Attempt != 2 {
		t.Fatalf("take over: %v attempt %d, %v", out, next.Attempt, err)
	}
	time.Sleep(2 * time.Millisecond) // past half the StaleAfter since the worker's start
	close(proceed)
	if err := <-done; err != nil {
		t.Fatalf("process: %v", err)
	}
	got := r.task(id)
	if got.State != agentqtype.TaskStateRunning || got.Attempt != 2 || got.Usage != (store.Usage{}) || r.ledgerRows(id) != 0 {
		t.Fatalf("the stopped attempt wrote: %s, attempt %d, usage %+v, %d ledger rows", got.State, got.Attempt, got.Usage, r.ledgerRows(id))
	}
	if !r.leaseHeld(id) || !r.slotHeld(id) {
		t.Fatalf("the stopped attempt released the new one's lease (%v) or slot (%v)", r.leaseHeld(id), r.slotHeld(id))
	}
	if !strings.Contains(r.log.String(), "another attempt took the task over") {
		t.Fatalf("no log of the lost claim:\n%s", r.log)
	}
}

// A failing step ends the task failed. The error the tenant reads names the agent,
// the step and the kind of failure; neither it nor the operator's log shows the
// agent URL's credentials.
func TestWorkerRecordsAFailedStepWithARedactedError(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		http.Error(w, "upstream model unavailable", http.StatusBadGateway)
	}))
	t.Cleanup(agent.Close)
	url := strings.Replace(agent.URL, "http://", "http://ops:pa55word@", 1) + "/step?token=tok-123"
	r.agents.Register("remote", &runtime.HTTPAgent{Name: "remote", URL: url, Secret: []byte("aqsig_x"),
		Headers: map[string]string{"Authorization": "Bearer hdr-secret"}, MaxAttempts: 2, Backoff: time.Millisecond})
	id := r.submit("remote", `{}`, nil)
	r.process()
	got := r.task(id)
	want := `step failed: agent "remote", step 1: answered HTTP 502 (after 2 attempts)`
	if got.State != agentqtype.TaskStateFailed || got.Error == nil || *got.Error != want || got.Usage != (store.Usage{}) {
		t.Fatalf("failed task: %s, error %q, usage %+v; want failed with %q", got.State, deref(got.Error), got.Usage, want)
	}
	log := r.log.String()
	if !strings.Contains(log, "agent step failed") || !strings.Contains(log, "token=REDACTED") {
		t.Fatalf("the log does not detail the failure with the URL redacted:\n%s", log)
	}
	for _, secret := range []string{"pa55word", "tok-123", "hdr-secret"} {
		if strings.Contains(*got.Error, secret) || strings.Contains(log, secret) {
			t.Fatalf("%q shows in the task's error %q or the log:\n%s", secret, *got.Error, log)
		}
	}
	r.wantReleased(id)
}

// A step whose usage cannot be billed fails the task: nothing of that step is
// recorded, and its reservation of the tenant's step quota goes back, so the quota
// counts only the steps before it.
func TestWorkerFailsAStepWithUnusableUsageAndBillsNothingOfIt(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	count := counter(t)
	r.agents.Register("a", stepFunc(func(ctx context.Context, req runtime.StepRequest) (runtime.StepResult, error) {
		res, err := count(ctx, req)
		if req.Step == 3 {
			res.Usage.Tokens = -1
		}
		return res, err
	}))
	id := r.submit("a", `{"tokens":3}`, nil)
	r.process()
	got := r.task(id)
	want := `step failed: agent "a", step 3: usage.tokens -1 is negative`
	if got.State != agentqtype.TaskStateFailed || deref(got.Error) != want || got.Usage != (store.Usage{Steps: 2, Tokens: 6}) {
		t.Fatalf("task: %s, error %q, usage %+v; want failed with %q after 2 steps", got.State, deref(got.Error), got.Usage, want)
	}
	if n := r.ledgerRows(id); n != 3*2 {
		t.Fatalf("ledger: %d rows, want %d", n, 3*2)
	}
	if steps := r.stepsCounted(); steps != 2 {
		t.Fatalf("the tenant's step quota counts %d steps, want 2", steps)
	}
	r.wantReleased(id)
}

// stepsCounted sums the tenant's step quota counter over its hours.
func (r *rig) stepsCounted() int {
	r.t.Helper()
	hours, err := r.rdb.HVals(r.ctx, r.keys.StepsDaily(tenant)).Result()
	if err != nil {
		r.t.Fatal(err)
	}
	var steps int
	for _, h := range hours {
		var n int
		if _, err := fmt.Sscan(h, &n); err != nil {
			r.t.Fatalf("steps counter %q: %v", h, err)
		}
		steps += n
	}
	return steps
}

// A shutdown that outlasts a step hands the task back: the delivery fails so asynq
// delivers it again, the task is queued with its recorded steps and agent state, and
// the interrupted step's reservation goes back. The next delivery resumes from the
// last recorded step.
func TestWorkerHandsATaskInterruptedByShutdownBack(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	count := counter(t)
	blocked := make(chan struct{})
	var once sync.Once
	r.agents.Register("a", stepFunc(func(ctx context.Context, req runtime.StepRequest) (runtime.StepResult, error) {
		if req.Step == 2 {
			once.Do(func() {
				close(blocked)
				<-ctx.Done()
			})
			if ctx.Err() != nil {
				return runtime.StepResult{}, ctx.Err()
			}
		}
		return count(ctx, req)
	}))
	id := r.submit("a", `{"steps":3,"tokens":3}`, nil)
	delivery := r.take()
	ctx, shutdown := context.WithCancel(r.ctx)
	go func() { <-blocked; shutdown() }()
	err := r.w.ProcessTask(ctx, delivery)
	if err == nil || !strings.Contains(err.Error(), "re-queued") {
		t.Fatalf("the interrupted delivery returned %v, want a re-queue error", err)
	}
	got := r.task(id)
	if got.State != agentqtype.TaskStateQueued || got.Usage != (store.Usage{Steps: 1, Tokens: 3}) {
		t.Fatalf("after the shutdown: %s, usage %+v; want queued after 1 step", got.State, got.Usage)
	}
	if n := r.stepsCounted(); n != 1 {
		t.Fatalf("the tenant's step quota counts %d steps, want 1", n)
	}
	if err := r.w.ProcessTask(r.ctx, delivery); err != nil {
		t.Fatalf("the second delivery: %v", err)
	}
	if err := r.w.Flush(r.ctx); err != nil {
		t.Fatal(err)
	}
	got = r.task(id)
	if got.State != agentqtype.TaskStateCompleted || got.Usage != (store.Usage{Steps: 3, Tokens: 9}) || string(got.Output) != `{"n": 3}` {
		t.Fatalf("after the second delivery: %s, usage %+v, output %s; want completed after 3 steps", got.State, got.Usage, got.Output)
	}
	r.wantReleased(id)
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

func ptr[T any](v T) *T { return &v }

// A delivery gives its dispatch slots back as soon as its last step returns, and the
// end is recorded afterwards. A janitor pass that saw the task running in Postgres
// meanwhile, missing from the running set, and put it back is undone by the end's
// second release: the slot is free once the end is recorded.
func TestDeliveryReleasesItsSlotBeforeItsEndIsRecorded(t *testing.T) {
	t.Parallel()
	recording, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r := newRig(t, tasks.LifecycleOptions{Subscribers: []tasks.Subscriber{change.Funcs{Tx: func(_ context.Context, _ *store.Store, c tasks.Change) error {
		if c.Kind == tasks.ChangeStep || c.Kind == tasks.ChangeFinished {
			once.Do(func() { close(recording); <-proceed })
		}
		return nil
	}}}})
	r.agents.Register("counter", counter(t))
	id := r.submit("counter", `{"steps":1,"tokens":3}`, nil)
	done := make(chan error, 1)
	go func() { done <- r.w.ProcessTask(r.ctx, r.take()) }()
	<-recording
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("process: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the delivery waited for its end to be recorded")
	}
	if r.slotHeld(id) {
		t.Fatal("the delivery returned holding its slot")
	}
	if got := r.task(id); got.State != agentqtype.TaskStateRunning {
		t.Fatalf("task is %s before its end's write committed, want running", got.State)
	}
	// The janitor's running-set pass, in the window: running in Postgres, not in the set.
	if err := r.sched.AddRunning(r.ctx, tenant, id.String()); err != nil {
		t.Fatal(err)
	}
	close(proceed)
	if err := r.w.Flush(r.ctx); err != nil {
		t.Fatal(err)
	}
	if got := r.task(id); got.State != agentqtype.TaskStateCompleted {
		t.Fatalf("task is %s, want completed", got.State)
	}
	if r.slotHeld(id) || r.leaseHeld(id) {
		t.Fatalf("after the end: slot held %v, lease held %v; want both free", r.slotHeld(id), r.leaseHeld(id))
	}
}

// BenchmarkProcessTask measures one delivery of a five-step task, from the worker's
// handler to its recorded end; the submission and dispatch are outside the timer.
func BenchmarkProcessTask(b *testing.B) {
	r := newRig(b)
	r.agents.Register("counter", counter(b))
	// The enterprise plan's daily step quota holds the benchmark's steps.
	if _, err := r.st.CreateTenant(r.ctx, store.CreateTenantParams{ID: "bench", Name: "bench", Plan: "enterprise"}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := range b.N {
		b.StopTimer()
		// A key of its own per task: the benchmark submits faster than one key may.
		if _, err := r.svc.Submit(r.ctx, tasks.SubmitParams{TenantID: "bench", Kid: fmt.Sprint("k", i), Agent: "counter",
			Input: json.RawMessage(`{"steps":5,"tokens":3,"cost_usd":0.001}`)}); err != nil {
			b.Fatal(err)
		}
		task := r.take()
		b.StartTimer()
		if err := r.w.ProcessTask(r.ctx, task); err != nil {
			b.Fatal(err)
		}
		if err := r.w.Flush(r.ctx); err != nil {
			b.Fatal(err)
		}
	}
}
