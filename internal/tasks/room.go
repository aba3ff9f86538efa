package tasks

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
)

// Scope is what an API key may see of its tenant's tasks: the agents and the
// principals (users) it was given; an empty list allows all. A task outside it is,
// to that key, a task that does not exist (agentqtype.ErrNotFound).
type Scope struct {
	Agents, Principals []string
}

// Sees reports whether a key of scope sc may see a task of agent for user.
func (sc Scope) Sees(agent, user string) bool {
	return (len(sc.Agents) == 0 || slices.Contains(sc.Agents, agent)) &&
		(len(sc.Principals) == 0 || slices.Contains(sc.Principals, user))
}

// all reports whether sc allows every task of the tenant.
func (sc Scope) all() bool { return len(sc.Agents) == 0 && len(sc.Principals) == 0 }

// GetIn is Get for a key of scope sc: a task outside it is agentqtype.ErrNotFound.
func (s *Service) GetIn(ctx context.Context, tenantID string, sc Scope, id uuid.UUID) (Task, error) {
	t, err := s.StoredIn(ctx, tenantID, sc, id)
	if err != nil {
		return Task{}, err
	}
	return s.WithWaitReason(ctx, t), nil
}

// StoredIn is Stored for a key of scope sc: a task outside it is agentqtype.ErrNotFound.
func (s *Service) StoredIn(ctx context.Context, tenantID string, sc Scope, id uuid.UUID) (Task, error) {
	t, err := s.Stored(ctx, tenantID, id)
	if err == nil && !sc.Sees(t.Agent, t.User) {
		return Task{}, agentqtype.ErrNotFound
	}
	return t, err
}

// CancelIn is Cancel for a key of scope sc: a task outside it is
// agentqtype.ErrNotFound and is left as it is.
func (s *Service) CancelIn(ctx context.Context, tenantID string, sc Scope, id uuid.UUID) (Task, error) {
	if !sc.all() {
		if _, err := s.StoredIn(ctx, tenantID, sc, id); err != nil {
			return Task{}, err
		}
	}
	return s.Cancel(ctx, tenantID, id)
}

// NeedsRoomError is a resume refused because a limit has no room for the task's next
// step, the step that paused it: resumed, the task would only pause (or stop) again
// before it. The Shortfall names the limit, its value and use, the room the step
// needs and the least value of the limit that gives it, in the limit's unit. A
// budget field's room comes with a raise (ResumeParams.Budget); a quota's with the
// tenant's next period, or an operator's raise. The task stays paused.
type NeedsRoomError struct {
	ID uuid.UUID
	quotas.Shortfall
}

func (e *NeedsRoomError) Error() string {
	return fmt.Sprintf("task %s: %s has no room for its next step (needs %d more, a limit of at least %d)",
		e.ID, e.LimitType, e.Need, e.AtLeast)
}

// Budget reports whether the limit is a field of the task's budget, which a resume's
// raise can lift.
func (e *NeedsRoomError) Budget() bool { return quotas.IsBudgetLimit(e.LimitType) }

// PausedNext is what a paused task's next step is expected to take, as its pause
// kept it.
func PausedNext(t store.Task) quotas.NextStep {
	var n quotas.NextStep
	if e := t.Wait.StepEstimate; e != nil {
		n.Tokens = max(*e, 0)
	}
	if e := t.Wait.StepCostEstimate; e != nil {
		n.CostMicro = max(*e, 0)
	}
	return n
}

// PausedUse is what a paused task used of its budget: its steps, its cost and its
// wall clock up to the pause, the time it waited for capacity not counted.
func PausedUse(t store.Task) quotas.TaskUse {
	u := quotas.TaskUse{Steps: t.Usage.Steps, CostMicro: t.Usage.CostMicroUSD}
	if t.StartedAt != nil && t.Pause.At != nil {
		u.Wall = max(t.Pause.At.Sub(*t.StartedAt)-time.Duration(t.WaitedMs)*time.Millisecond, 0)
	}
	return u
}

// checkResumable refuses a resume a key may not make or its tenant may not have:
// a task outside the key's scope is agentqtype.ErrNotFound, a suspended tenant's task a
// *agentqtype.SuspendedError.
func checkResumable(p ResumeParams, t store.Task, tenant tenants.Tenant) error {
	if !p.Scope.Sees(t.Agent, t.User) {
		return agentqtype.ErrNotFound
	}
	if tenant.Status == "suspended" {
		return &agentqtype.SuspendedError{TenantID: tenant.ID}
	}
	return nil
}

// checkRaiseOnly refuses, for a resume that may only raise (an approval link's), a
// budget field given below the task's current value.
func checkRaiseOnly(req *BudgetRequest, cur quotas.TaskBudget) error {
	if req == nil {
		return nil
	}
	lower := func(field string, v, now any) error {
		return invalid("budget", "%s %v is below the task's current %v: an approval only raises a budget.", field, v, now)
	}
	switch {
	case req.MaxSteps != nil && *req.MaxSteps < cur.MaxSteps:
		return lower("max_steps", *req.MaxSteps, cur.MaxSteps)
	case req.MaxWallclockS != nil && *req.MaxWallclockS < cur.MaxWallclockS:
		return lower("max_wallclock_s", *req.MaxWallclockS, cur.MaxWallclockS)
	case req.MaxCostUSD != nil && *req.MaxCostUSD < cur.MaxCostUSD:
		return lower("max_cost_usd", *req.MaxCostUSD, cur.MaxCostUSD)
	}
	return nil
}

// checkRoom refuses a resume whose next step the limits have no room for: the
// task's budget b (as the resume leaves it) and its tenant's period quotas, read
// without taking anything. The step is the one the pause kept.
func (s *Service) checkRoom(ctx context.Context, tenant tenants.Tenant, pol tenants.Policy, t store.Task, b quotas.TaskBudget) error {
	next := PausedNext(t)
	if sf := quotas.BudgetRoom(b, PausedUse(t), next); sf != nil {
		return &NeedsRoomError{ID: t.ID, Shortfall: *sf}
	}
	use, err := s.quotaUse(ctx, tenant, pol)
	if err != nil {
		return err
	}
	if sf := QuotaShortfall(use, next); sf != nil {
		return &NeedsRoomError{ID: t.ID, Shortfall: *sf}
	}
	return nil
}

// QuotaShortfall is the first of the period quotas in use (by limit_type) whose room
// does not cover the step next; nil when all do.
func QuotaShortfall(use map[string]quotas.Scope, next quotas.NextStep) *quotas.Shortfall {
	for _, name := range quotas.PeriodQuotas {
		sc, ok := use[name]
		if !ok || sc.Limit < 0 {
			continue
		}
		if sf := quotas.QuotaRoom(name, int64(sc.Limit), int64(sc.Used), next); sf != nil {
			return sf
		}
	}
	return nil
}

// quotaUse reads the tenant's quotas (a peek: nothing is taken), by limit_type. A
// quota store that cannot be read refuses: a step is never judged without it.
func (s *Service) quotaUse(ctx context.Context, tenant tenants.Tenant, pol tenants.Policy) (map[string]quotas.Scope, error) {
	d, err := s.d.Admission.Admit(ctx, quotas.AdmitParams{
		Mode: quotas.ModePeek, TenantID: tenant.ID, Limits: pol.Limits, Period: tenant.Anchor().PeriodAt(time.Now()),
	})
	if err == nil && d.Degraded {
		err = quotas.ErrUnavailable
	}
	if err != nil {
		return nil, &AdmissionError{Err: err}
	}
	use := make(map[string]quotas.Scope, len(d.Scopes))
	for _, sc := range d.Scopes {
		use[sc.Name] = sc
	}
	return use, nil
}
