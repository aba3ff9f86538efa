// Package change is the value that describes one committed state change of a task,
// and the interface of what subscribes to those changes (Subscriber): what must
// commit with a change, and what follows it once committed. The task lifecycle
// (internal/tasks) makes the changes and calls the subscribers; the events outbox
// (billing/outbox) is one, the end of a task's Redis state another. It is a package
// of its own so that a subscriber needs neither the lifecycle nor what it depends on.
package change

import (
	"context"
	"slices"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// Kind names a state change of a task.
type Kind string

// The state changes of a task.
const (
	Created   Kind = "created"    // a new task, queued
	Started   Kind = "started"    // queued → running, under a new attempt
	TakenOver Kind = "taken_over" // running under a stale attempt → a new attempt
	Step      Kind = "step"       // a step's result recorded on the running task
	Finished  Kind = "finished"   // running → a terminal state, by its attempt; or paused → budget_exceeded, past its pause timeout
	Requeued  Kind = "requeued"   // running → queued, to resume from its last step
	Parked    Kind = "parked"     // running → queued, to wait for token capacity
	Paused    Kind = "paused"     // running → paused, at a budget or quota limit
	Resumed   Kind = "resumed"    // paused → queued, by a resume
	Abandoned Kind = "abandoned"  // running → abandoned: its attempts keep dying
	Cancelled Kind = "cancelled"  // queued, running or paused → killed, by its tenant
	Expired   Kind = "expired"    // queued → expired: not started by its start deadline
)

// Change is one committed-together state change of a task.
type Change struct {
	Kind Kind
	// Task is the task as the change left it: its state is the state the change
	// moved it to, its Error the reason it ended with (agentqtype's end reasons).
	Task store.Task
	// From is the state the change moved the task from, when the change knows it
	// (every change that ends a task knows it; "" otherwise).
	From agentqtype.TaskState
	// Step is the step recorded (Step; Finished for a last step recorded with the
	// end).
	Step int
	// Recorded is what a recorded step left: the task, its tenant and the rollups
	// with the step (Step only).
	Recorded *store.RecordedStep
	// Stop is the limit that ended or paused the task: for an end as
	// budget_exceeded whose finisher named it, and for a pause (nil otherwise).
	Stop *quotas.Stop
	// ByAttempt: the change was made by the task's running attempt (its worker's
	// Finish or last step), which interrupts nothing of its own.
	ByAttempt bool
}

// To is the state the change moved the task to.
func (c Change) To() agentqtype.TaskState { return c.Task.State }

// Ends reports whether the change ended the task: its state is terminal now and
// was not before.
func (c Change) Ends() bool {
	switch c.Kind {
	case Finished, Abandoned, Cancelled, Expired:
		return c.Task.State.Terminal()
	}
	return false
}

// Subscriber is told of a task's state changes, at two moments:
//
//   - InTx, inside the change's transaction, with it (tx): what must exist exactly
//     when the change committed is written there (the events outbox's rows). Its
//     error rolls the change back. It is called only for the kinds Writes reports.
//   - AfterCommit, once the change committed, for every change: what follows it and
//     cannot be part of it (Redis calls, a message, a write in a transaction of its
//     own). It cannot undo the change: it logs its failures.
type Subscriber interface {
	// Writes reports whether InTx writes anything for changes of kind. A change
	// written by one statement, outside a transaction (the group start every task
	// makes), opens one only when a subscriber writes for its kind.
	Writes(kind Kind) bool
	InTx(ctx context.Context, tx *store.Store, c Change) error
	AfterCommit(ctx context.Context, c Change)
}

// Funcs is a Subscriber made of functions; a nil one does nothing. Tests use it.
type Funcs struct {
	// Kinds are the kinds InTx runs for; nil: all of them.
	Kinds    []Kind
	Tx       func(ctx context.Context, tx *store.Store, c Change) error
	Followed func(ctx context.Context, c Change)
}

// Writes reports whether f.Tx runs for kind.
func (f Funcs) Writes(kind Kind) bool {
	if f.Tx == nil {
		return false
	}
	if f.Kinds == nil {
		return true
	}
	return slices.Contains(f.Kinds, kind)
}

// InTx runs f.Tx.
func (f Funcs) InTx(ctx context.Context, tx *store.Store, c Change) error {
	if f.Tx == nil {
		return nil
	}
	return f.Tx(ctx, tx, c)
}

// AfterCommit runs f.Followed.
func (f Funcs) AfterCommit(ctx context.Context, c Change) {
	if f.Followed != nil {
		f.Followed(ctx, c)
	}
}
