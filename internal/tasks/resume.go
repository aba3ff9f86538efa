package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/internal/wire"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/scheduler"
)

// NotPausedError is a resume of a task that is not paused (State says what it is),
// or of a pause that is over: an approval link made for an earlier pause.
type NotPausedError struct {
	ID    uuid.UUID
	State string
	// Stale: the task was paused again since the pause the resume named.
	Stale bool
}

func (e *NotPausedError) Error() string {
	if e.Stale {
		return fmt.Sprintf("task %s was resumed since this approval was made", e.ID)
	}
	return fmt.Sprintf("task %s is %s, not paused", e.ID, e.State)
}

// ResumeRefusedError is a resume its tenant's sessions are too full to take: the task
// stays paused. Tenant is the tenant it judged (the HTTP answer names its plan).
type ResumeRefusedError struct {
	quotas.ReAdmitRefusal
	Tenant tenants.Tenant
}

// Unwrap gives the refusal.
func (e *ResumeRefusedError) Unwrap() error { return &e.ReAdmitRefusal }

// ResumeParams resume one of a tenant's paused tasks.
type ResumeParams struct {
	TenantID string
	ID       uuid.UUID
	// Budget raises (or lowers) fields of the task's budget, each at most the plan's
	// ceiling; nil keeps the budget as it is.
	Budget *BudgetRequest
	// Pause, when above 0, is the pause the resume was made for (an approval link's):
	// a task paused again since is a *NotPausedError with Stale set.
	Pause int
	// Scope is what the API key resuming may see: a task outside it is
	// agentqtype.ErrNotFound. The zero Scope sees every task of the tenant (the
	// library, a link, the sweep).
	Scope Scope
	// RaiseOnly refuses (an *agentqtype.InvalidError) a Budget field below the task's
	// current value: an approval link only raises.
	RaiseOnly bool
}

// Resume sends a paused task back to its tenant's queue to run its next step, with
// its state and usage as they were: its budget takes the raise p carries (within the
// plan's ceiling, else an *agentqtype.InvalidError and nothing changes); the limits must have
// room for the step that paused it, as the pause estimated it (else a
// *NeedsRoomError); it is admitted again against its tenant's sessions (a full limit
// is a *ResumeRefusedError); and the time it was paused is not charged to its wall
// clock. A task outside p.Scope is agentqtype.ErrNotFound, a suspended tenant's a
// *agentqtype.SuspendedError. Refused, the task stays paused as it was.
func (s *Service) Resume(ctx context.Context, p ResumeParams) (Task, error) {
	if p.TenantID == "" {
		return Task{}, ErrNoTenant
	}
	t, err := s.d.Store.GetTask(ctx, store.GetTaskParams{TenantID: p.TenantID, ID: p.ID})
	if err != nil {
		return Task{}, err
	}
	if t.State != agentqtype.TaskStatePaused {
		return Task{}, &NotPausedError{ID: p.ID, State: string(t.State)}
	}
	if p.Pause > 0 && t.Pause.Count != p.Pause {
		return Task{}, &NotPausedError{ID: p.ID, State: string(t.State), Stale: true}
	}
	tenant, err := s.d.Tenant(ctx, p.TenantID)
	if err != nil {
		return Task{}, err
	}
	if err := checkResumable(p, t, tenant); err != nil {
		return Task{}, err
	}
	pol, err := s.d.Tenants.Policy(tenant)
	if err != nil {
		return Task{}, err
	}
	budget, err := s.resumeBudget(ctx, p, t, tenant, pol)
	if err != nil {
		return Task{}, err
	}
	budgetJSON, _ := json.Marshal(budget)
	if err := s.readmit(ctx, tenant, pol, t, budget); err != nil {
		return Task{}, err
	}
	resumed, ok, err := s.d.Lifecycle.Resume(ctx, store.ResumeTaskParams{TenantID: p.TenantID, ID: p.ID, Pause: p.Pause, Budget: budgetJSON},
		budgetChange(ctx, StoredBudget(pol.Budget, t.Budget), budget))
	if err != nil || !ok {
		return Task{}, s.notResumed(ctx, p, err)
	}
	if err := s.d.Queue.Enqueue(ctx, scheduler.EnqueueParams{
		TenantID: p.TenantID, TaskID: resumed.ID, Priority: resumed.Priority, CreatedAt: resumed.CreatedAt,
		Weight: pol.Weight, RunningCap: pol.RunningCap,
	}); err != nil {
		// Queued in Postgres: the recovery sweep pushes queued tasks missing from Redis.
		s.log.Error("pushing a resumed task to its queue failed; it stays queued in Postgres", "task_id", resumed.ID, "err", err)
	}
	s.publishState(ctx, wire.StateProgress(resumed.ID.String(), string(agentqtype.TaskStateQueued), ""))
	return Task{Task: resumed}, nil
}

// resumeBudget is the budget a resume leaves the task with, once the limits are
// found to have room for its next step under it.
func (s *Service) resumeBudget(ctx context.Context, p ResumeParams, t store.Task, tenant tenants.Tenant, pol tenants.Policy) (quotas.TaskBudget, error) {
	cur := StoredBudget(pol.Budget, t.Budget)
	if p.RaiseOnly {
		if err := checkRaiseOnly(p.Budget, cur); err != nil {
			return cur, err
		}
	}
	budget, err := RaiseBudget(pol.Budget, cur, p.Budget)
	if err != nil {
		return cur, err
	}
	return budget, s.checkRoom(ctx, tenant, pol, t, budget)
}

// ActionResumeBudget is the audit action of a resume that changed its task's budget.
const ActionResumeBudget = "task.resume_budget"

// budgetChange is what a resume writes with its change when it moved the task's
// budget from before to after: the audit row of who changed the tenant's spending
// (the key, the approval link, the library); nil when the budget stayed.
func budgetChange(ctx context.Context, before, after quotas.TaskBudget) func(tx *store.Store, t store.Task) error {
	if before == after {
		return nil
	}
	return func(tx *store.Store, t store.Task) error {
		_, err := audit.Append(ctx, tx, audit.Entry{Action: ActionResumeBudget,
			Object: audit.Object{Kind: audit.KindTask, ID: t.ID.String(), Tenant: t.TenantID},
			Before: audit.BudgetState{Budget: before}, After: audit.BudgetState{Budget: after}})
		return err
	}
}

// notResumed gives back the lease a resume took when its write did not resume the
// task (err: it failed), and says why. A concurrent resume that won holds the same
// lease (a task's lease is its id): that one is kept.
func (s *Service) notResumed(ctx context.Context, p ResumeParams, err error) error {
	release := func() { s.d.Admission.Release(context.WithoutCancel(ctx), p.TenantID, p.ID.String()) }
	if err != nil {
		release()
		return err
	}
	cur, err := s.d.Store.GetTask(ctx, store.GetTaskParams{TenantID: p.TenantID, ID: p.ID})
	if err != nil {
		return err
	}
	if cur.State == agentqtype.TaskStatePaused || cur.State.Terminal() {
		release()
	}
	return &NotPausedError{ID: p.ID, State: string(cur.State), Stale: cur.State == agentqtype.TaskStatePaused}
}

// readmit takes the resuming task's session lease; a spawned task takes none (its
// tree holds its root's).
func (s *Service) readmit(ctx context.Context, tenant tenants.Tenant, pol tenants.Policy, t store.Task, b quotas.TaskBudget) error {
	err := s.d.Admission.Quotas().ReAdmit(ctx, quotas.ReAdmitParams{
		TenantID: t.TenantID, TaskID: t.ID.String(), Limits: pol.Limits,
		LongRunning: b.MaxWallclockS > quotas.LongRunningThreshold.Seconds(), Spawned: t.ParentID != nil,
	})
	var refused *quotas.ReAdmitRefusal
	switch {
	case errors.Is(err, quotas.ErrHandOff):
		return &HandOffError{ID: t.ID}
	case errors.As(err, &refused):
		return &ResumeRefusedError{ReAdmitRefusal: *refused, Tenant: tenant}
	case err != nil:
		return &AdmissionError{Err: err}
	}
	return nil
}

// publishState tells a task's progress stream its new state (best effort: the
// stream re-reads Postgres for state).
func (s *Service) publishState(ctx context.Context, m wire.Progress) {
	_ = s.d.Redis.Publish(ctx, s.d.Keys.TaskEvents(m.TaskID), m.Encode()).Err()
}

// StoredBudget reads a task's stored budget, a field missing or not above 0 taking
// the plan's default (as the worker does).
func StoredBudget(plan quotas.Budget, raw json.RawMessage) quotas.TaskBudget {
	var b quotas.TaskBudget
	_ = json.Unmarshal(raw, &b)
	return plan.Fill(b)
}

// RaiseBudget applies a resume's budget request to a task's budget b: each field
// given replaces b's, and must be above 0 and at most the plan's ceiling (never past
// it: the ceiling is what the plan sells).
func RaiseBudget(plan quotas.Budget, b quotas.TaskBudget, req *BudgetRequest) (quotas.TaskBudget, error) {
	if req == nil {
		return b, nil
	}
	full := plan
	full.Default = b
	return ResolveBudget(full, req)
}

// HandOffError is a resume of a task whose pausing delivery has not yet given back
// its dispatch slot: the pause is written, the hand-off is not over. Retry in a
// moment (RetryAfter); nothing changed.
type HandOffError struct {
	ID uuid.UUID
}

func (e *HandOffError) Error() string {
	return fmt.Sprintf("task %s is still being handed off by the worker that paused it; retry", e.ID)
}

// RetryAfter is how soon a retry is worth making.
func (e *HandOffError) RetryAfter() time.Duration { return time.Second }
