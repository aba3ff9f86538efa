package tasks

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
)

// PauseSweep is what one SweepPauses did.
type PauseSweep struct {
	Resumed int // quota pauses whose quota allows again
	Expired int // pauses past their plan's pause_timeout_s, ended budget_exceeded
}

// pausePage bounds the paused tasks one read lists.
const pausePage = 500

// SweepPauses looks at every paused task once: one paused longer than its plan's
// pause_timeout_s ends budget_exceeded; one paused by a period quota (daily steps,
// monthly tokens or USD) resumes by itself when that quota allows again, that is when
// its limit was raised or its use fell (the daily window moved, a new billing period
// began) since the pause, and there is room under it. A task paused by its own
// budget waits for a person: POST /v1/tasks/{id}/resume or its approval link. A
// resume its tenant's sessions refuse waits for the next sweep.
//
// Every change is a conditional write (paused → queued, paused → budget_exceeded), so
// processes sweeping at once change each task once.
func (s *Service) SweepPauses(ctx context.Context) (PauseSweep, error) {
	var out PauseSweep
	after := uuid.Nil
	tenants := map[string]*pausedTenant{}
	for {
		rows, err := s.d.Store.UnscopedListPaused(ctx, after, pausePage)
		if err != nil {
			return out, err
		}
		for _, t := range rows {
			if err := s.sweepPause(ctx, &out, s.pausedTenant(ctx, tenants, t.TenantID), t); err != nil && ctx.Err() != nil {
				return out, err
			}
		}
		if len(rows) < pausePage {
			return out, nil
		}
		after = rows[len(rows)-1].ID
	}
}

// pausedTenant is what a sweep reads once per tenant: its policy and, when one of its
// tasks waits for a quota, the quotas' use (a peek: nothing is taken).
type pausedTenant struct {
	tenant tenants.Tenant
	pol    tenants.Policy
	err    error
	use    map[string]quotas.Scope // by limit_type; nil until read
}

func (s *Service) pausedTenant(ctx context.Context, m map[string]*pausedTenant, id string) *pausedTenant {
	if pt, ok := m[id]; ok {
		return pt
	}
	pt := &pausedTenant{}
	pt.tenant, pt.err = s.d.Tenant(ctx, id)
	if pt.err == nil {
		pt.pol, pt.err = s.d.Tenants.Policy(pt.tenant)
	}
	m[id] = pt
	return pt
}

// sweepPause ends or resumes one paused task, or leaves it.
func (s *Service) sweepPause(ctx context.Context, out *PauseSweep, pt *pausedTenant, t store.PausedTask) error {
	if pt.err != nil {
		return pt.err
	}
	stop := quotas.Stop{LimitType: t.Reason, Limit: t.Limit, Used: t.Used}
	if time.Since(t.PausedAt) >= pt.pol.PauseTimeout {
		_, ok, err := s.d.Lifecycle.ExpirePause(ctx, t.TenantID, t.ID, &stop)
		if ok {
			out.Expired++
			s.publishState(ctx, t.ID, store.StateBudgetExceeded, "budget exceeded: paused longer than the plan's pause timeout")
		}
		return err
	}
	if !quotaPause(t.Reason) || !s.quotaAllows(ctx, pt, t) {
		return nil
	}
	_, err := s.Resume(ctx, ResumeParams{TenantID: t.TenantID, ID: t.ID, Pause: t.Pauses})
	var refused *ResumeRefusedError
	var notPaused *NotPausedError
	var handOff *HandOffError
	switch {
	case err == nil:
		out.Resumed++
		return nil
	case errors.As(err, &refused), errors.As(err, &notPaused), errors.As(err, &handOff):
		return nil // sessions full or the pause still being handed off: the next sweep tries again; or resumed or ended meanwhile
	}
	return err
}

// quotaPause reports whether limitType is a period quota of the tenant's, which a
// paused task waits on by itself.
func quotaPause(limitType string) bool {
	switch limitType {
	case quotas.AgentStepsDaily, quotas.AITokensMonthly, quotas.USDMonthly:
		return true
	}
	return false
}

// quotaAllows reports whether the quota that paused t allows a step again: it is off
// now, or it was raised or its use fell since the pause, and its use is below it.
// Requiring a change since the pause keeps a task whose next step still would not
// fit from pausing and resuming over and over.
func (s *Service) quotaAllows(ctx context.Context, pt *pausedTenant, t store.PausedTask) bool {
	if pt.use == nil {
		d, err := s.d.Admission.Admit(ctx, quotas.AdmitParams{
			Mode: quotas.ModePeek, TenantID: pt.tenant.ID, Limits: pt.pol.Limits, Period: pt.tenant.Anchor().PeriodAt(time.Now()),
		})
		if err != nil || d.Degraded {
			return false // the quotas cannot be read now: the next sweep asks again
		}
		pt.use = make(map[string]quotas.Scope, len(d.Scopes))
		for _, sc := range d.Scopes {
			pt.use[sc.Name] = sc
		}
	}
	sc, ok := pt.use[t.Reason]
	if !ok || sc.Limit < 0 {
		return true // the quota is off now
	}
	changed := int64(sc.Limit) > t.Limit || int64(sc.Used) < t.Used
	return changed && sc.Used < sc.Limit
}
