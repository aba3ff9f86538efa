package tasks

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/groupcommit"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// DefaultStaleAfter is how long a running task's heartbeat must have been silent
// before a redelivery takes it over: several of the worker's heartbeat intervals, so a
// slow step is not mistaken for a dead worker.
const DefaultStaleAfter = 30 * time.Second

// ChangeKind names a state change of a task.
type ChangeKind string

// The state changes of a task.
const (
	ChangeCreated   ChangeKind = "created"    // a new task, queued
	ChangeStarted   ChangeKind = "started"    // queued → running, under a new attempt
	ChangeTakenOver ChangeKind = "taken_over" // running under a stale attempt → a new attempt
	ChangeStep      ChangeKind = "step"       // a step's result recorded on the running task
	ChangeFinished  ChangeKind = "finished"   // running → a terminal state, by its attempt
	ChangeRequeued  ChangeKind = "requeued"   // running → queued, to resume from its last step
	ChangeParked    ChangeKind = "parked"     // running → queued, to wait for token capacity
	ChangePaused    ChangeKind = "paused"     // running → paused, at a budget or quota limit
	ChangeResumed   ChangeKind = "resumed"    // paused → queued, by a resume
	ChangeAbandoned ChangeKind = "abandoned"  // running → abandoned: its attempts keep dying
	ChangeCancelled ChangeKind = "cancelled"  // queued or running → killed, by its tenant
	ChangeExpired   ChangeKind = "expired"    // queued → expired: not started by its start deadline
)

// Change is one committed-together state change of a task.
type Change struct {
	Kind ChangeKind
	Task store.Task // the task as the change left it
	Step int        // the step recorded (ChangeStep)
	// Stop is the limit that ended the task, for an end as budget_exceeded whose
	// finisher named it (nil otherwise).
	Stop *quotas.Stop
}

// LifecycleOptions configure a Lifecycle.
type LifecycleOptions struct {
	// StaleAfter: see DefaultStaleAfter, the value when 0.
	StaleAfter time.Duration
	// BudgetExceeded, when set, runs inside the transaction of a change that ended a
	// task budget_exceeded, with the task as it ended: it writes the end's
	// usage.limit_hit into the events outbox (outbox.Events.BudgetStop), so the
	// event exists exactly when the end committed. An error rolls the end back.
	BudgetExceeded func(ctx context.Context, tx *store.Store, t store.Task, stop *quotas.Stop) error
	// StepRecorded, when set, runs inside the transaction of a step just recorded (not
	// of a retry that recorded nothing), with the task, its tenant and the rollups the
	// step left: it writes the usage.approaching_limit and usage.limit_hit events of
	// the period quotas the step crossed (outbox.Crossings.Step), so they exist
	// exactly when the step committed. An error rolls the step back.
	StepRecorded func(ctx context.Context, tx *store.Store, r store.RecordedStep) error
	// Parked, when set, runs inside the transaction that parked a task to wait for
	// token capacity, with the task as parked: it writes the wait's usage.limit_hit
	// (outbox.Waits.Parked).
	Parked func(ctx context.Context, tx *store.Store, t store.Task) error
	// Paused, when set, runs inside the transaction that paused a task at a limit,
	// with the task as paused and the limit: it writes the pause's usage.limit_hit,
	// with its approval link (outbox.Events.Pause).
	Paused func(ctx context.Context, tx *store.Store, t store.Task, stop *quotas.Stop) error
	// Started, when set, runs after a queued task started, with the task as started
	// (Task.Resumed: the wait it ended): it writes the usage.limit_hit of a start or a
	// pool wait later than the plan commits to (outbox.Commitments.Started). A start
	// alone runs it in its transaction; the group commit's starts, one statement on
	// the path every task takes, run it right after they commit, logging its error.
	Started func(ctx context.Context, tx *store.Store, t store.Task) error
	// Expired, when set, runs after a change that ended a never-started task expired
	// committed (a start past the deadline, or the expiry pass), with the task as it
	// ended, on the store outside any transaction: it writes, in a transaction of its
	// own, the usage.limit_hit of a start commitment that lapsed before the deadline
	// (outbox.Commitments.Expired). Its error is logged: the end stands.
	Expired func(ctx context.Context, st *store.Store, t store.Task) error
	// AfterChange, when set, runs inside each state change's transaction, after the
	// change; an error from it rolls the change back. Tests use it.
	AfterChange func(ctx context.Context, tx *store.Store, c Change) error
	// Archetype is where the lifecycle meters (agentq.tasks_finished); nil: the
	// defaults.
	Archetype *baseservice.Archetype
}

// Lifecycle makes a task's state changes: create (a submission's); start or take
// over, record a step, finish, requeue, abandon (the worker's, under the claim Start
// gives); requeue or abandon a task whose heartbeat went stale (the janitor's); and
// cancel (a tenant's). Each change is one Postgres transaction, so what is written
// with it (afterChange) commits or rolls back with it.
type Lifecycle struct {
	store      *store.Store
	staleAfter time.Duration
	hook       func(ctx context.Context, tx *store.Store, c Change) error
	budget     func(ctx context.Context, tx *store.Store, t store.Task, stop *quotas.Stop) error
	// parked: LifecycleOptions.Parked
	parked func(ctx context.Context, tx *store.Store, t store.Task) error
	// paused: LifecycleOptions.Paused
	paused func(ctx context.Context, tx *store.Store, t store.Task, stop *quotas.Stop) error
	// started: LifecycleOptions.Started
	started func(ctx context.Context, tx *store.Store, t store.Task) error
	// expired: LifecycleOptions.Expired
	expired func(ctx context.Context, st *store.Store, t store.Task) error
	// stepRecorded: LifecycleOptions.StepRecorded
	stepRecorded func(ctx context.Context, tx *store.Store, r store.RecordedStep) error
	finished     metric.Int64Counter
	log          *slog.Logger
	// The group commits: of concurrent workers' completing last steps, of their
	// starts, and of concurrent submissions' new tasks.
	lastSteps groupcommit.Group[*lastStep]
	starts    groupcommit.Group[*start]
	creates   groupcommit.Group[*create]
}

// NewLifecycle returns a Lifecycle over st.
func NewLifecycle(st *store.Store, o LifecycleOptions) *Lifecycle {
	if o.StaleAfter <= 0 {
		o.StaleAfter = DefaultStaleAfter
	}
	l := &Lifecycle{store: st, staleAfter: o.StaleAfter, hook: o.AfterChange, budget: o.BudgetExceeded, stepRecorded: o.StepRecorded,
		parked: o.Parked, paused: o.Paused, started: o.Started, expired: o.Expired}
	l.log = o.Archetype.Defaults().Logger
	l.lastSteps.Flush = l.completeLastSteps
	l.starts.Flush = l.startTasks
	l.creates.Flush = l.createTasks
	l.finished, _ = o.Archetype.Meter("github.com/agentq/agentq/internal/tasks").Int64Counter("agentq.tasks_finished",
		metric.WithUnit("{task}"), metric.WithDescription("Tasks that reached a terminal state, by state"))
	for _, st := range terminalStates {
		l.finished.Add(context.Background(), 0, finishedAttrs(st))
	}
	return l
}

// terminalStates are the states a task ends in, the state label of
// agentq.tasks_finished.
var terminalStates = []store.TaskState{agentqtype.TaskStateCompleted, agentqtype.TaskStateFailed, agentqtype.TaskStateKilled,
	agentqtype.TaskStateBudgetExceeded, agentqtype.TaskStateAbandoned, agentqtype.TaskStateExpired}

// finishedOpts are the terminal states' label sets, made once: every task's end
// counts under one, and making a set anew hashes and allocates it.
var finishedOpts = func() map[store.TaskState]metric.AddOption {
	m := make(map[store.TaskState]metric.AddOption, len(terminalStates))
	for _, st := range terminalStates {
		m[st] = metric.WithAttributeSet(attribute.NewSet(attribute.String("state", string(st))))
	}
	return m
}()

func finishedAttrs(st store.TaskState) metric.AddOption {
	if o, ok := finishedOpts[st]; ok {
		return o
	}
	return metric.WithAttributes(attribute.String("state", string(st)))
}

// ended counts a task that reached its terminal state in a committed change.
func (l *Lifecycle) ended(ctx context.Context, st store.TaskState) {
	l.finished.Add(context.WithoutCancel(ctx), 1, finishedAttrs(st))
}

// afterChange runs inside the transaction of every state change, after the change.
// Whatever must exist exactly when the change committed is written here, on tx.
func (l *Lifecycle) afterChange(ctx context.Context, tx *store.Store, c Change) error {
	if l.budget != nil && c.Kind == ChangeFinished && c.Task.State == agentqtype.TaskStateBudgetExceeded {
		if err := l.budget(ctx, tx, c.Task, c.Stop); err != nil {
			return err
		}
	}
	if l.started != nil && c.Kind == ChangeStarted {
		if err := l.started(ctx, tx, c.Task); err != nil {
			return err
		}
	}
	if l.parked != nil && c.Kind == ChangeParked {
		if err := l.parked(ctx, tx, c.Task); err != nil {
			return err
		}
	}
	if l.paused != nil && c.Kind == ChangePaused {
		if err := l.paused(ctx, tx, c.Task, c.Stop); err != nil {
			return err
		}
	}
	if l.hook != nil {
		return l.hook(ctx, tx, c)
	}
	return nil
}

// Create writes a new queued task (see store.InsertTask). created=false, and no
// change, when the tenant's idempotency key names an existing task, which it returns.
//
// Concurrent submissions' tasks are written together, in one statement and commit
// (group commit); one the shared insert did not write (its idempotency key was used,
// the insert failed) is then written alone, which tells why.
func (l *Lifecycle) Create(ctx context.Context, p store.InsertTaskParams) (t store.Task, created bool, err error) {
	c := &create{ctx: ctx, p: p}
	l.creates.Do(c)
	if c.written {
		return c.task, true, nil
	}
	return l.createAlone(ctx, p)
}

// create is one call's new task in a group commit.
type create struct {
	ctx     context.Context
	p       store.InsertTaskParams
	task    store.Task
	written bool
}

// createTasks writes a batch of new tasks together (see sharedWrite).
func (l *Lifecycle) createTasks(batch []*create) {
	ps := make([]store.InsertTaskParams, len(batch))
	for i, c := range batch {
		ps[i] = c.p
	}
	byID := l.sharedWrite(batch[0].ctx, l.hook != nil, func(ctx context.Context, st *store.Store) ([]store.Task, error) {
		ts, err := st.InsertTasks(ctx, ps)
		if err != nil {
			return nil, err
		}
		return ts, l.afterEach(ctx, st, ChangeCreated, ts)
	})
	for _, c := range batch {
		c.task, c.written = takeFirst(byID, c.p.ID)
	}
}

// sharedWrite runs a batch's shared write under the batch's flushContext, in one
// transaction when inTx (a write that is a single statement needs none), and returns
// the tasks it changed by id: none when it failed, and then nothing was written.
func (l *Lifecycle) sharedWrite(first context.Context, inTx bool, write func(ctx context.Context, st *store.Store) ([]store.Task, error)) map[uuid.UUID]store.Task {
	ctx, cancel := flushContext(first)
	defer cancel()
	var changed []store.Task
	run := func(st *store.Store) error {
		var err error
		changed, err = write(ctx, st)
		return err
	}
	var err error
	if inTx {
		err = l.store.InTx(ctx, run)
	} else {
		err = run(l.store)
	}
	if err != nil {
		return nil
	}
	byID := make(map[uuid.UUID]store.Task, len(changed))
	for _, t := range changed {
		byID[t.ID] = t
	}
	return byID
}

// takeFirst takes task id out of a shared write's result: a task that two calls of
// the batch gave is the first call's, and the other one goes alone.
func takeFirst(byID map[uuid.UUID]store.Task, id uuid.UUID) (store.Task, bool) {
	t, ok := byID[id]
	delete(byID, id)
	return t, ok
}

// afterEach runs afterChange for each of ts, a change of kind, on st.
func (l *Lifecycle) afterEach(ctx context.Context, st *store.Store, kind ChangeKind, ts []store.Task) error {
	for _, t := range ts {
		if err := l.afterChange(ctx, st, Change{Kind: kind, Task: t}); err != nil {
			return err
		}
	}
	return nil
}

// createAlone is Create in a transaction of its own.
func (l *Lifecycle) createAlone(ctx context.Context, p store.InsertTaskParams) (t store.Task, created bool, err error) {
	err = l.store.InTx(ctx, func(tx *store.Store) error {
		var err error
		t, created, err = tx.InsertTask(ctx, p)
		if err != nil || !created {
			return err
		}
		return l.afterChange(ctx, tx, Change{Kind: ChangeCreated, Task: t})
	})
	if err != nil {
		return store.Task{}, false, err
	}
	return t, created, nil
}

// StartOutcome is what Start found.
type StartOutcome int

// The outcomes of Start. With Started and TookOver the caller holds the returned
// task's claim; with the others it has nothing to run.
const (
	Started  StartOutcome = iota + 1 // the queued task now runs under a new attempt
	TookOver                         // its previous attempt stopped heartbeating; a new one owns it
	Ended                            // terminal, or gone: a duplicate or late delivery
	Busy                             // running under a live attempt, which owns it
)

func (o StartOutcome) String() string {
	switch o {
	case Started:
		return "started"
	case TookOver:
		return "took over"
	case Ended:
		return "ended"
	case Busy:
		return "busy"
	}
	return fmt.Sprintf("StartOutcome(%d)", int(o))
}

// Start claims task id for a delivery: it starts a queued task, or takes over a
// running one whose heartbeat has been silent for StaleAfter (its worker died and the
// queue redelivered it), counting a new attempt either way. The claim is the returned
// task's id and attempt.
//
// A queued task that never started and whose start deadline has passed is not
// started: the same statement ends it expired, and Start returns it, expired, with
// Ended. The caller then owns the end's side effects (lease, state message), as the
// winner of any end does.
//
// Concurrent workers' starts of queued tasks (the common case) are written together,
// in one statement and commit (group commit); a task the shared start did not start
// goes through the rest alone.
func (l *Lifecycle) Start(ctx context.Context, id uuid.UUID) (store.Task, StartOutcome, error) {
	c := &start{ctx: ctx, id: id}
	l.starts.Do(c)
	if c.written {
		if c.task.State == agentqtype.TaskStateExpired {
			l.expiredEnded(ctx, c.task)
			return c.task, Ended, nil
		}
		return c.task, Started, nil
	}
	return l.startAlone(ctx, id)
}

// start is one call's start in a group commit.
type start struct {
	ctx     context.Context
	id      uuid.UUID
	task    store.Task
	written bool // started, or expired, by the shared write
}

// startTasks starts a batch of queued tasks together, and expires those of them past
// their start deadline (see sharedWrite).
func (l *Lifecycle) startTasks(batch []*start) {
	ids := make([]uuid.UUID, len(batch))
	for i, c := range batch {
		ids[i] = c.id
	}
	// The start is one statement: no transaction around it, on the path every task
	// takes (a test's AfterChange hook wants one). The commitment check writes an
	// event only for a late start, rarely: it runs right after the start commits.
	inTx := l.hook != nil
	byID := l.sharedWrite(batch[0].ctx, inTx, func(ctx context.Context, st *store.Store) ([]store.Task, error) {
		ts, err := st.UnscopedStartTasks(ctx, ids)
		if err != nil {
			return nil, err
		}
		for _, t := range ts {
			c := Change{Kind: startChange(t), Task: t}
			if !inTx {
				l.startedOutsideTx(ctx, st, c)
				continue
			}
			if err := l.afterChange(ctx, st, c); err != nil {
				return nil, err
			}
		}
		return ts, nil
	})
	for _, c := range batch {
		c.task, c.written = takeFirst(byID, c.id)
	}
}

// startedOutsideTx runs the Started hook for a start that committed on its own. Its
// failure cannot undo the start, and must not make the batch's callers think their
// tasks did not start: it is logged, and the late start goes uncredited.
func (l *Lifecycle) startedOutsideTx(ctx context.Context, st *store.Store, c Change) {
	if l.started == nil || c.Kind != ChangeStarted {
		return
	}
	if err := l.started(ctx, st, c.Task); err != nil {
		l.log.Warn("checking a start against its plan's commitments failed", "task_id", c.Task.ID, "err", err)
	}
}

// startChange is the change a start statement made to t: started, or expired.
func startChange(t store.Task) ChangeKind {
	if t.State == agentqtype.TaskStateExpired {
		return ChangeExpired
	}
	return ChangeStarted
}

// startAlone is Start in a transaction of its own.
func (l *Lifecycle) startAlone(ctx context.Context, id uuid.UUID) (store.Task, StartOutcome, error) {
	var task store.Task
	var out StartOutcome
	err := l.store.InTx(ctx, func(tx *store.Store) error {
		t, ok, err := tx.UnscopedStartTask(ctx, id)
		if err != nil {
			return err
		}
		if ok || t.State == agentqtype.TaskStateExpired {
			// Started, or ended expired by this very statement: either way this
			// call made the change.
			task, out = t, Started
			if t.State == agentqtype.TaskStateExpired {
				out = Ended
			}
			return l.afterChange(ctx, tx, Change{Kind: startChange(t), Task: t})
		}
		states, err := tx.UnscopedTaskStates(ctx, []uuid.UUID{id})
		if err != nil {
			return err
		}
		if st, known := states[id]; !known || st.Terminal() {
			out = Ended
			return nil
		}
		// Running: under another live delivery, which owns it, or under a dead one. A
		// stale heartbeat tells which.
		t, ok, err = tx.UnscopedTakeOverTask(ctx, id, l.staleAfter)
		if err != nil {
			return err
		}
		if !ok {
			out = Busy
			return nil
		}
		task, out = t, TookOver
		return l.afterChange(ctx, tx, Change{Kind: ChangeTakenOver, Task: t})
	})
	if err != nil {
		return store.Task{}, 0, err
	}
	if task.State == agentqtype.TaskStateExpired {
		l.expiredEnded(ctx, task)
	}
	return task, out, nil
}

// ExpireOverdue ends as expired up to limit queued tasks that never started and whose
// start deadline has passed (see store.UnscopedExpireOverdue), in one transaction,
// and returns them: the caller won each end and owns its side effects (lease, queue
// entry, state message).
func (l *Lifecycle) ExpireOverdue(ctx context.Context, limit int) ([]store.Task, error) {
	var ts []store.Task
	err := l.store.InTx(ctx, func(tx *store.Store) error {
		var err error
		if ts, err = tx.UnscopedExpireOverdue(ctx, limit); err != nil {
			return err
		}
		return l.afterEach(ctx, tx, ChangeExpired, ts)
	})
	if err != nil {
		return nil, err
	}
	for _, t := range ts {
		l.expiredEnded(ctx, t)
	}
	return ts, nil
}

// expiredEnded counts a committed expiry and runs the Expired hook for it. The hook's
// failure cannot undo the end: it is logged, and the lapse goes uncredited.
func (l *Lifecycle) expiredEnded(ctx context.Context, t store.Task) {
	l.ended(ctx, agentqtype.TaskStateExpired)
	if l.expired == nil {
		return
	}
	if err := l.expired(context.WithoutCancel(ctx), l.store, t); err != nil {
		l.log.Warn("checking an expired task against its plan's start commitment failed", "task_id", t.ID, "err", err)
	}
}

// RecordStep records a finished step's result (usage, ledger rows, agent state) under
// the claim in p; see store.UnscopedRecordStep for the fencing. A step recorded before
// (a retry) changes nothing and returns nil.
func (l *Lifecycle) RecordStep(ctx context.Context, p store.RecordStepParams) error {
	return l.store.InTx(ctx, func(tx *store.Store) error { return l.recordStep(ctx, tx, p) })
}

func (l *Lifecycle) recordStep(ctx context.Context, tx *store.Store, p store.RecordStepParams) error {
	r, recorded, err := tx.UnscopedRecordStep(ctx, p)
	if err != nil || !recorded {
		return err
	}
	return l.stepWritten(ctx, tx, r, p.Step)
}

// stepWritten runs, on tx, what is written with a recorded step: its crossings and
// its change.
func (l *Lifecycle) stepWritten(ctx context.Context, tx *store.Store, r store.RecordedStep, step int) error {
	if l.stepRecorded != nil {
		if err := l.stepRecorded(ctx, tx, r); err != nil {
			return err
		}
	}
	return l.afterChange(ctx, tx, Change{Kind: ChangeStep, Task: r.Task, Step: step})
}

// RecordLastStep records a task's last step and ends it as fin says, in one
// transaction: what RecordStep and then Finish do, with one commit instead of two on
// the path every task takes. ok and the errors are Finish's and RecordStep's.
//
// A last step that completes its task (the path of almost every task) shares its
// transaction with those of the other workers' tasks completing at the same time
// (group commit): a few statements and one commit for all of them. A step the shared
// transaction could not write (a lost claim, a cancel, a retry, the transaction
// failing) is then written alone, which tells why.
func (l *Lifecycle) RecordLastStep(ctx context.Context, p store.RecordStepParams, fin FinishParams) (ok bool, err error) {
	if fin.To == agentqtype.TaskStateCompleted && fin.Error == "" && fin.Stop == nil && fin.Claim == (store.Claim{ID: p.ID, Attempt: p.Attempt}) {
		c := &lastStep{ctx: ctx, step: store.LastStep{RecordStepParams: p, Output: fin.Output}}
		l.lastSteps.Do(c)
		if c.written {
			l.ended(ctx, fin.To)
			return true, nil
		}
	}
	return l.recordLastStepAlone(ctx, p, fin)
}

// lastStep is one call's completing last step in a group commit.
type lastStep struct {
	ctx     context.Context
	step    store.LastStep
	written bool // recorded and ended by the shared transaction
}

// completeLastSteps writes a batch of completing last steps in one transaction, with
// each step's crossings and changes (see sharedWrite). If the transaction fails, none
// is written and each call writes its step alone.
func (l *Lifecycle) completeLastSteps(batch []*lastStep) {
	ps := make([]store.LastStep, len(batch))
	for i, c := range batch {
		ps[i] = c.step
	}
	byID := l.sharedWrite(batch[0].ctx, true, func(ctx context.Context, tx *store.Store) ([]store.Task, error) {
		written, err := tx.UnscopedCompleteLastSteps(ctx, ps)
		if err != nil {
			return nil, err
		}
		ts := make([]store.Task, len(written))
		for i, r := range written {
			// One change made both: the step's and the end's see the task as it ended.
			if err := l.stepWritten(ctx, tx, r, r.Task.Usage.Steps); err != nil {
				return nil, err
			}
			ts[i] = r.Task
		}
		return ts, l.afterEach(ctx, tx, ChangeFinished, ts)
	})
	for _, c := range batch {
		_, c.written = takeFirst(byID, c.step.ID)
	}
}

// flushTimeout bounds a group commit's flush.
const flushTimeout = 10 * time.Second

// flushContext is the context a batch is written under: its first call's values
// (its trace), but neither its cancel nor its deadline, so that one caller giving up
// does not fail the others' writes; flushTimeout bounds it instead.
func flushContext(first context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(first), flushTimeout)
}

// recordLastStepAlone is RecordLastStep in a transaction of its own.
func (l *Lifecycle) recordLastStepAlone(ctx context.Context, p store.RecordStepParams, fin FinishParams) (ok bool, err error) {
	return l.end(ctx, fin.To, func(tx *store.Store) (bool, error) {
		if err := l.recordStep(ctx, tx, p); errors.Is(err, store.ErrTaskEnded) {
			// A retry of a call that committed (its answer lost) finds the task ended
			// as it asked: done, as a second Finish would say.
			states, serr := tx.UnscopedTaskStates(ctx, []uuid.UUID{p.ID})
			if serr == nil && states[p.ID] == fin.To {
				return false, nil
			}
			return false, err
		} else if err != nil {
			return false, err
		}
		return l.finishTx(ctx, tx, ChangeFinished, fin)
	})
}

// FinishParams end a running attempt.
type FinishParams struct {
	Claim  store.Claim
	To     store.TaskState // a terminal state
	Output json.RawMessage
	Error  string
	// Stop names the limit that ended a task budget_exceeded (see quotas.Stop).
	Stop *quotas.Stop
}

// Finish moves the claimed running task to p.To. ok=true when this call made the
// transition (it then owns the end's side effects: lease, events); false when the task
// had already ended under this attempt. ErrLostClaim when another attempt owns it.
func (l *Lifecycle) Finish(ctx context.Context, p FinishParams) (ok bool, err error) {
	return l.finish(ctx, ChangeFinished, p)
}

// Abandon ends the claimed running task as abandoned (its attempts keep dying), as
// Finish does. The janitor abandons a stale task under the attempt it read, so a
// redelivery that took the task over since keeps it (ErrLostClaim).
func (l *Lifecycle) Abandon(ctx context.Context, c store.Claim, reason string) (ok bool, err error) {
	return l.finish(ctx, ChangeAbandoned, FinishParams{Claim: c, To: agentqtype.TaskStateAbandoned, Error: reason})
}

// finishTx is the end of a running attempt on tx.
func (l *Lifecycle) finishTx(ctx context.Context, tx *store.Store, kind ChangeKind, p FinishParams) (ok bool, err error) {
	t, won, err := tx.UnscopedFinishTask(ctx, store.UnscopedFinishTaskParams{
		ID: p.Claim.ID, Attempt: p.Claim.Attempt, From: []store.TaskState{agentqtype.TaskStateRunning},
		To: p.To, Output: p.Output, Error: p.Error,
	})
	if err != nil || !won {
		return false, err
	}
	return true, l.afterChange(ctx, tx, Change{Kind: kind, Task: t, Stop: p.Stop})
}

func (l *Lifecycle) finish(ctx context.Context, kind ChangeKind, p FinishParams) (ok bool, err error) {
	return l.end(ctx, p.To, func(tx *store.Store) (bool, error) { return l.finishTx(ctx, tx, kind, p) })
}

// end runs a change that may end a task in one transaction and, once it committed
// having ended the task (ok), counts the end as to.
func (l *Lifecycle) end(ctx context.Context, to store.TaskState, change func(tx *store.Store) (ok bool, err error)) (ok bool, err error) {
	err = l.store.InTx(ctx, func(tx *store.Store) error {
		var err error
		ok, err = change(tx)
		return err
	})
	if err != nil {
		return false, err
	}
	if ok {
		l.ended(ctx, to)
	}
	return ok, nil
}

// Requeue puts the claimed running task back to queued, keeping its recorded steps
// and agent state: the next attempt resumes from there. ErrLostClaim or ErrTaskEnded
// when the claim no longer holds.
func (l *Lifecycle) Requeue(ctx context.Context, c store.Claim) error {
	return l.store.InTx(ctx, func(tx *store.Store) error {
		t, err := tx.UnscopedRequeueTask(ctx, c)
		if err != nil {
			return err
		}
		return l.afterChange(ctx, tx, Change{Kind: ChangeRequeued, Task: t})
	})
}

// ParkParams send a claimed running task back to queued to wait for token capacity.
type ParkParams = store.UnscopedParkTaskParams

// Park puts the claimed running task back to queued until the capacity its next step
// waits for is expected, keeping its recorded steps and agent state, and records what
// it waits for. ErrLostClaim or ErrTaskEnded when the claim no longer holds.
func (l *Lifecycle) Park(ctx context.Context, p ParkParams) error {
	return l.store.InTx(ctx, func(tx *store.Store) error {
		t, err := tx.UnscopedParkTask(ctx, p)
		if err != nil {
			return err
		}
		return l.afterChange(ctx, tx, Change{Kind: ChangeParked, Task: t})
	})
}

// PauseParams pause a claimed running task at a limit.
type PauseParams struct {
	Claim store.Claim
	// Stop is the limit that paused the task: its limit_type, value and the use
	// that met it.
	Stop quotas.Stop
	// Next is what the step the limit held back is expected to take, kept with the
	// pause: a resume is judged against it, and its delivery reserves it.
	Next quotas.NextStep
	// TenantID is the task's tenant, and MaxPaused its paused_tasks limit: how many
	// of its tasks may be paused at once (below 0: no bound).
	TenantID  string
	MaxPaused int64
	// Timeout is how long the task may stay paused (its plan's pause_timeout_s;
	// 0: quotas.DefaultPauseTimeout): past it the pause watcher ends it.
	Timeout time.Duration
}

// PausedBoundError is a pause refused because the tenant has as many tasks paused as
// its paused_tasks limit allows: nothing changed, and the task stops instead.
type PausedBoundError struct {
	Limit  int64
	Paused int64
}

func (e *PausedBoundError) Error() string {
	return fmt.Sprintf("not paused: %d of the tenant's tasks are paused already (paused_tasks %d)", e.Paused, e.Limit)
}

// Pause moves the claimed running task to paused at the limit in p, keeping its
// recorded steps and agent state; the pause's event is written with it (Paused).
// ErrLostClaim or ErrTaskEnded when the claim no longer holds; a *PausedBoundError
// when its tenant has p.MaxPaused tasks paused already (the count and the pause are
// one transaction, serialised per tenant, so concurrent pauses never pass the bound).
func (l *Lifecycle) Pause(ctx context.Context, p PauseParams) (store.Task, error) {
	var t store.Task
	err := l.store.InTx(ctx, func(tx *store.Store) error {
		if p.MaxPaused >= 0 {
			n, err := tx.UnscopedLockPausedCount(ctx, p.TenantID)
			if err != nil {
				return err
			}
			if n >= p.MaxPaused {
				return &PausedBoundError{Limit: p.MaxPaused, Paused: n}
			}
		}
		var err error
		t, err = tx.UnscopedPauseTask(ctx, store.UnscopedPauseTaskParams{
			Claim: p.Claim, Reason: p.Stop.LimitType, Limit: p.Stop.Limit, Used: p.Stop.Used,
			NextTokens: p.Next.Tokens, NextCostMicro: p.Next.CostMicro})
		if err != nil {
			return err
		}
		if err := tx.UnscopedSetPauseExpiry(ctx, t.ID, cmp.Or(p.Timeout, quotas.DefaultPauseTimeout)); err != nil {
			return err
		}
		return l.afterChange(ctx, tx, Change{Kind: ChangePaused, Task: t, Stop: &p.Stop})
	})
	return t, err
}

// Resume moves one of the tenant's paused tasks back to queued (see
// store.ResumeTask). ok=false when it is not paused (or was paused again since the
// pause p names).
func (l *Lifecycle) Resume(ctx context.Context, p store.ResumeTaskParams) (t store.Task, ok bool, err error) {
	err = l.store.InTx(ctx, func(tx *store.Store) error {
		var err error
		t, ok, err = tx.ResumeTask(ctx, p)
		if err != nil || !ok {
			return err
		}
		return l.afterChange(ctx, tx, Change{Kind: ChangeResumed, Task: t})
	})
	return t, ok, err
}

// ExpirePauses ends budget_exceeded, in one statement, up to limit tasks paused past
// their pause's expiry (their plan's pause_timeout_s, dated at the pause), each with
// its end's event naming the limit that paused it, and returns them as they ended.
func (l *Lifecycle) ExpirePauses(ctx context.Context, limit int) ([]store.Task, error) {
	var ended []store.Task
	err := l.store.InTx(ctx, func(tx *store.Store) error {
		var err error
		if ended, err = tx.UnscopedExpirePauses(ctx, limit); err != nil {
			return err
		}
		for _, t := range ended {
			if err := l.afterChange(ctx, tx, Change{Kind: ChangeFinished, Task: t, Stop: pauseStop(t)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for range ended {
		l.ended(ctx, agentqtype.TaskStateBudgetExceeded)
	}
	return ended, nil
}

// pauseStop is the limit that paused t, as its pause recorded it.
func pauseStop(t store.Task) *quotas.Stop {
	stop := &quotas.Stop{}
	if p := t.Pause; p.Reason != nil {
		stop.LimitType = *p.Reason
	}
	if p := t.Pause; p.Limit != nil && p.Used != nil {
		stop.Limit, stop.Used = *p.Limit, *p.Used
	}
	return stop
}

// ExpirePause ends one of the tenant's paused tasks budget_exceeded: it stayed paused
// past its plan's pause_timeout_s. stop is the limit that paused it (the end's
// event names it). ok=false when the task is no longer paused.
func (l *Lifecycle) ExpirePause(ctx context.Context, tenantID string, id uuid.UUID, stop *quotas.Stop) (t store.Task, ok bool, err error) {
	ok, err = l.end(ctx, agentqtype.TaskStateBudgetExceeded, func(tx *store.Store) (bool, error) {
		var won bool
		var err error
		t, won, err = tx.FinishTask(ctx, store.FinishTaskParams{TenantID: tenantID, ID: id,
			From: []store.TaskState{agentqtype.TaskStatePaused}, To: agentqtype.TaskStateBudgetExceeded,
			Error: fmt.Sprintf("budget exceeded: paused at %s longer than the plan's pause timeout", stop.LimitType)})
		if err != nil || !won {
			return false, err
		}
		return true, l.afterChange(ctx, tx, Change{Kind: ChangeFinished, Task: t, Stop: stop})
	})
	return t, ok, err
}

// RequeueStale puts a running task whose heartbeat has been silent for staleAfter
// back to queued, whatever attempt runs it (that worker is gone), keeping its recorded
// steps and agent state. The silence is checked in the same statement as the change:
// a worker that stamped its heartbeat since, or a redelivery that took the task over,
// keeps it (ok=false).
func (l *Lifecycle) RequeueStale(ctx context.Context, id uuid.UUID, staleAfter time.Duration) (t store.Task, ok bool, err error) {
	err = l.store.InTx(ctx, func(tx *store.Store) error {
		var err error
		t, ok, err = tx.UnscopedRequeueStale(ctx, id, staleAfter)
		if err != nil || !ok {
			return err
		}
		return l.afterChange(ctx, tx, Change{Kind: ChangeRequeued, Task: t})
	})
	if err != nil {
		return store.Task{}, false, err
	}
	return t, ok, nil
}

// Heartbeat stamps the claimed task alive. It is not a state change: no transaction
// of its own, nothing written after it. ErrLostClaim or ErrTaskEnded when the claim
// no longer holds.
func (l *Lifecycle) Heartbeat(ctx context.Context, c store.Claim) error {
	return l.store.UnscopedHeartbeat(ctx, c)
}

// CancelParams end one of a tenant's tasks.
type CancelParams struct {
	TenantID string
	ID       uuid.UUID
	Reason   string // the error the task ends with
}

// Cancel ends one of the tenant's queued, running or paused tasks as killed, whatever attempt
// runs it. ok=true when this call made the transition; false when the task had
// already ended (or is not the tenant's: agentqtype.ErrNotFound from a read tells which).
func (l *Lifecycle) Cancel(ctx context.Context, p CancelParams) (t store.Task, ok bool, err error) {
	err = l.store.InTx(ctx, func(tx *store.Store) error {
		var err error
		t, ok, err = tx.FinishTask(ctx, store.FinishTaskParams{
			TenantID: p.TenantID, ID: p.ID, From: []store.TaskState{agentqtype.TaskStateQueued, agentqtype.TaskStateRunning, agentqtype.TaskStatePaused},
			To: agentqtype.TaskStateKilled, Error: p.Reason,
		})
		if err != nil || !ok {
			return err
		}
		return l.afterChange(ctx, tx, Change{Kind: ChangeCancelled, Task: t})
	})
	if err != nil {
		return store.Task{}, false, err
	}
	if ok {
		l.ended(ctx, agentqtype.TaskStateKilled)
	}
	return t, ok, nil
}

// StaleAfter is how long a running task's heartbeat must be silent before Start
// takes it over.
func (l *Lifecycle) StaleAfter() time.Duration { return l.staleAfter }
