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
	"github.com/agentq/agentq/internal/tasks/change"
	"github.com/agentq/agentq/quotas"
)

// DefaultStaleAfter is how long a running task's heartbeat must have been silent
// before a redelivery takes it over: several of the worker's heartbeat intervals, so a
// slow step is not mistaken for a dead worker.
const DefaultStaleAfter = 30 * time.Second

// ChangeKind names a state change of a task (see package change).
type ChangeKind = change.Kind

// The state changes of a task.
const (
	ChangeCreated   = change.Created
	ChangeStarted   = change.Started
	ChangeTakenOver = change.TakenOver
	ChangeStep      = change.Step
	ChangeFinished  = change.Finished
	ChangeRequeued  = change.Requeued
	ChangeParked    = change.Parked
	ChangePaused    = change.Paused
	ChangeResumed   = change.Resumed
	ChangeAbandoned = change.Abandoned
	ChangeCancelled = change.Cancelled
	ChangeExpired   = change.Expired
)

// Change is one committed-together state change of a task (see package change).
type Change = change.Change

// Subscriber is told of each state change: in its transaction, and after it
// committed (see package change, and the package's doc).
type Subscriber = change.Subscriber

// LifecycleOptions configure a Lifecycle.
type LifecycleOptions struct {
	// StaleAfter: see DefaultStaleAfter, the value when 0.
	StaleAfter time.Duration
	// Subscribers are told of every state change, in this order: in the change's
	// transaction (what must commit with it: the events outbox) and after it
	// committed (what follows it: a task's end, Ends). A process gives its lifecycle
	// the outbox's subscriber and an Ends.
	Subscribers []Subscriber
	// Archetype is where the lifecycle meters (agentq.tasks_finished) and logs; nil:
	// the defaults.
	Archetype *baseservice.Archetype
}

// Lifecycle makes a task's state changes: create (a submission's); start or take
// over, record a step, finish, requeue, park, pause (the worker's, under the claim
// Start gives); requeue or abandon a task whose heartbeat went stale (the janitor's);
// expire a task past its start deadline or its pause timeout; resume and cancel (a
// tenant's). Each change is one Postgres transaction (or one statement), and its
// subscribers are told of it in the transaction and after the commit.
type Lifecycle struct {
	store      *store.Store
	staleAfter time.Duration
	subs       []Subscriber
	// writers are, by kind, the subscribers whose InTx writes for that kind.
	writers  map[ChangeKind][]Subscriber
	finished metric.Int64Counter
	log      *slog.Logger
	// The group commits: of concurrent workers' completing last steps, of their
	// starts, and of concurrent submissions' new tasks.
	lastSteps groupcommit.Group[*lastStep]
	starts    groupcommit.Group[*start]
	creates   groupcommit.Group[*create]
}

// allKinds are the kinds of change, to ask each subscriber once which it writes for.
var allKinds = []ChangeKind{ChangeCreated, ChangeStarted, ChangeTakenOver, ChangeStep, ChangeFinished, ChangeRequeued,
	ChangeParked, ChangePaused, ChangeResumed, ChangeAbandoned, ChangeCancelled, ChangeExpired}

// NewLifecycle returns a Lifecycle over st.
func NewLifecycle(st *store.Store, o LifecycleOptions) *Lifecycle {
	if o.StaleAfter <= 0 {
		o.StaleAfter = DefaultStaleAfter
	}
	l := &Lifecycle{store: st, staleAfter: o.StaleAfter, subs: o.Subscribers, writers: map[ChangeKind][]Subscriber{}}
	for _, k := range allKinds {
		for _, sub := range o.Subscribers {
			if sub.Writes(k) {
				l.writers[k] = append(l.writers[k], sub)
			}
		}
	}
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

// writes reports whether a subscriber writes in the transaction of changes of kind.
func (l *Lifecycle) writes(kinds ...ChangeKind) bool {
	for _, k := range kinds {
		if len(l.writers[k]) > 0 {
			return true
		}
	}
	return false
}

// changes collects the changes of one transaction: each is written with its
// subscribers' InTx as it is noted, and told to them all once the transaction
// committed (committed).
type changes struct {
	l    *Lifecycle
	ctx  context.Context
	tx   *store.Store
	made []Change
}

// note runs, on the transaction, what its subscribers write with change c, and keeps
// c for after the commit.
func (cs *changes) note(c Change) error {
	for _, sub := range cs.l.writers[c.Kind] {
		if err := sub.InTx(cs.ctx, cs.tx, c); err != nil {
			return err
		}
	}
	cs.made = append(cs.made, c)
	return nil
}

// inTx runs write in one transaction; once it committed, the changes it noted are
// told to the subscribers.
func (l *Lifecycle) inTx(ctx context.Context, write func(cs *changes) error) error {
	var made []Change
	err := l.store.InTx(ctx, func(tx *store.Store) error {
		cs := &changes{l: l, ctx: ctx, tx: tx}
		err := write(cs)
		made = cs.made
		return err
	})
	if err != nil {
		return err
	}
	l.committed(ctx, made...)
	return nil
}

// committed tells the subscribers of changes that committed, and counts the ends
// among them. It runs in the goroutine of the call that made the change, under its
// context without its cancel: what follows a committed change is owed whatever the
// caller does next.
func (l *Lifecycle) committed(ctx context.Context, made ...Change) {
	if len(made) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	for _, c := range made {
		if c.Ends() {
			l.finished.Add(ctx, 1, finishedAttrs(c.Task.State))
		}
		for _, sub := range l.subs {
			sub.AfterCommit(ctx, c)
		}
	}
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
		l.committed(ctx, c.made...)
		return c.made[0].Task, true, nil
	}
	return l.createAlone(ctx, p)
}

// create is one call's new task in a group commit.
type create struct {
	ctx     context.Context
	p       store.InsertTaskParams
	made    []Change // its change, when written
	written bool
}

// createTasks writes a batch of new tasks together (see sharedWrite).
func (l *Lifecycle) createTasks(batch []*create) {
	ps := make([]store.InsertTaskParams, len(batch))
	for i, c := range batch {
		ps[i] = c.p
	}
	byID := l.sharedWrite(batch[0].ctx, l.writes(ChangeCreated), len(batch), func(cs *changes) error {
		ts, err := cs.tx.InsertTasks(cs.ctx, ps)
		if err != nil {
			return err
		}
		for _, t := range ts {
			if err := cs.note(Change{Kind: ChangeCreated, Task: t}); err != nil {
				return err
			}
		}
		return nil
	})
	for _, c := range batch {
		c.made, c.written = takeFirst(byID, c.p.ID)
	}
}

// sharedWrite runs a batch's shared write under the batch's flushContext, in one
// transaction when inTx (a write that is a single statement needs none unless a
// subscriber writes with its changes), and returns the changes it made by task id:
// none when it failed, and then nothing was written. Each call of the batch tells
// the subscribers of its own changes once it has them (committed), in its own
// goroutine and context. expect is how many changes the write usually makes (room
// for them is made at once: a change is large).
func (l *Lifecycle) sharedWrite(first context.Context, inTx bool, expect int, write func(cs *changes) error) map[uuid.UUID][]Change {
	ctx, cancel := flushContext(first)
	defer cancel()
	var made []Change
	run := func(st *store.Store) error {
		cs := &changes{l: l, ctx: ctx, tx: st, made: make([]Change, 0, expect)}
		err := write(cs)
		made = cs.made
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
	return changesByID(made)
}

// changesByID groups made by task id, in order. A task's changes are noted one after
// the other, so each run of them is a piece of made (capped: appending to it
// copies), and only a task noted in two places gets a slice of its own.
func changesByID(made []Change) map[uuid.UUID][]Change {
	byID := make(map[uuid.UUID][]Change, len(made))
	for i := 0; i < len(made); {
		id := made[i].Task.ID
		j := i + 1
		for j < len(made) && made[j].Task.ID == id {
			j++
		}
		if prev, ok := byID[id]; ok {
			byID[id] = append(prev, made[i:j]...)
		} else {
			byID[id] = made[i:j:j]
		}
		i = j
	}
	return byID
}

// takeFirst takes task id's changes out of a shared write's result: a task that two
// calls of the batch gave is the first call's, and the other one goes alone.
func takeFirst(byID map[uuid.UUID][]Change, id uuid.UUID) ([]Change, bool) {
	made, ok := byID[id]
	delete(byID, id)
	return made, ok
}

// createAlone is Create in a transaction of its own.
func (l *Lifecycle) createAlone(ctx context.Context, p store.InsertTaskParams) (t store.Task, created bool, err error) {
	err = l.inTx(ctx, func(cs *changes) error {
		var err error
		t, created, err = cs.tx.InsertTask(ctx, p)
		if err != nil || !created {
			return err
		}
		return cs.note(Change{Kind: ChangeCreated, Task: t})
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
// Ended. Its end's effects follow it as any end's do (the subscribers' AfterCommit).
//
// Concurrent workers' starts of queued tasks (the common case) are written together,
// in one statement and commit (group commit); a task the shared start did not start
// goes through the rest alone. Either way the subscribers are told of the start the
// same way: InTx in its transaction, AfterCommit after it, in the caller's goroutine.
func (l *Lifecycle) Start(ctx context.Context, id uuid.UUID) (store.Task, StartOutcome, error) {
	c := &start{ctx: ctx, id: id}
	l.starts.Do(c)
	if c.written {
		l.committed(ctx, c.made...)
		t := c.made[0].Task
		if t.State == agentqtype.TaskStateExpired {
			return t, Ended, nil
		}
		return t, Started, nil
	}
	return l.startAlone(ctx, id)
}

// start is one call's start in a group commit.
type start struct {
	ctx     context.Context
	id      uuid.UUID
	made    []Change // its start or expiry, when written
	written bool     // started, or expired, by the shared write
}

// startTasks starts a batch of queued tasks together, and expires those of them past
// their start deadline (see sharedWrite). The start is one statement: no transaction
// around it, on the path every task takes, unless a subscriber writes with a start
// or an expiry.
func (l *Lifecycle) startTasks(batch []*start) {
	ids := make([]uuid.UUID, len(batch))
	for i, c := range batch {
		ids[i] = c.id
	}
	byID := l.sharedWrite(batch[0].ctx, l.writes(ChangeStarted, ChangeExpired), len(batch), func(cs *changes) error {
		ts, err := cs.tx.UnscopedStartTasks(cs.ctx, ids)
		if err != nil {
			return err
		}
		for _, t := range ts {
			if err := cs.note(startChange(t)); err != nil {
				return err
			}
		}
		return nil
	})
	for _, c := range batch {
		c.made, c.written = takeFirst(byID, c.id)
	}
}

// startChange is the change a start statement made to t: started, or expired.
func startChange(t store.Task) Change {
	if t.State == agentqtype.TaskStateExpired {
		return Change{Kind: ChangeExpired, Task: t, From: agentqtype.TaskStateQueued}
	}
	return Change{Kind: ChangeStarted, Task: t, From: agentqtype.TaskStateQueued}
}

// startAlone is Start in a transaction of its own.
func (l *Lifecycle) startAlone(ctx context.Context, id uuid.UUID) (store.Task, StartOutcome, error) {
	var task store.Task
	var out StartOutcome
	err := l.inTx(ctx, func(cs *changes) error {
		tx := cs.tx
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
			return cs.note(startChange(t))
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
		return cs.note(Change{Kind: ChangeTakenOver, Task: t, From: agentqtype.TaskStateRunning})
	})
	if err != nil {
		return store.Task{}, 0, err
	}
	return task, out, nil
}

// ExpireOverdue ends as expired up to limit queued tasks that never started and whose
// start deadline has passed (see store.UnscopedExpireOverdue), in one transaction,
// and returns them; their ends' effects follow them (the subscribers' AfterCommit).
func (l *Lifecycle) ExpireOverdue(ctx context.Context, limit int) ([]store.Task, error) {
	var ts []store.Task
	err := l.inTx(ctx, func(cs *changes) error {
		var err error
		if ts, err = cs.tx.UnscopedExpireOverdue(ctx, limit); err != nil {
			return err
		}
		for _, t := range ts {
			if err := cs.note(Change{Kind: ChangeExpired, Task: t, From: agentqtype.TaskStateQueued}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ts, nil
}

// RecordStep records a finished step's result (usage, ledger rows, agent state) under
// the claim in p; see store.UnscopedRecordStep for the fencing. A step recorded before
// (a retry) changes nothing and returns nil.
func (l *Lifecycle) RecordStep(ctx context.Context, p store.RecordStepParams) error {
	return l.inTx(ctx, func(cs *changes) error { return l.recordStep(cs, p) })
}

func (l *Lifecycle) recordStep(cs *changes, p store.RecordStepParams) error {
	r, recorded, err := cs.tx.UnscopedRecordStep(cs.ctx, p)
	if err != nil || !recorded {
		return err
	}
	return cs.note(stepChange(r, p.Step))
}

// stepChange is the change of a step recorded: the task as the step left it, with
// the rollups its crossings are judged on.
func stepChange(r store.RecordedStep, step int) Change {
	return Change{Kind: ChangeStep, Task: r.Task, From: agentqtype.TaskStateRunning, Step: step, Recorded: &r}
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
			l.committed(ctx, c.made...)
			return true, nil
		}
	}
	return l.recordLastStepAlone(ctx, p, fin)
}

// lastStep is one call's completing last step in a group commit.
type lastStep struct {
	ctx     context.Context
	step    store.LastStep
	made    []Change // its step's and its end's, when written
	written bool     // recorded and ended by the shared transaction
}

// completeLastSteps writes a batch of completing last steps in one transaction, with
// each step's changes (see sharedWrite). If the transaction fails, none is written
// and each call writes its step alone.
func (l *Lifecycle) completeLastSteps(batch []*lastStep) {
	ps := make([]store.LastStep, len(batch))
	for i, c := range batch {
		ps[i] = c.step
	}
	byID := l.sharedWrite(batch[0].ctx, true, 2*len(batch), func(cs *changes) error {
		written, err := cs.tx.UnscopedCompleteLastSteps(cs.ctx, ps)
		if err != nil {
			return err
		}
		for _, r := range written {
			// One change made both: the step's and the end's see the task as it ended.
			if err := cs.note(stepChange(r, r.Task.Usage.Steps)); err != nil {
				return err
			}
			if err := cs.note(Change{Kind: ChangeFinished, Task: r.Task, From: agentqtype.TaskStateRunning, Step: r.Task.Usage.Steps, ByAttempt: true}); err != nil {
				return err
			}
		}
		return nil
	})
	for _, c := range batch {
		c.made, c.written = takeFirst(byID, c.step.ID)
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
	err = l.inTx(ctx, func(cs *changes) error {
		if err := l.recordStep(cs, p); errors.Is(err, store.ErrTaskEnded) {
			// A retry of a call that committed (its answer lost) finds the task ended
			// as it asked: done, as a second Finish would say.
			states, serr := cs.tx.UnscopedTaskStates(ctx, []uuid.UUID{p.ID})
			if serr == nil && states[p.ID] == fin.To {
				return nil
			}
			return err
		} else if err != nil {
			return err
		}
		ok, err = l.finishTx(cs, fin)
		return err
	})
	if err != nil {
		return false, err
	}
	return ok, nil
}

// FinishParams end a running attempt.
type FinishParams struct {
	Claim  store.Claim
	To     store.TaskState // a terminal state
	Output json.RawMessage
	Error  string // the reason it ends with (agentqtype's end reasons)
	// Stop names the limit that ended a task budget_exceeded (see quotas.Stop).
	Stop *quotas.Stop
	// Abandoned: the janitor ends a task whose attempts keep dying (To abandoned),
	// under the attempt it read, not the attempt itself.
	Abandoned bool
}

// Finish moves the claimed running task to p.To. ok=true when this call made the
// transition (its end's effects follow it: the subscribers' AfterCommit); false when
// the task had already ended under this attempt. ErrLostClaim when another attempt
// owns it.
//
// The janitor abandons a stale task (p.Abandoned, To abandoned) under the attempt it
// read, so a redelivery that took the task over since keeps it (ErrLostClaim).
func (l *Lifecycle) Finish(ctx context.Context, p FinishParams) (ok bool, err error) {
	err = l.inTx(ctx, func(cs *changes) error {
		var err error
		ok, err = l.finishTx(cs, p)
		return err
	})
	if err != nil {
		return false, err
	}
	return ok, nil
}

// finishTx is the end of a running attempt on the transaction.
func (l *Lifecycle) finishTx(cs *changes, p FinishParams) (ok bool, err error) {
	t, won, err := cs.tx.UnscopedFinishTask(cs.ctx, store.UnscopedFinishTaskParams{
		ID: p.Claim.ID, Attempt: p.Claim.Attempt, From: []store.TaskState{agentqtype.TaskStateRunning},
		To: p.To, Output: p.Output, Error: p.Error,
	})
	if err != nil || !won {
		return false, err
	}
	c := Change{Kind: ChangeFinished, Task: t, From: agentqtype.TaskStateRunning, Stop: p.Stop, ByAttempt: !p.Abandoned}
	if p.Abandoned {
		c.Kind = ChangeAbandoned
	}
	return true, cs.note(c)
}

// Requeue puts the claimed running task back to queued, keeping its recorded steps
// and agent state: the next attempt resumes from there. ErrLostClaim or ErrTaskEnded
// when the claim no longer holds.
func (l *Lifecycle) Requeue(ctx context.Context, c store.Claim) error {
	return l.inTx(ctx, func(cs *changes) error {
		t, err := cs.tx.UnscopedRequeueTask(ctx, c)
		if err != nil {
			return err
		}
		return cs.note(Change{Kind: ChangeRequeued, Task: t, From: agentqtype.TaskStateRunning})
	})
}

// ParkParams send a claimed running task back to queued to wait for token capacity.
type ParkParams = store.UnscopedParkTaskParams

// Park puts the claimed running task back to queued until the capacity its next step
// waits for is expected, keeping its recorded steps and agent state, and records what
// it waits for. ErrLostClaim or ErrTaskEnded when the claim no longer holds.
func (l *Lifecycle) Park(ctx context.Context, p ParkParams) error {
	return l.inTx(ctx, func(cs *changes) error {
		t, err := cs.tx.UnscopedParkTask(ctx, p)
		if err != nil {
			return err
		}
		return cs.note(Change{Kind: ChangeParked, Task: t, From: agentqtype.TaskStateRunning})
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
// recorded steps and agent state; the pause's event is written with it (the outbox's
// subscriber). ErrLostClaim or ErrTaskEnded when the claim no longer holds; a
// *PausedBoundError when its tenant has p.MaxPaused tasks paused already (the count
// and the pause are one transaction, serialised per tenant, so concurrent pauses
// never pass the bound).
func (l *Lifecycle) Pause(ctx context.Context, p PauseParams) (store.Task, error) {
	var t store.Task
	err := l.inTx(ctx, func(cs *changes) error {
		tx := cs.tx
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
		return cs.note(Change{Kind: ChangePaused, Task: t, From: agentqtype.TaskStateRunning, Stop: &p.Stop, ByAttempt: true})
	})
	return t, err
}

// Resume moves one of the tenant's paused tasks back to queued (see
// store.ResumeTask). ok=false when it is not paused (or was paused again since the
// pause p names). along, when set, writes on the same transaction (the audit row of a
// budget the resume changed).
func (l *Lifecycle) Resume(ctx context.Context, p store.ResumeTaskParams, along func(tx *store.Store, t store.Task) error) (t store.Task, ok bool, err error) {
	err = l.inTx(ctx, func(cs *changes) error {
		var err error
		t, ok, err = cs.tx.ResumeTask(ctx, p)
		if err != nil || !ok {
			return err
		}
		if along != nil {
			if err := along(cs.tx, t); err != nil {
				return err
			}
		}
		return cs.note(Change{Kind: ChangeResumed, Task: t, From: agentqtype.TaskStatePaused})
	})
	return t, ok, err
}

// ExpirePauses ends budget_exceeded, in one statement, up to limit tasks paused past
// their pause's expiry (their plan's pause_timeout_s, dated at the pause), each with
// its end's event naming the limit that paused it, and returns them as they ended.
func (l *Lifecycle) ExpirePauses(ctx context.Context, limit int) ([]store.Task, error) {
	var ended []store.Task
	err := l.inTx(ctx, func(cs *changes) error {
		var err error
		if ended, err = cs.tx.UnscopedExpirePauses(ctx, limit); err != nil {
			return err
		}
		for _, t := range ended {
			if err := cs.note(Change{Kind: ChangeFinished, Task: t, From: agentqtype.TaskStatePaused, Stop: pauseStop(t)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
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

// RequeueStale puts a running task whose heartbeat has been silent for staleAfter
// back to queued, whatever attempt runs it (that worker is gone), keeping its recorded
// steps and agent state. The silence is checked in the same statement as the change:
// a worker that stamped its heartbeat since, or a redelivery that took the task over,
// keeps it (ok=false).
func (l *Lifecycle) RequeueStale(ctx context.Context, id uuid.UUID, staleAfter time.Duration) (t store.Task, ok bool, err error) {
	err = l.inTx(ctx, func(cs *changes) error {
		var err error
		t, ok, err = cs.tx.UnscopedRequeueStale(ctx, id, staleAfter)
		if err != nil || !ok {
			return err
		}
		return cs.note(Change{Kind: ChangeRequeued, Task: t, From: agentqtype.TaskStateRunning})
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
	Reason   string // the reason the task ends with (agentqtype.CancelledByTenant)
}

// Cancel ends one of the tenant's queued, running or paused tasks as killed, whatever
// attempt runs it. ok=true when this call made the transition (its end's effects
// follow it: the subscribers' AfterCommit); false when the task had already ended
// (or is not the tenant's: agentqtype.ErrNotFound from a read tells which).
func (l *Lifecycle) Cancel(ctx context.Context, p CancelParams) (t store.Task, ok bool, err error) {
	err = l.inTx(ctx, func(cs *changes) error {
		var err error
		t, ok, err = cs.tx.FinishTask(ctx, store.FinishTaskParams{
			TenantID: p.TenantID, ID: p.ID, From: []store.TaskState{agentqtype.TaskStateQueued, agentqtype.TaskStateRunning, agentqtype.TaskStatePaused},
			To: agentqtype.TaskStateKilled, Error: p.Reason,
		})
		if err != nil || !ok {
			return err
		}
		return cs.note(Change{Kind: ChangeCancelled, Task: t})
	})
	if err != nil {
		return store.Task{}, false, err
	}
	return t, ok, nil
}

// StaleAfter is how long a running task's heartbeat must be silent before Start
// takes it over.
func (l *Lifecycle) StaleAfter() time.Duration { return l.staleAfter }
