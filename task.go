package agentq

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/quotas"
)

// Refusals of a task. The task service returns these very values (the shared
// vocabulary, agentqtype), so errors.As matches them whichever layer an error came
// through.
type (
	// UnknownAgentError refuses a task for an agent that neither runs in process nor
	// is registered as an HTTP agent.
	UnknownAgentError = agentqtype.UnknownAgentError
	// SuspendedError refuses a task of a suspended tenant.
	SuspendedError = agentqtype.SuspendedError
	// IdempotencyConflictError refuses a task whose idempotency key was used with a
	// different request.
	IdempotencyConflictError = agentqtype.IdempotencyConflictError
	// LimitError refuses a task that a limit of the tenant's does not allow now.
	// Decision.Violated names the limits; the RetryAfter of each violated scope of
	// Decision.Scopes says when a retry can pass.
	LimitError = quotas.LimitError
)

// TaskEndedError refuses to cancel a task that already ended: ID is the task, State
// how it ended.
type TaskEndedError struct {
	ID    uuid.UUID
	State string
}

// Error says how the task ended, as the task service says it.
func (e *TaskEndedError) Error() string {
	return (&tasks.FinishedError{ID: e.ID, State: e.State}).Error()
}

// TaskNotPausedError refuses to resume a task that is not paused: State is what it
// is (Stale: it was resumed, or paused again, since the pause named).
type TaskNotPausedError struct {
	ID    uuid.UUID
	State string
	Stale bool
}

// Error says what the task is, as the task service says it.
func (e *TaskNotPausedError) Error() string {
	return (&tasks.NotPausedError{ID: e.ID, State: e.State, Stale: e.Stale}).Error()
}

// ResumeRefusedError refuses to resume a paused task while its tenant's concurrent
// sessions are full: the ReAdmitRefusal names the limit, its value and the sessions
// held. The task stays paused.
type ResumeRefusedError struct {
	quotas.ReAdmitRefusal
}

// Unwrap gives the session limit's refusal.
func (e *ResumeRefusedError) Unwrap() error { return &e.ReAdmitRefusal }

// ResumeNeedsRoomError refuses to resume a paused task whose limits have no room for
// its next step (the step that paused it, as its pause estimated it): its Shortfall
// names the limit, the room the step needs and the least value of the limit that
// gives it. A budget field's room comes with a raise; a quota's with the next period
// or a raise of the tenant's limit. The task stays paused.
type ResumeNeedsRoomError struct {
	ID uuid.UUID
	quotas.Shortfall
}

// Error names the limit and the room the step needs, as the task service says it.
func (e *ResumeNeedsRoomError) Error() string {
	return (&tasks.NeedsRoomError{ID: e.ID, Shortfall: e.Shortfall}).Error()
}

// Budget reports whether the limit is a field of the task's budget, which a
// resume's raise can lift.
func (e *ResumeNeedsRoomError) Budget() bool { return quotas.IsBudgetLimit(e.LimitType) }

// taskErr turns the task service's refusals of a cancel or a resume into the
// library's, and returns any other error as it is.
func taskErr(err error) error {
	var (
		finished  *tasks.FinishedError
		notPaused *tasks.NotPausedError
		refused   *tasks.ResumeRefusedError
		room      *tasks.NeedsRoomError
	)
	switch {
	case errors.As(err, &finished):
		return &TaskEndedError{ID: finished.ID, State: finished.State}
	case errors.As(err, &notPaused):
		return &TaskNotPausedError{ID: notPaused.ID, State: notPaused.State, Stale: notPaused.Stale}
	case errors.As(err, &refused):
		return &ResumeRefusedError{ReAdmitRefusal: refused.ReAdmitRefusal}
	case errors.As(err, &room):
		return &ResumeNeedsRoomError{ID: room.ID, Shortfall: room.Shortfall}
	}
	return err
}

// TaskState is a task's state; Task.State and TaskQuery.State hold one as a string.
type TaskState = agentqtype.TaskState

// Task states.
const (
	TaskQueued         = agentqtype.TaskStateQueued
	TaskRunning        = agentqtype.TaskStateRunning
	TaskPaused         = agentqtype.TaskStatePaused // at a budget or quota limit, until resumed
	TaskCompleted      = agentqtype.TaskStateCompleted
	TaskFailed         = agentqtype.TaskStateFailed
	TaskKilled         = agentqtype.TaskStateKilled // cancelled
	TaskBudgetExceeded = agentqtype.TaskStateBudgetExceeded
	TaskAbandoned      = agentqtype.TaskStateAbandoned
	TaskExpired        = agentqtype.TaskStateExpired // not started by its start deadline
)

// Task is a task and where it stands, as the library returns it: money in dollars,
// the budget decoded, and none of the row's bookkeeping (the key it came with, the
// request hash, the agent's state), which the store's row keeps for the service.
type Task struct {
	ID       uuid.UUID
	TenantID string
	Agent    string
	User     string // "" when the submission named none
	State    string // one of the Task* states
	Priority int    // 0 (lowest) to 9
	Input    json.RawMessage
	Output   json.RawMessage // the agent's output once it completed; nil before
	Error    string          // why it ended, when it did not complete
	// Budget is what the task may spend: the submission's budget, with the plan's
	// defaults for what it left out.
	Budget quotas.TaskBudget
	// Usage is what it spent so far.
	Usage TaskUsage
	// WaitReason says why a queued task waits and where it stands (as the HTTP API's
	// wait_reason); nil when it is not queued or that could not be told.
	WaitReason *WaitReason
	// StartDeadline is when the task expires if no worker has started it by then;
	// nil when it was submitted without one.
	StartDeadline *time.Time
	// PausedReason is the limit that paused a paused task (TaskPaused): a budget
	// field (task_max_steps, task_max_cost_usd, task_max_wallclock_s) or one of its
	// tenant's period quotas; "" otherwise.
	PausedReason string
	// Attempt counts the times a worker started or took over the task, from 1 once
	// it started.
	Attempt    int
	CreatedAt  time.Time
	StartedAt  *time.Time // when a worker first started it; nil while queued
	FinishedAt *time.Time // when it ended; nil before
}

// WaitReason is why a queued task waits and where it stands.
type WaitReason struct {
	// Reason is behind_fair_share, tenant_running_cap or no_worker_capacity while
	// the task stands in its tenant's queue; tokens_per_minute, pool:<name> or
	// throttled while it is parked for token capacity.
	Reason string
	// Position is the task's 1-based place among its tenant's queued tasks, in the
	// order they are dispatched; 0 for a parked task, which is out of the queue.
	Position int
	// ExpectedStart is when the task is expected to start at its tenant's measured
	// start rate (for a parked task, Until); nil while no rate is measured.
	ExpectedStart *time.Time
	// Until is when the capacity a parked task waits for is expected; nil otherwise.
	Until *time.Time
}

// Ended reports whether the task reached a final state.
func (t Task) Ended() bool { return TaskState(t.State).Terminal() }

// TaskUsage is what a task consumed.
type TaskUsage struct {
	Steps   int
	Tokens  int64
	CostUSD float64
}

func taskOf(t tasks.Task) Task {
	out := Task{
		ID: t.ID, TenantID: t.TenantID, Agent: t.Agent, User: t.User, State: string(t.State), Priority: t.Priority,
		Input: t.Input, Output: t.Output, Attempt: t.Attempt,
		Usage:     TaskUsage{Steps: t.Usage.Steps, Tokens: t.Usage.Tokens, CostUSD: float64(t.Usage.CostMicroUSD) / 1e6},
		CreatedAt: t.CreatedAt, StartedAt: t.StartedAt, FinishedAt: t.FinishedAt, StartDeadline: t.StartDeadline,
	}
	if t.Error != nil {
		out.Error = *t.Error
	}
	if w := t.WaitReason; w != nil {
		out.WaitReason = &WaitReason{Reason: w.Reason, Position: int(w.Position), ExpectedStart: w.ExpectedStart, Until: w.Until}
	}
	if t.State == agentqtype.TaskStatePaused && t.Pause.Reason != nil {
		out.PausedReason = *t.Pause.Reason
	}
	_ = json.Unmarshal(t.Budget, &out.Budget) // stored by Submit from a TaskBudget
	return out
}

// NewTask is a task to submit.
type NewTask struct {
	TenantID string
	Agent    string
	// Input is the agent's input, a JSON value; nil is {}.
	Input json.RawMessage
	// User is who the task acts for (per-user limits apply to it); "" for none.
	User string
	// Budget caps the task; nil fields take the plan's default, and no field may
	// exceed the plan's ceiling.
	Budget *TaskBudget
	// Priority is 0 (lowest) to 9; nil is the default, 5.
	Priority *int
	// IdempotencyKey, when set, makes a resubmission of the same request return the
	// task the first one made.
	IdempotencyKey string
	// StartWithin, when above 0, is how long the task may wait to start (at most 7
	// days): one no worker started by then ends expired (TaskExpired), charged
	// nothing.
	StartWithin time.Duration
}

// TaskBudget is a requested task budget (NewTask.Budget): nil fields take the plan's
// default, and none may exceed the plan's ceiling. The task service takes it as it is.
type TaskBudget = quotas.BudgetRequest

// SubmitTask validates a task, admits it against the tenant's limits and queues it,
// as POST /v1/tasks does. The submission carries no API key: the per-key limits
// (key_rate, key_agent_rate) count every Go submission of a tenant together. A
// refused field is an *InvalidError, a refusal by a limit a *LimitError; see also
// UnknownAgentError, SuspendedError, IdempotencyConflictError and ErrUnavailable.
func (a *App) SubmitTask(ctx context.Context, p NewTask) (Task, error) {
	res, err := a.services.Tasks.Submit(ctx, tasks.SubmitParams{
		TenantID: p.TenantID, Agent: p.Agent, Input: p.Input, User: p.User, Budget: p.Budget,
		Priority: p.Priority, IdempotencyKey: p.IdempotencyKey, StartWithinS: startWithinS(p.StartWithin),
	})
	if err != nil {
		return Task{}, libraryErr(err)
	}
	return taskOf(res.Task), nil
}

// startWithinS is a NewTask's StartWithin as the task service takes it: nil for none.
// A negative one is passed on, for the service to refuse.
func startWithinS(d time.Duration) *float64 {
	if d == 0 {
		return nil
	}
	s := d.Seconds()
	return &s
}

// GetTask returns one of the tenant's tasks, or ErrNotFound.
func (a *App) GetTask(ctx context.Context, tenantID string, id uuid.UUID) (Task, error) {
	t, err := a.services.Tasks.Get(ctx, tenantID, id)
	if err != nil {
		return Task{}, libraryErr(err)
	}
	return taskOf(t), nil
}

// TaskQuery selects a page of a tenant's tasks, newest first.
type TaskQuery struct {
	TenantID string
	State    string    // one of the Task* states; "" for all
	Limit    int       // 1 to 500; 0 is 50
	Before   uuid.UUID // TaskPage.Next of the previous page; zero for the first
}

// TaskPage is a page of tasks; Next, when not nil, selects the next page.
type TaskPage struct {
	Tasks []Task
	Next  *uuid.UUID
}

// ListTasks returns a page of the tenant's tasks. A bad State or Limit is an
// *InvalidError.
func (a *App) ListTasks(ctx context.Context, q TaskQuery) (TaskPage, error) {
	page, err := a.services.Tasks.List(ctx, tasks.ListParams{TenantID: q.TenantID, State: q.State, Limit: q.Limit, Before: q.Before})
	if err != nil {
		return TaskPage{}, libraryErr(err)
	}
	out := TaskPage{Tasks: make([]Task, 0, len(page.Tasks)), Next: page.Next}
	for _, t := range page.Tasks {
		out.Tasks = append(out.Tasks, taskOf(t))
	}
	return out, nil
}

// CancelTask ends one of the tenant's queued or running tasks as killed: a running
// step is interrupted wherever it runs. A task that already ended is a
// *TaskEndedError; one the tenant does not have ErrNotFound.
func (a *App) CancelTask(ctx context.Context, tenantID string, id uuid.UUID) (Task, error) {
	t, err := a.services.Tasks.Cancel(ctx, tenantID, id)
	if err != nil {
		return Task{}, libraryErr(err)
	}
	return taskOf(t), nil
}

// ResumeTask sends one of the tenant's paused tasks back to its queue to run its next
// step, its state and usage as they were. raise, when not nil, raises fields of its
// budget, each at most the plan's ceiling (more is an *InvalidError, and nothing
// changes). Its limits, the budget as raised and the tenant's quotas, must have room
// for its next step: a *ResumeNeedsRoomError otherwise. The task is admitted again
// against its tenant's sessions: a *ResumeRefusedError while they are full. A
// suspended tenant's task is a *SuspendedError, one that is not paused a
// *TaskNotPausedError, one the tenant does not have ErrNotFound.
func (a *App) ResumeTask(ctx context.Context, tenantID string, id uuid.UUID, raise *TaskBudget) (Task, error) {
	t, err := a.services.Tasks.Resume(ctx, tasks.ResumeParams{TenantID: tenantID, ID: id, Budget: raise})
	if err != nil {
		return Task{}, libraryErr(err)
	}
	return taskOf(t), nil
}
