package tasks

import (
	"context"
	"errors"
	"time"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
)

// PauseSweep is what one SweepPauses did.
type PauseSweep struct {
	Resumed int // quota pauses whose quota allows again
	Expired int // pauses past their plan's pause_timeout_s, ended budget_exceeded
}

// pausePage bounds the pauses one expiry statement ends.
const pausePage = 500

// PauseMarks is what a sweeper saw of each tenant with quota pauses when it last
// looked at them: what could lift a period quota since (an admin's change of the
// tenant, its plan or overrides; the hour, which moves the daily steps' window; the
// billing period). A tenant whose mark is unchanged is not looked at again. The
// zero value is not usable: NewPauseMarks. One sweeper owns it.
type PauseMarks struct {
	seen map[string]pauseMark
}

// pauseMark is a tenant's state as far as a period quota's room goes.
type pauseMark struct {
	updated time.Time
	hour    int64
	period  time.Time
}

// NewPauseMarks returns marks that have seen nothing: the next sweep looks at every
// tenant's quota pauses once.
func NewPauseMarks() *PauseMarks { return &PauseMarks{seen: map[string]pauseMark{}} }

// SweepPauses ends every pause past its plan's pause_timeout_s budget_exceeded (one
// indexed statement per page of them, the expiry dated at the pause), and resumes
// tasks paused by a period quota (daily steps, monthly tokens or USD) once that quota
// allows again: when its limit was raised or its use fell since the pause, and there
// is room under it. A tenant's quota pauses are looked at only when its mark in marks
// changed: an admin changed the tenant (a raise), the hour turned (the daily window
// moved), a billing period began. A task paused by its own budget waits for a
// person: POST /v1/tasks/{id}/resume or its approval link. A resume refused for now
// (sessions full, the pause still being handed off) leaves its tenant unmarked, so
// the next sweep tries again.
//
// Every change is a conditional write (paused → queued, paused → budget_exceeded), so
// sweeps that overlap change each task once.
func (s *Service) SweepPauses(ctx context.Context, marks *PauseMarks) (PauseSweep, error) {
	var out PauseSweep
	for {
		ended, err := s.d.Lifecycle.ExpirePauses(ctx, pausePage)
		if err != nil {
			return out, err
		}
		out.Expired += len(ended) // their ends' effects followed them (Ends)
		if len(ended) < pausePage {
			break
		}
	}
	ids, err := s.d.Store.UnscopedQuotaPausedTenants(ctx)
	if err != nil {
		return out, err
	}
	listed := make(map[string]bool, len(ids))
	for _, id := range ids {
		listed[id] = true
		if err := s.sweepTenantPauses(ctx, &out, marks, id); err != nil && ctx.Err() != nil {
			return out, err
		}
	}
	for id := range marks.seen {
		if !listed[id] {
			delete(marks.seen, id) // none of its tasks waits on a quota now
		}
	}
	return out, nil
}

// sweepTenantPauses resumes the tenant's quota pauses that its quotas allow again,
// unless nothing changed since its mark.
func (s *Service) sweepTenantPauses(ctx context.Context, out *PauseSweep, marks *PauseMarks, tenantID string) error {
	pt := &pausedTenant{}
	if pt.tenant, pt.err = s.d.Tenant(ctx, tenantID); pt.err == nil {
		pt.pol, pt.err = s.d.Tenants.Policy(pt.tenant)
	}
	if pt.err != nil {
		return pt.err
	}
	now := time.Now()
	mark := pauseMark{updated: pt.tenant.UpdatedAt, hour: now.Unix() / 3600, period: pt.tenant.Anchor().PeriodAt(now).Start}
	if seen, ok := marks.seen[tenantID]; ok && seen == mark {
		return nil
	}
	paused, err := s.d.Store.UnscopedListQuotaPaused(ctx, tenantID)
	if err != nil {
		return err
	}
	again := false
	for _, t := range paused {
		retry, err := s.sweepPause(ctx, out, pt, t)
		if err != nil {
			return err
		}
		again = again || retry
	}
	if !again {
		marks.seen[tenantID] = mark
	}
	return nil
}

// pausedTenant is what a sweep reads once per tenant: its policy and, when one of its
// tasks waits for a quota, the quotas' use (a peek: nothing is taken).
type pausedTenant struct {
	tenant tenants.Tenant
	pol    tenants.Policy
	err    error
	use    map[string]quotas.Scope // by limit_type; nil until read
}

// sweepPause resumes one quota pause its quota allows again, or leaves it; retry says
// the next sweep should look again (the quotas could not be read, or the resume was
// refused for now).
func (s *Service) sweepPause(ctx context.Context, out *PauseSweep, pt *pausedTenant, t store.PausedTask) (retry bool, err error) {
	allows, known := s.quotaAllows(ctx, pt, t)
	if !allows {
		return !known, nil
	}
	_, err = s.Resume(ctx, ResumeParams{TenantID: t.TenantID, ID: t.ID, Pause: t.Pauses})
	var refused *ResumeRefusedError
	var notPaused *NotPausedError
	var handOff *HandOffError
	var room *NeedsRoomError
	var suspended *agentqtype.SuspendedError
	switch {
	case err == nil:
		out.Resumed++
		return false, nil
	case errors.As(err, &notPaused):
		return false, nil // resumed or ended meanwhile
	case errors.As(err, &room), errors.As(err, &suspended):
		return false, nil // no room for its next step, or the tenant suspended: a change of the tenant or its window looks again
	case errors.As(err, &refused), errors.As(err, &handOff):
		return true, nil // sessions full, or the pause still being handed off
	}
	return true, err
}

// quotaAllows reports whether the quota that paused t allows a step again: it is off
// now, or it was raised or its use fell since the pause, and there is room under it
// for the step the pause held back (quotas.QuotaRoom).
// Requiring a change since the pause keeps a task whose next step still would not
// fit from pausing and resuming over and over. known is false when the quotas could
// not be read.
func (s *Service) quotaAllows(ctx context.Context, pt *pausedTenant, t store.PausedTask) (allows, known bool) {
	if pt.use == nil {
		d, err := s.d.Admission.Admit(ctx, quotas.AdmitParams{
			Mode: quotas.ModePeek, TenantID: pt.tenant.ID, Limits: pt.pol.Limits, Period: pt.tenant.Anchor().PeriodAt(time.Now()),
		})
		if err != nil || d.Degraded {
			return false, false // the quotas cannot be read now: the next sweep asks again
		}
		pt.use = make(map[string]quotas.Scope, len(d.Scopes))
		for _, sc := range d.Scopes {
			pt.use[sc.Name] = sc
		}
	}
	sc, ok := pt.use[t.Reason]
	if !ok || sc.Limit < 0 {
		return true, true // the quota is off now
	}
	changed := int64(sc.Limit) > t.Limit || int64(sc.Used) < t.Used
	return changed && roomForPaused(sc, t), true
}

// roomForPaused reports whether the quota sc has room for the step that paused t, as
// its pause estimated it: a use that fell by less than the step costs is not room.
func roomForPaused(sc quotas.Scope, t store.PausedTask) bool {
	next := quotas.NextStep{Tokens: t.NextTokens, CostMicro: t.NextCostMicro}
	return quotas.QuotaRoom(sc.Name, int64(sc.Limit), int64(sc.Used), next) == nil
}
