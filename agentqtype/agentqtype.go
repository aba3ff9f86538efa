// Package agentqtype holds the words every layer of agentq shares: the task states
// and which of them are terminal, and the errors that the domain services, the Go
// library and the HTTP API all speak of (a refused field, a missing thing, a refused
// task, an unavailable backing service). It imports only the standard library, so
// that any package can use it without pulling in the service; the client package,
// which may not import it, has its state constants generated from it.
package agentqtype

import (
	"errors"
	"fmt"
	"slices"
)

// TaskState is a task's state, as stored, as the HTTP API shows it and as the Go
// library returns it.
type TaskState string

// Task states. The constants are untyped so that they serve both as a TaskState and
// as the plain string the library's and the wire's task types hold.
const (
	TaskStateQueued         = "queued"
	TaskStateRunning        = "running"
	TaskStatePaused         = "paused" // at a budget or quota limit, until resumed
	TaskStateCompleted      = "completed"
	TaskStateFailed         = "failed"
	TaskStateKilled         = "killed" // cancelled
	TaskStateBudgetExceeded = "budget_exceeded"
	TaskStateAbandoned      = "abandoned"
	TaskStateExpired        = "expired" // not started by its start deadline
)

var (
	taskStates = []TaskState{TaskStateQueued, TaskStateRunning, TaskStatePaused, TaskStateCompleted, TaskStateFailed,
		TaskStateKilled, TaskStateBudgetExceeded, TaskStateAbandoned, TaskStateExpired}
	terminalStates = []TaskState{TaskStateCompleted, TaskStateFailed, TaskStateKilled,
		TaskStateBudgetExceeded, TaskStateAbandoned, TaskStateExpired}
)

// TaskStates returns every task state, in the order a task can pass through them.
func TaskStates() []TaskState { return slices.Clone(taskStates) }

// TerminalTaskStates returns the states a task never leaves.
func TerminalTaskStates() []TaskState { return slices.Clone(terminalStates) }

// Terminal reports whether a task in state s has ended for good.
func (s TaskState) Terminal() bool { return slices.Contains(terminalStates, s) }

// Valid reports whether s is one of TaskStates.
func (s TaskState) Valid() bool { return slices.Contains(taskStates, s) }

// ErrNotFound matches (errors.Is) every missing thing: a tenant, key, task, agent,
// pool, binding or webhook endpoint the caller named and that is not there (for a
// tenant's task: not the tenant's). The store returns it bare; the services that
// name what is missing return a *NotFoundError, which matches it.
var ErrNotFound = errors.New("agentq: not found")

// NotFoundError is a named thing that does not exist. Message is the sentence the
// HTTP API answers with (404 NOT_FOUND) and the CLI prints.
type NotFoundError struct {
	What    string // "tenant", "key", "agent", "pool", "binding" or "webhook endpoint"
	Name    string // the name or id it was asked by
	Message string
}

// Error is Message.
func (e *NotFoundError) Error() string { return e.Message }

// Is makes errors.Is(err, ErrNotFound) true.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// InvalidError is a refused field of a request: a tenant's, a key's, a task's, an
// agent's, a pool's or a webhook endpoint's. Message is a sentence meant for the
// person who sent the value; the HTTP API answers with it (400 INVALID_REQUEST, or
// INVALID_JSON when NotJSON), the CLI prints it.
type InvalidError struct {
	Field   string // as the HTTP API names it: "id", "plan", "agent", "budget", "url", ...
	Message string
	NotJSON bool // the field is not valid JSON
}

// Error is Message.
func (e *InvalidError) Error() string { return e.Message }

// Invalid is an *InvalidError of field with the message format makes of args.
func Invalid(field, format string, args ...any) *InvalidError {
	return &InvalidError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// UnknownAgentError is an agent name that names no agent: none runs in process by
// it and no HTTP agent is registered under it. A task for it is refused.
type UnknownAgentError struct{ Agent string }

// Error says which agent is unknown.
func (e *UnknownAgentError) Error() string { return fmt.Sprintf("unknown agent %q", e.Agent) }

// SuspendedError refuses a task of a suspended tenant.
type SuspendedError struct{ TenantID string }

// Error says which tenant is suspended.
func (e *SuspendedError) Error() string { return fmt.Sprintf("tenant %s is suspended", e.TenantID) }

// IdempotencyConflictError refuses a task whose idempotency key was used with a
// different request.
type IdempotencyConflictError struct{ Key string }

// Error says which key was used.
func (e *IdempotencyConflictError) Error() string {
	return fmt.Sprintf("idempotency key %q was already used with a different request", e.Key)
}

// Failures of a backing service, as the store reports them (wrapping the driver's
// error, so its details stay at hand): callers tell them apart with errors.Is and
// need not know the driver.
var (
	// ErrUnavailable: a backing service cannot be reached or is not taking work now
	// (Postgres restarting, a dropped connection, a timeout); a retry later may pass.
	ErrUnavailable = errors.New("agentq: a backing service is unavailable")
	// ErrValueRefused: Postgres refused a value as data (bad encoding, NUL, a number
	// or nesting it cannot hold). Requests are validated before anything is stored,
	// so this is what validation missed: the caller's input, not a failure.
	ErrValueRefused = errors.New("agentq: the database refused a value")
)
