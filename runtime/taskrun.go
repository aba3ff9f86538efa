package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/telemetry"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/internal/wire"
	"github.com/agentq/agentq/quotas"
)

// taskRun is one delivery of a task, from its claim to its end, as River's job
// executor is one job's. Its methods are the delivery's phases (claim, prepare,
// reserve, call the agent, record, settle, finish) and its fields are what the phases
// share, so that a step allocates no closures over the loop's variables. A taskRun is
// used by one goroutine at a time: the delivery's, then, once the delivery hands its
// end off, the goroutine recording the end; the heartbeat reads only what does not
// change while the steps run.
type taskRun struct {
	w   *Worker
	ctx context.Context // the delivery's: its span, and asynq's cancellation
	log *slog.Logger
	p   wire.Payload

	task  store.Task
	id    string // task.ID
	claim store.Claim

	// began is when the delivery began; confirmed is when, after began, it last sent
	// a write that found its claim on the task current (its start, a step's record,
	// a heartbeat); monotonic.
	began     time.Time
	confirmed atomic.Int64

	// running queues the "running" message until it is sent: with the first step's
	// reservation, or ahead of an end or a re-queue that comes before it, so that the
	// stream keeps its order.
	running func(redis.Pipeliner)

	tenant       store.Tenant
	policy       *tenants.Policy // the tenant's policy; nil when it is not known
	budget       quotas.TaskBudget
	ceiling      *quotas.TaskBudget // the plan's budget ceiling; nil when the plan is not known
	onLimit      quotas.OnLimits    // the plan's answer at each limit: stop or pause
	maxPaused    int64              // the tenant's paused_tasks (< 0: no bound)
	pauseTimeout time.Duration      // how long the plan lets a task stay paused
	exec         Executor
	startedAt    time.Time // the task's first start: the wall clock counts from it
	deadline     time.Time
	maxCostMicro int64

	// taskCtx ends with the task (a cancel, a lost claim, the delivery's end); the
	// heartbeat goroutine closes hbDone when it stops.
	taskCtx context.Context
	cancel  context.CancelCauseFunc
	hbDone  chan struct{}

	state json.RawMessage // the agent's state after the last recorded step
	// res is the current step's reservation, of the tenant's quotas and of the
	// agent's model pool, with the estimates the next step reserves.
	res reservation
	// parked is when the capacity a parked task waits for is expected (end endParked);
	// waitsChildren: the park is a wait for the task's children.
	parked        time.Time
	waitsChildren bool
	// spawned and children go with the next step's request: what became of the
	// previous step's spawns, and, after a wait for them, the task's children.
	spawned  []agentqtype.SpawnOutcome
	children []agentqtype.ChildResult
	// lastAnswer is the state and output of the delivery's previous step, same how
	// many steps in a row have answered it (see repeats); maxRepeat the plan's bound.
	lastAnswer [2]json.RawMessage
	same       int
	maxRepeat  int

	// lost is set when a write found the task claimed by a later attempt (this worker
	// stalled past its lease): the run then stops at once and touches nothing of the
	// task's.
	lost bool
	// end is the task's terminal write still to make (see recordEnd), fin its
	// terminal state and last, for an end that is the last step's record, the step.
	end  endKind
	fin  tasks.FinishParams
	last lastStep
}

// endKind is the terminal write a run leaves to make.
type endKind uint8

const (
	noEnd       endKind = iota // no write: re-queued, cancelled, lost, or left to the janitor
	endFinish                  // the terminal state alone
	endLastStep                // the last step's record and the terminal state, in one transaction
	endParked                  // queued in Postgres to wait for token capacity: park it in Redis
	endPaused                  // paused in Postgres at a limit: free its slots and its session
)

// outcome is what a phase of a task run says of the run.
type outcome uint8

const (
	proceed  outcome = iota // on to the next phase
	stopped                 // the run ends: the task ended, paused, parked or was lost, or is left to the janitor
	requeued                // the run ends with the task back in queued, for asynq to deliver again
)

// lastStep is a task's last step, recorded with its end.
type lastStep struct {
	rec    store.RecordStepParams
	booked quotas.StepParams // what to settle against the step's quota reservation, with the end
	ev     Event
}

// execute claims the task, runs it and hands its end off; an error makes asynq
// deliver the task again later.
func (r *taskRun) execute(id uuid.UUID) error {
	if ok, err := r.claimTask(id); !ok {
		return err
	}
	if r.run() == requeued {
		return fmt.Errorf("runtime: task %s interrupted by shutdown; re-queued", id)
	}
	if r.lost {
		// Another attempt owns the task now, with its lease and its dispatch slots:
		// this delivery leaves them alone.
		return nil
	}
	r.handOff()
	return nil
}

// claimTask starts the task under this delivery's claim. It returns ok = false when
// there is nothing to run: the task ended already, or another live delivery owns it.
func (r *taskRun) claimTask(id uuid.UUID) (ok bool, err error) {
	w, p := r.w, r.p
	r.confirm(time.Now())
	// A start that ends the task expired (past its start deadline) hands its end's
	// Redis calls over, to go with the slot release.
	sctx, carried := tasks.CarryEnd(r.ctx)
	task, outcome, err := w.lifecycle.Start(sctx, id)
	if err != nil {
		return false, fmt.Errorf("runtime: start task: %w", err)
	}
	if span := trace.SpanFromContext(r.ctx); span.IsRecording() {
		span.SetAttributes(attribute.String("agentq.start", outcome.String()), attribute.Int("agentq.attempt", task.Attempt))
	}
	if outcome == tasks.Started && task.StartedAt != nil && task.Usage.Steps == 0 && task.Attempt == 1 {
		w.wait.Record(context.WithoutCancel(r.ctx), max(task.StartedAt.Sub(task.CreatedAt).Seconds(), 0))
	}
	switch outcome {
	case tasks.Ended:
		// Cancelled while dispatched, or a duplicate delivery of a finished task.
		// Releasing again is harmless; it covers a release lost to a crash. Or this
		// start found the task past its start deadline and ended it expired: its
		// end's calls (lease, state message) were carried here.
		w.release(p, -1, append([]func(redis.Pipeliner){w.queueReleaseLease(p.TenantID, p.TaskID)}, carried.Calls()...)...)
		return false, nil
	case tasks.Busy:
		return false, nil // another live delivery owns it
	case tasks.TookOver:
		w.log.Warn("taking over a task whose worker stopped heartbeating; resuming from its last step",
			"task_id", id, "steps_done", task.Usage.Steps, "attempt", task.Attempt)
	}
	r.task = task
	return true, nil
}

// handOff gives the delivery's dispatch slots back and has the task's end recorded.
func (r *taskRun) handOff() {
	w, p := r.w, r.p
	// The worker slot was busy from delivery to here: that is the task's worker time,
	// which its tenant's fair share is charged.
	took := time.Since(r.began)
	switch r.end {
	case noEnd:
		w.release(p, took)
		return
	case endParked:
		w.park(r, took)
		return
	case endPaused:
		// Its lease and slots went back with the pause (releasePaused): a resume may
		// have dispatched it again since, so nothing of its is freed here.
		w.publish(r.ctx, wire.StateProgress(r.id, string(agentqtype.TaskStatePaused), r.fin.Error))
		return
	}
	// The slots go back before the end is written, so that the next task starts while
	// Postgres records this one (as River's completer does): the pool's slots count
	// running agents, not pending writes. Only while no other attempt can have taken
	// the task over, though: its claim was confirmed less than half the take-over
	// silence ago. Otherwise the end's write decides first whose slots they are.
	if took-time.Duration(r.confirmed.Load()) < w.lifecycle.StaleAfter()/2 {
		w.release(p, took)
		w.endTask(r.ctx, r)
		return
	}
	if tail, lost := r.recordEnd(context.WithoutCancel(r.ctx)); !lost {
		w.release(p, took, tail...)
	}
}

// confirm notes that a write sent at sent found the delivery's claim current.
func (r *taskRun) confirm(sent time.Time) { r.confirmed.Store(int64(sent.Sub(r.began))) }

// run executes steps until the task ends. It returns requeued if the task was put
// back to queued (worker shutdown, or the quota store unreachable): asynq retries it
// later. It sets r.lost when a write found the task claimed by a later attempt.
//
// The task's terminal write is not made here: run leaves it in r.end, and the
// delivery makes it once the dispatch slots are released.
func (r *taskRun) run() (out outcome) {
	// One With: each call renders its attributes into the handler anew.
	r.log = r.w.log.With(append([]any{"task_id", r.task.ID, "tenant_id", r.task.TenantID, "agent", r.task.Agent,
		"attempt", r.task.Attempt}, telemetry.SpanAttrs(r.ctx)...)...)
	r.id = r.task.ID.String()
	r.claim = store.Claim{ID: r.task.ID, Attempt: r.task.Attempt}
	r.running = r.w.queuePublish(r.ctx, wire.StateProgress(r.id, string(agentqtype.TaskStateRunning), ""))
	// Registered before any step runs: a panicking executor still ends the task and
	// releases its lease.
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("executor panicked", "panic", p)
			r.finish(agentqtype.TaskStateFailed, agentqtype.AgentPanicked(r.task.Agent), nil, nil)
			out = stopped
		}
	}()
	if out := r.prepare(); out != proceed {
		return out
	}
	r.startHeartbeat()
	defer r.stopHeartbeat()
	return r.steps()
}

// prepare reads what the steps need: the tenant's limits, the agent and the budget.
// It returns proceed unless the task ends or goes back before its first step.
func (r *taskRun) prepare() outcome {
	err := holdUntilRecorded(r.ctx, r.log, func(ctx context.Context) error {
		var err error
		r.tenant, err = r.w.tenants.GetTenant(ctx, r.task.TenantID)
		return err
	})
	if err != nil {
		return r.requeue("reading the tenant failed", err)
	}
	r.res = reservation{limits: r.w.limits, batch: r.w.batch, log: r.log, tenant: r.task.TenantID, quotas: quotas.NoLimits(), weight: 1}
	r.maxRepeat = quotas.DefaultMaxRepeatSteps // the plan's once its policy is read
	r.maxPaused = -1
	var planBudget *quotas.Budget
	if r.w.opts.Policies != nil {
		if p, err := r.w.opts.Policies.Policy(r.tenant); err == nil {
			r.policy = &p
			if p.MaxRepeatSteps > 0 {
				r.maxRepeat = p.MaxRepeatSteps
			}
			r.res.quotas, planBudget, r.res.weight = p.Limits, &p.Budget, max(p.Weight, 1)
			r.onLimit, r.ceiling, r.pauseTimeout = p.OnLimit, &p.Budget.Ceiling, p.PauseTimeout
			if l, ok := p.Effective[quotas.PausedTasks]; ok && l >= 0 {
				r.maxPaused = int64(l)
			}
		}
	}
	var unknown *agentqtype.UnknownAgentError
	err = holdUntilRecorded(r.ctx, r.log, func(ctx context.Context) error {
		var err error
		r.exec, err = r.w.agents.Lookup(ctx, r.task.Agent)
		if errors.As(err, &unknown) {
			return nil // not transient: no retry
		}
		return err
	})
	switch {
	case unknown != nil:
		r.finish(agentqtype.TaskStateFailed, unknown.Error(), nil, nil)
		return stopped
	case err != nil:
		return r.requeue("looking the agent up failed", err)
	}
	if err := r.lookUpPool(); err != nil {
		return r.requeue("looking the agent's model pool up failed", err)
	}
	r.budget = taskBudget(r.task.Budget, planBudget)
	// The wall clock counts from the task's first start: a take-over or a requeue
	// does not give it a fresh budget.
	r.startedAt = time.Now()
	if r.task.StartedAt != nil {
		r.startedAt = *r.task.StartedAt
	}
	// Time spent parked for token capacity is not charged to the wall clock; a wait
	// after a throttled answer is (waited_ms leaves it out).
	r.deadline = r.startedAt.Add(time.Duration(r.budget.MaxWallclockS*float64(time.Second)) + r.waited())
	r.maxCostMicro = int64(math.Round(r.budget.MaxCostUSD * 1e6))
	r.state = r.task.AgentState
	if e := r.task.Wait.StepEstimate; e != nil {
		r.res.next = *e // the estimate the step asked for when it parked or paused
	}
	if e := r.task.Wait.StepCostEstimate; e != nil {
		r.res.cost = max(*e, 0) // what the previous step cost, before the park or pause
	}
	return proceed
}

// waited is the time the task spent parked, waiting for token capacity.
func (r *taskRun) waited() time.Duration { return time.Duration(r.task.WaitedMs) * time.Millisecond }

// lookUpPool finds the model pool the task's agent draws on, if any.
func (r *taskRun) lookUpPool() error {
	if r.w.opts.Pools == nil {
		return nil
	}
	var err error
	if r.res.pool, r.res.bound, err = r.w.opts.Pools.Binding(r.ctx, r.task.Agent); err == nil {
		return nil // nearly always: from the binding cache, no timer needed
	}
	return holdUntilRecorded(r.ctx, r.log, func(ctx context.Context) error {
		var err error
		r.res.pool, r.res.bound, err = r.w.opts.Pools.Binding(ctx, r.task.Agent)
		return err
	})
}

// startHeartbeat stamps the task alive while it runs, and keeps its session lease
// from expiring, so a redelivery can tell a dead worker from a slow step; it also
// makes the task interruptible by a cancel. stopHeartbeat undoes both.
func (r *taskRun) startHeartbeat() {
	r.taskCtx, r.cancel = context.WithCancelCause(r.ctx)
	r.hbDone = make(chan struct{})
	go r.heartbeat()
	r.w.mu.Lock()
	r.w.running[r.task.ID] = r.cancel
	r.w.mu.Unlock()
}

func (r *taskRun) stopHeartbeat() {
	r.w.mu.Lock()
	delete(r.w.running, r.task.ID)
	r.w.mu.Unlock()
	r.cancel(nil)
	<-r.hbDone
}

// heartbeat beats every taskHeartbeatEvery until the task ends.
func (r *taskRun) heartbeat() {
	defer close(r.hbDone)
	t := time.NewTicker(taskHeartbeatEvery)
	defer t.Stop()
	for {
		select {
		case <-r.taskCtx.Done():
			return
		case <-t.C:
			if !r.beat() {
				return
			}
		}
	}
}

// beat stamps the task's heartbeat and touches its lease. It returns false when the
// task must stop: another attempt owns it, or it ended meanwhile.
func (r *taskRun) beat() bool {
	sent := time.Now()
	err := r.w.lifecycle.Heartbeat(r.taskCtx, r.claim)
	if err == nil {
		r.confirm(sent)
	}
	switch {
	case errors.Is(err, store.ErrLostClaim):
		// Stop the step: its result could not be recorded anyway.
		r.cancel(err)
		return false
	case errors.Is(err, store.ErrTaskEnded):
		r.cancel(errCancelled) // ended meanwhile (a cancel whose message was lost)
		return false
	case err != nil && r.taskCtx.Err() == nil:
		r.log.Warn("task heartbeat failed", "err", err)
	}
	if err := r.w.limits.TouchLease(r.taskCtx, r.task.TenantID, r.id); err != nil && r.taskCtx.Err() == nil {
		r.log.Warn("lease heartbeat failed", "err", err)
	}
	return true
}

// steps runs the task's steps, each through its phases, until one ends the run.
func (r *taskRun) steps() outcome {
	for {
		step := r.task.Usage.Steps + 1
		if r.task.Spawned != nil {
			if out := r.takeSpawned(); out != proceed {
				return out
			}
		}
		if r.overBudget(step) || r.overTreeBudget() {
			return stopped
		}
		if out := r.reserve(); out != proceed {
			return out
		}
		res, err := r.callAgent(step)
		if out := r.afterCall(step, res, err); out != proceed {
			return out
		}
		if out := r.record(step, res); out != proceed {
			return out
		}
	}
}

// overBudget stops or pauses the task (its plan's on_limit) when its next step would
// go past its budget: past its step cap, past its wall clock, or past its cost cap by
// what the previous step cost (the estimate the step reserves). The check comes
// before the step, so the step that would cross the limit never runs unpaid; it is
// quotas.BudgetRoom, the rule a resume is judged by.
func (r *taskRun) overBudget(step int) bool {
	b := &r.budget
	sf := quotas.BudgetRoom(*b, r.use(step-1), r.nextStep())
	if sf == nil {
		return false
	}
	switch sf.LimitType {
	case quotas.TaskMaxSteps:
		r.atLimit(agentqtype.BudgetReached("max_steps", b.MaxSteps), sf.Stop())
	case quotas.TaskMaxCostUSD:
		r.atLimit(agentqtype.BudgetReached("max_cost_usd", b.MaxCostUSD), sf.Stop())
	default:
		r.atLimit(r.wallclockStop())
	}
	return true
}

// use is what the task has used of its budget before its next step (steps done).
func (r *taskRun) use(steps int) quotas.TaskUse {
	u := quotas.TaskUse{Steps: steps, CostMicro: r.task.Usage.CostMicroUSD}
	if !r.deadline.IsZero() {
		wall := time.Duration(r.budget.MaxWallclockS * float64(time.Second))
		u.Wall = wall - time.Until(r.deadline)
	}
	return u
}

// nextStep is what the next step is expected to take: the tokens it reserves and
// what the previous step cost.
func (r *taskRun) nextStep() quotas.NextStep {
	return quotas.NextStep{Tokens: r.tokenEstimate(), CostMicro: r.res.cost}
}

func (r *taskRun) pastDeadline() bool {
	return !r.deadline.IsZero() && !time.Now().Before(r.deadline)
}

// wallclockStop is the error text and the limit of a task at its wall-clock budget.
func (r *taskRun) wallclockStop() (string, quotas.Stop) {
	return agentqtype.BudgetReached("max_wallclock_s", r.budget.MaxWallclockS),
		quotas.Stop{LimitType: quotas.TaskMaxWallclock, Limit: int64(math.Round(r.budget.MaxWallclockS)),
			Used: int64(math.Round((time.Since(r.startedAt) - r.waited()).Seconds()))}
}

// atLimit stops the task budget_exceeded at the limit stop names, or pauses it there
// when its plan says so for that limit (on_limit).
// A budget limit whose plan ceiling leaves no room for the next step stops the task
// even where the plan pauses: no raise could resume it, only pause it again.
func (r *taskRun) atLimit(text string, stop quotas.Stop) {
	if r.onLimit.For(stop.LimitType) == quotas.OnLimitPause {
		if !r.raisable(stop.LimitType) {
			r.finish(agentqtype.TaskStateBudgetExceeded, text+" (the plan's ceiling: no raise can resume it)", nil, &stop)
			return
		}
		r.pauseAt(text, stop)
		return
	}
	r.finish(agentqtype.TaskStateBudgetExceeded, text, nil, &stop)
}

// raisable reports whether a raise within the plan's ceiling could let the next step
// run past the limit limitType: always for a tenant's quota (its use falls and an
// operator may raise it), for a budget field when the ceiling has room for the step.
func (r *taskRun) raisable(limitType string) bool {
	switch limitType {
	case quotas.TaskMaxSteps, quotas.TaskMaxCostUSD, quotas.TaskMaxWallclock:
	default:
		return true
	}
	if r.ceiling == nil {
		return true
	}
	return quotas.BudgetRoom(*r.ceiling, r.use(r.task.Usage.Steps), r.nextStep()) == nil
}

// pauseAt pauses the task at the limit stop names: it keeps its state and usage, and
// the delivery then frees its worker, running slot and session (handOff).
func (r *taskRun) pauseAt(text string, stop quotas.Stop) {
	r.flushRunning()
	var bound *tasks.PausedBoundError
	err := holdUntilRecorded(context.WithoutCancel(r.ctx), r.log, func(ctx context.Context) error {
		_, err := r.w.lifecycle.Pause(ctx, tasks.PauseParams{Claim: r.claim, Stop: stop, Next: r.nextStep(),
			TenantID: r.task.TenantID, MaxPaused: r.maxPaused, Timeout: r.pauseTimeout})
		if errors.As(err, &bound) {
			return nil // an answer, not a failure to retry
		}
		return err
	})
	switch {
	case bound != nil:
		// Its tenant has as many tasks paused as its plan allows: this one stops.
		r.finish(agentqtype.TaskStateBudgetExceeded, text+"; "+bound.Error(), nil, &stop)
	case errors.Is(err, store.ErrLostClaim):
		r.lostClaim("pause", err)
	case errors.Is(err, store.ErrTaskEnded):
		// cancelled meanwhile: the cancel released what the task held
	case err != nil:
		// Postgres stayed away: the task stays running there, its heartbeat stops,
		// and the janitor re-queues it; its next delivery meets the limit again.
		r.log.Error("pausing the task failed; leaving it to the janitor", "limit_type", stop.LimitType, "err", err)
	default:
		r.end = endPaused
		r.fin = tasks.FinishParams{Claim: r.claim, To: agentqtype.TaskStatePaused, Error: text}
		r.log.Info("task paused at a limit", "limit_type", stop.LimitType, "limit", stop.Limit, "used", stop.Used, "why", text)
		r.releasePaused()
	}
}

// releasePaused gives a paused task's session lease and dispatch slots back before
// its pause goes further: a paused task holds neither. The lease goes first, in the
// same round trip (scheduler.Paused), and the slot release names the task's next
// dispatch anew. A resume waits until the task has left its running set, so it never
// takes this delivery's lease for its own, and the dispatch it makes is never this
// delivery's asynq message. While Redis is away the release is retried (each try frees
// what is left, nothing more); past that, or if this process dies first, the lease
// and running-set passes free them, treating a paused task as ended.
func (r *taskRun) releasePaused() {
	w, p := r.w, r.p
	took := time.Since(r.began)
	wait := 50 * time.Millisecond
	for deadline := time.Now().Add(pauseReleaseFor); ; wait = min(2*wait, time.Second) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := w.slots.Paused(ctx, p, took, w.queueReleaseLease(p.TenantID, p.TaskID))
		cancel()
		if err == nil {
			return
		}
		if time.Now().Add(wait).After(deadline) {
			r.log.Error("freeing a paused task's slots failed; the janitor frees them", "err", err)
			return
		}
		time.Sleep(wait)
	}
}

// pauseReleaseFor bounds how long a worker retries freeing a paused task's slots.
const pauseReleaseFor = 30 * time.Second

// reserve reserves the next step's capacity (reservation.Reserve), with the
// "running" message before the first step in the round trip of its quotas. It
// returns proceed when the step may run; otherwise a quota ended or paused the task,
// the capacity is not there (the task parks), or a store could not be asked (the task
// goes back).
func (r *taskRun) reserve() outcome {
	var along []func(redis.Pipeliner)
	if r.running != nil {
		along, r.running = append(along, r.running), nil // a lost message is re-read from Postgres
	}
	ctx, cancel := quotaCtx(r.ctx)
	defer cancel()
	err := r.res.Reserve(ctx, r.tenant.Anchor().PeriodAt(time.Now()), r.tokenEstimate(), along...)
	var qe *quotas.QuotaExceeded
	var wait *quotas.CapacityWait
	switch {
	case err == nil:
		r.meterParks()
		return proceed
	case errors.As(err, &qe):
		r.atLimit(agentqtype.QuotaReached(qe.Error()), qe.Stop())
		return stopped
	case errors.As(err, &wait):
		r.parkFor(wait.Reason, wait.Wait)
		return stopped
	case errors.Is(err, errPoolStore):
		return r.requeue(errPoolStore.Error(), err)
	}
	return r.requeue(errQuotaStore.Error(), err)
}

// meterParks records how many times the step about to run parked before it did:
// the parks of the delivery's first step are in the task as it was claimed, a later
// step of the same delivery never parked.
func (r *taskRun) meterParks() {
	parks := 0
	if w := r.task.Wait; w.ParkStep != nil && *w.ParkStep == r.task.Usage.Steps {
		parks = w.StepParks
	}
	r.task.Wait.ParkStep = nil
	r.w.stepParks.Record(context.WithoutCancel(r.ctx), int64(parks), metric.WithAttributes(attribute.String("pool", r.res.pool.Pool.Name)))
}

// tokenEstimate is what the next step reserves of tokens: the agent's own estimate
// from its previous step, else the running average of its tenant's steps with this
// agent, else its pool binding's default, else nothing (settlement books what it
// used).
func (r *taskRun) tokenEstimate() int64 {
	if r.res.next > 0 {
		return min(r.res.next, MaxStepTokens)
	}
	if avg, ok := r.w.est.get(r.task.TenantID, r.task.Agent); ok {
		return avg
	}
	if r.res.bound {
		return r.res.pool.TokensPerStep
	}
	return 0
}

// parkFor sends the task back to queued, to wait without a worker until its capacity
// is expected (wait from now). The delivery then parks it in Redis (handOff).
func (r *taskRun) parkFor(reason agentqtype.WaitReason, wait time.Duration) {
	r.flushRunning()
	tokens, cost := r.res.Park(r.ctx)
	until := time.Now().Add(wait)
	err := holdUntilRecorded(context.WithoutCancel(r.ctx), r.log, func(ctx context.Context) error {
		return r.w.lifecycle.Park(ctx, tasks.ParkParams{Claim: r.claim, Reason: string(reason), Until: until,
			StepEstimate: tokens, StepCostEstimate: cost})
	})
	switch {
	case errors.Is(err, store.ErrLostClaim):
		r.lostClaim("park", err)
	case errors.Is(err, store.ErrTaskEnded):
		// cancelled meanwhile: the cancel released what the task held
	case err != nil:
		// Postgres stayed away: the task stays running there, its heartbeat stops,
		// and the janitor re-queues it.
		r.log.Error("parking the task failed; leaving it to the janitor", "wait_reason", reason, "err", err)
	default:
		r.end, r.parked = endParked, until
		r.log.Debug("task parked for token capacity", "wait_reason", reason, "wait", wait)
		r.w.capWait.Record(context.WithoutCancel(r.ctx), wait.Seconds(), metric.WithAttributes(attribute.String("reason", string(reason))))
		parked := wire.StateProgress(r.id, string(agentqtype.TaskStateQueued), "")
		parked.WaitReason, parked.WaitUntil = string(reason), &until
		r.w.publish(r.ctx, parked)
	}
}

// callAgent runs one step of the agent, in its own span, within the wall-clock budget.
func (r *taskRun) callAgent(step int) (StepResult, error) {
	// Attributes only on a span that records: built for one the sampler dropped, they
	// are allocations thrown away.
	spanCtx, stepSpan := r.w.tracer.Start(r.taskCtx, "agentq.step")
	if stepSpan.IsRecording() {
		stepSpan.SetAttributes(attribute.String("agentq.task_id", r.id), attribute.String("agentq.agent", r.task.Agent),
			attribute.Int("agentq.step", step))
	}
	stepCtx, stepCancel := spanCtx, context.CancelFunc(func() {})
	if !r.deadline.IsZero() {
		stepCtx, stepCancel = context.WithDeadline(spanCtx, r.deadline)
	}
	res, err := r.exec.Step(stepCtx, StepRequest{
		TaskID: r.id, TenantID: r.task.TenantID, Agent: r.task.Agent,
		Step: step, Input: r.task.Input, State: r.state, Spawned: r.spawned, Children: r.children,
	})
	r.spawned, r.children = nil, nil
	stepCancel()
	if err != nil {
		stepSpan.RecordError(err)
		stepSpan.SetStatus(codes.Error, "step failed")
	} else if stepSpan.IsRecording() {
		stepSpan.SetAttributes(attribute.Int64("agentq.tokens", res.Usage.Tokens), attribute.Bool("agentq.done", res.Done))
	}
	stepSpan.End()
	if err != nil || r.taskCtx.Err() != nil {
		// Failed, or interrupted: the step is recorded nowhere, so its reservation
		// goes back.
		r.res.Refund(r.ctx)
	}
	return res, err
}

// afterCall decides what a step's result does to the task: it returns proceed unless
// the step failed, was interrupted or reported unusable usage.
func (r *taskRun) afterCall(step int, res StepResult, err error) outcome {
	switch {
	case errors.Is(context.Cause(r.taskCtx), store.ErrLostClaim):
		r.lostClaim("heartbeat", context.Cause(r.taskCtx))
		return stopped
	case errors.Is(context.Cause(r.taskCtx), errCancelled):
		return stopped // the cancel already made the task "killed"
	case r.ctx.Err() != nil:
		// Shutdown outlasted the step: hand the task back so it resumes elsewhere.
		return r.requeue("worker shutdown", r.ctx.Err())
	case err != nil && r.pastDeadline():
		// The wall clock cut the step short: it is recorded nowhere (its reservation
		// went back), so a paused task resumes at that step.
		r.atLimit(r.wallclockStop())
		return stopped
	case err != nil:
		// The tenant sees the agent, the step and the kind of failure; the
		// detail (agent URL redacted) is for the operator.
		var se *StepError
		if errors.As(err, &se) {
			r.log.Warn("agent step failed", "step", step, "kind", se.Kind, "attempts", se.Attempts, "detail", se.Detail)
		}
		r.finish(agentqtype.TaskStateFailed, err.Error(), nil, nil)
		return stopped
	}
	if res.Throttled != nil {
		r.throttled(res.Throttled)
		return stopped
	}
	if err := r.checkSpawns(res); err != nil {
		r.res.Refund(r.ctx)
		r.log.Warn("agent asked for unusable spawns; failing the task", "step", step, "err", err)
		r.finish(agentqtype.TaskStateFailed, fmt.Sprintf("%v: agent %q, step %d: %v", ErrStepFailed, r.task.Agent, step, err), nil, nil)
		return stopped
	}
	if err := checkUsage(res.Usage); err != nil {
		// Nothing of this step is billed: give the reservation back, record nothing.
		r.res.Refund(r.ctx)
		r.log.Warn("agent reported unusable usage; failing the task", "step", step, "err", err)
		r.finish(agentqtype.TaskStateFailed, fmt.Sprintf("%v: agent %q, step %d: %v", ErrStepFailed, r.task.Agent, step, err), nil, nil)
		return stopped
	}
	return proceed
}

// throttled handles a step the agent's upstream refused: the step does not count and
// the pool hears of the refusal (reservation.Throttled), and the task waits the retry
// time, or its tenant's back-off, without a worker. The wait counts toward the wall
// clock: when it would end past the task's wall-clock budget, the task stops (or
// pauses) at that limit now instead.
func (r *taskRun) throttled(t *Throttle) {
	reason, wait := r.res.Throttled(context.WithoutCancel(r.ctx), retryAfter(t.RetryAfterS))
	r.w.throttled.Add(context.WithoutCancel(r.ctx), 1, metric.WithAttributes(attribute.String("pool", r.res.pool.Pool.Name)))
	if !r.deadline.IsZero() && time.Now().Add(wait).After(r.deadline) {
		text, stop := r.wallclockStop()
		r.atLimit(fmt.Sprintf("%s: the agent's upstream throttled step %d and asked to retry after %v, past the wall clock",
			text, r.task.Usage.Steps+1, wait.Round(time.Millisecond)), stop)
		return
	}
	r.parkFor(reason, wait)
}

// retryAfter is a throttled answer's retry time: at least 100 ms (an agent that says
// 0 is retried soon, not at once), at most an hour.
func retryAfter(s float64) time.Duration {
	if math.IsNaN(s) || s < 0.1 {
		s = 0.1
	}
	return time.Duration(min(s, 3600) * float64(time.Second))
}

// record records a finished step, settles its reservation and sends its message. It
// returns proceed unless the run stops: the step was the last (its record is made
// with the task's end), or its record failed.
func (r *taskRun) record(step int, res StepResult) outcome {
	costMicro := int64(math.Round(res.Usage.CostUSD * 1e6))
	rec := store.RecordStepParams{
		ID: r.task.ID, Attempt: r.task.Attempt, Step: step, AgentState: res.State, Tokens: res.Usage.Tokens, CostMicro: costMicro,
	}
	used := quotas.StepParams{Tokens: res.Usage.Tokens, CostMicro: costMicro}
	if r.res.drawsPool() {
		r.w.poolTokens.Add(context.WithoutCancel(r.ctx), res.Usage.Tokens, metric.WithAttributes(
			attribute.String("pool", r.res.pool.Pool.Name), attribute.String("tenant_id", r.w.poolTenants.label(r.task.TenantID))))
	}
	r.w.est.add(r.task.TenantID, r.task.Agent, res.Usage.Tokens)
	r.res.next = min(max(res.NextStepTokens, 0), MaxStepTokens)
	usage := res.Usage
	ev := Event{Type: "step", TaskID: r.id, Step: step, Usage: &usage, Done: res.Done}
	if res.Done {
		// The last step and the task's end are one transaction: one commit fewer on
		// the path every task takes.
		ev.Output = res.Output
		r.end, r.last = endLastStep, lastStep{rec: rec, booked: r.res.SettleWithEnd(r.ctx, used), ev: ev}
		r.fin = tasks.FinishParams{Claim: r.claim, To: agentqtype.TaskStateCompleted, Output: res.Output}
		return stopped
	}
	spawns := len(res.Spawn) > 0 || res.Wait != ""
	var spawned agentqtype.SpawnRecord
	err := holdUntilRecorded(context.WithoutCancel(r.ctx), r.log, func(ctx context.Context) error {
		sent := time.Now()
		var err error
		if spawns {
			spawned, err = r.w.opts.Trees.Spawn(ctx, r.spawnParams(rec, res))
		} else {
			err = r.w.lifecycle.RecordStep(ctx, rec)
		}
		if err == nil {
			r.confirm(sent)
		}
		return err
	})
	if err != nil {
		r.res.Unbilled(r.ctx, used.Tokens)
		r.lost = r.unrecorded(step, err)
		return stopped
	}
	r.res.Settle(r.ctx, used)
	u := &r.task.Usage
	u.Steps, u.Tokens, u.CostMicroUSD = step, u.Tokens+res.Usage.Tokens, u.CostMicroUSD+costMicro
	r.state = res.State
	r.w.publish(r.ctx, ev)
	if spawns {
		r.task.Spawned, _ = json.Marshal(spawned) // the next step's: see takeSpawned
		for _, s := range spawned.Spawned {
			if s.ID != "" {
				r.task.Children++
			}
		}
	}
	if r.repeats(res) {
		r.finish(agentqtype.TaskStateFailed, agentqtype.LoopDetected(r.maxRepeat), nil, nil)
		return stopped
	}
	return proceed
}

// unrecorded handles a step whose record failed; it says whether another attempt owns
// the task now.
func (r *taskRun) unrecorded(step int, err error) (lost bool) {
	r.res.Refund(r.ctx) // not in the ledger, so not billed in Redis either (the pool's use was settled)
	switch {
	case errors.Is(err, store.ErrLostClaim):
		r.logLost("step record", err)
		return true
	case errors.Is(err, store.ErrTaskEnded):
		// cancelled before the step's record: not counted anywhere
	default:
		// Postgres stayed away longer than a worker holds a result: the task stays
		// running there, its heartbeat stops, and the janitor re-queues it to run
		// again from its last recorded step.
		r.log.Error("recording step failed; leaving the task to the janitor", "step", step, "err", err)
	}
	return false
}

func (r *taskRun) logLost(what string, err error) {
	r.log.Warn("another attempt took the task over; this one stops", "at", what, "err", err)
}

func (r *taskRun) lostClaim(what string, err error) {
	r.lost = true
	r.logLost(what, err)
}

// flushRunning sends the "running" message if no step's reservation carried it.
func (r *taskRun) flushRunning() {
	if r.running != nil {
		_ = r.w.batch.Do(context.WithoutCancel(r.ctx), r.running)
		r.running = nil
	}
}

// requeue hands the task back to asynq for a later attempt; it returns requeued when
// the task went back to queued, else stopped.
func (r *taskRun) requeue(why string, err error) outcome {
	r.flushRunning()
	rerr := holdUntilRecorded(context.WithoutCancel(r.ctx), r.log, func(ctx context.Context) error {
		return r.w.lifecycle.Requeue(ctx, r.claim)
	})
	if errors.Is(rerr, store.ErrLostClaim) {
		r.lostClaim("re-queue", rerr)
		return stopped
	}
	if rerr != nil {
		r.log.Warn("re-queueing the task failed", "why", why, "err", rerr)
		return stopped
	}
	r.log.Warn("task handed back to asynq for a later attempt", "why", why, "err", err)
	return requeued
}

// finish ends the task in state; stop names the limit when a budget or quota ended
// it. The terminal write is made later, by recordEnd.
func (r *taskRun) finish(state store.TaskState, errText string, output json.RawMessage, stop *quotas.Stop) {
	r.end = endFinish
	r.fin = tasks.FinishParams{Claim: r.claim, To: state, Output: output, Error: errText, Stop: stop}
}

// recordEnd makes the task's terminal write. It returns the Redis calls of the end to
// make once it is recorded (the last settlement, the lease release, the last
// messages), and lost = true when the write found the task claimed by a later
// attempt, which then owns the task's lease and dispatch slots.
func (r *taskRun) recordEnd(ctx context.Context) (tail []func(redis.Pipeliner), lost bool) {
	if r.end == endLastStep {
		return r.recordLastStep(ctx)
	}
	r.flushRunning()
	var ok bool
	ctx, carried := tasks.CarryEnd(ctx)
	err := holdUntilRecorded(ctx, r.log, func(ctx context.Context) error {
		var err error
		ok, err = r.w.lifecycle.Finish(ctx, r.fin)
		return err
	})
	switch {
	case errors.Is(err, store.ErrLostClaim):
		r.logLost("terminal state", err)
		return nil, true
	case err != nil:
		r.log.Error("recording terminal state failed", "state", r.fin.To, "err", err)
	case ok:
		return r.onEnded(carried), false
	}
	return nil, false
}

// recordLastStep records the last step and the task's end in one transaction.
func (r *taskRun) recordLastStep(ctx context.Context) (tail []func(redis.Pipeliner), lost bool) {
	var ended bool
	ctx, carried := tasks.CarryEnd(ctx)
	err := holdUntilRecorded(ctx, r.log, func(ctx context.Context) error {
		var err error
		ended, err = r.w.lifecycle.RecordLastStep(ctx, r.last.rec, r.fin)
		return err
	})
	if err != nil {
		return nil, r.unrecorded(r.last.rec.Step, err)
	}
	r.task.Usage.Steps = r.last.rec.Step
	sp := r.last.booked
	tail = []func(redis.Pipeliner){func(pipe redis.Pipeliner) { _ = r.w.limits.SettleStep(context.Background(), pipe, sp) }}
	// The step's message goes ahead of the end's.
	tail = append(tail, r.w.queuePublish(ctx, r.last.ev))
	if ended {
		return append(tail, r.onEnded(carried)...), false
	}
	return tail, false
}

// onEnded is what the call that won a task's terminal transition sends: the end's
// effects (tasks.Ends: the lease release and the end's message), carried out of the
// lifecycle's write as Redis calls to make with the slot release.
func (r *taskRun) onEnded(carried *tasks.CarriedEnd) []func(redis.Pipeliner) {
	r.log.Info("task finished", "state", r.fin.To, "steps", r.task.Usage.Steps)
	return carried.Calls()
}

// childrenRecheck is how long a parent parked for its children waits at most before
// it looks at them again: their last end wakes it, and this covers a wake-up lost
// with Redis.
const childrenRecheck = 30 * time.Second

// checkSpawns refuses a step answer whose spawns no tree could take: too many, a
// wait for something other than children, or spawns on a worker without trees.
func (r *taskRun) checkSpawns(res StepResult) error {
	switch {
	case len(res.Spawn) == 0 && res.Wait == "":
		return nil
	case res.Wait != "" && res.Wait != WaitChildren:
		return fmt.Errorf("wait %q: the only wait is %q", res.Wait, WaitChildren)
	case len(res.Spawn) > agentqtype.MaxSpawnsPerStep:
		return fmt.Errorf("%d spawns: at most %d a step", len(res.Spawn), agentqtype.MaxSpawnsPerStep)
	case r.w.opts.Trees == nil:
		return errors.New("this worker runs no task trees")
	}
	return nil
}

// spawnParams are the spawns of a step's answer, to record with the step.
func (r *taskRun) spawnParams(rec store.RecordStepParams, res StepResult) tasks.SpawnParams {
	p := tasks.SpawnParams{Step: rec, Parent: r.task, Wait: res.Wait == WaitChildren, Weight: r.res.weight}
	if !res.Done {
		p.Spawns = make([]tasks.SpawnRequest, len(res.Spawn))
		for i, s := range res.Spawn {
			p.Spawns[i] = tasks.SpawnRequest{Agent: s.Agent, Input: s.Input}
			if b := s.Budget; b != nil {
				p.Spawns[i].Budget = &tasks.BudgetRequest{MaxSteps: b.MaxSteps, MaxWallclockS: b.MaxWallclockS, MaxCostUSD: b.MaxCostUSD}
			}
		}
	}
	p.Limits = quotas.NoLimits()
	if r.policy != nil {
		p.Budget, p.Tree, p.RunningCap, p.Limits = r.policy.Budget, r.policy.Tree, r.policy.RunningCap, r.policy.Limits
		p.Period = r.tenant.Anchor().PeriodAt(time.Now())
	}
	return p
}

// takeSpawned hands what the task's latest spawning step recorded to its next step:
// the spawns' outcomes and, when that step waits for its children, their ends once
// none is live. While one is, the task parks for them, holding no worker: their
// last end wakes it, and it looks again after childrenRecheck in any case (a wake-up
// lost with Redis, a delivery after a Redis loss).
func (r *taskRun) takeSpawned() outcome {
	var rec agentqtype.SpawnRecord
	err := json.Unmarshal(r.task.Spawned, &rec)
	r.task.Spawned = nil
	if err != nil || rec.Step != r.task.Usage.Steps {
		return proceed // a later step took it already
	}
	r.spawned = rec.Spawned
	if !rec.Wait || r.w.opts.Trees == nil {
		return proceed
	}
	var live int
	err = holdUntilRecorded(r.ctx, r.log, func(ctx context.Context) error {
		var err error
		live, r.children, err = r.w.opts.Trees.Children(ctx, r.task.ID)
		return err
	})
	switch {
	case err != nil:
		return r.requeue("reading the task's children failed", err)
	case live > 0:
		r.waitsChildren = true
		r.parkFor(agentqtype.WaitChildren, childrenRecheck)
		return stopped
	}
	return proceed
}

// overTreeBudget stops or pauses a root whose tree has nothing left for its next
// step (its plan's on_limit, at tree_max_steps or tree_max_cost_usd): the root's own
// steps draw on what its tree has not handed out to its children. A task that never
// spawned, and a child (bounded by the budget it was handed), are not looked at.
func (r *taskRun) overTreeBudget() bool {
	if r.task.ParentID != nil || r.task.Children == 0 || r.policy == nil || r.w.opts.Trees == nil {
		return false
	}
	var b quotas.TreeBudget
	var left tasks.TreeRemaining
	err := holdUntilRecorded(r.ctx, r.log, func(ctx context.Context) error {
		var err error
		b, left, err = r.w.opts.Trees.Left(ctx, r.task.ID, r.policy.Tree)
		return err
	})
	switch {
	case err != nil:
		r.log.Warn("reading the task's tree budget failed; the step runs within its own budget", "err", err)
	case left.Steps < 1:
		r.atLimit(agentqtype.BudgetReached("tree max_steps", b.MaxSteps), quotas.Stop{LimitType: quotas.TreeMaxSteps,
			Limit: int64(b.MaxSteps), Used: int64(b.MaxSteps) - left.Steps})
		return true
	case r.res.cost > left.CostMicro:
		limit := int64(math.Round(b.MaxCostUSD * 1e6))
		r.atLimit(agentqtype.BudgetReached("tree max_cost_usd", b.MaxCostUSD), quotas.Stop{LimitType: quotas.TreeMaxCostUSD,
			Limit: limit, Used: limit - left.CostMicro})
		return true
	}
	return false
}

// repeats reports whether the step just recorded is the plan's max_repeat_steps-th
// in a row to answer the same state and output: an agent going round in circles.
func (r *taskRun) repeats(res StepResult) bool {
	answer := [2]json.RawMessage{res.State, res.Output}
	if r.same > 0 && bytes.Equal(answer[0], r.lastAnswer[0]) && bytes.Equal(answer[1], r.lastAnswer[1]) {
		r.same++
	} else {
		r.same, r.lastAnswer = 1, answer
	}
	return r.same >= r.maxRepeat
}
