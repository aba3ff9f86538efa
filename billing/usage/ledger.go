package usage

import (
	"context"
	"time"

	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// StepsWindow is how far back a rebuild reads the ledger's steps: the sliding day, and
// an hour more, since the day is counted by whole hours on Redis's clock.
const StepsWindow = 25 * time.Hour

// Ledger reads tenants' use from the usage ledger: what their quota counters are
// rebuilt from (it is the quotas.UsageSource the wiring gives the limits) and recounted
// against (the janitor's quota recount).
type Ledger struct {
	st *store.Store
}

// NewLedger returns a Ledger reading st.
func NewLedger(st *store.Store) *Ledger { return &Ledger{st: st} }

var _ quotas.UsageSource = (*Ledger)(nil)

// PeriodUsage returns the tenant's steps per hour over the day before now and its
// tokens and micro-dollars recorded in period: one query.
func (l *Ledger) PeriodUsage(ctx context.Context, tenantID string, period quotas.Period, now time.Time) (quotas.Usage, error) {
	u, err := l.st.LedgerUsage(ctx, store.LedgerUsageParams{
		TenantID: tenantID, StepsSince: now.Add(-StepsWindow), PeriodStart: period.Start, PeriodEnd: period.End,
	})
	if err != nil {
		return quotas.Usage{}, err
	}
	return quotas.Usage{StepsByHour: u.StepsByHour, Tokens: u.Tokens, CostMicro: u.CostMicro}, nil
}

// HoldWait bounds how long RecountHeld waits for the steps being recorded for a page
// of tenants before it holds their ledger.
const HoldWait = 2 * time.Second

// ErrBusy: RecountHeld could not hold a page's ledger within HoldWait.
var ErrBusy = store.ErrBusy

// RecountHeld runs correct in a transaction that holds the page's ledger still: the
// tenants' rollups are held exclusively, so no step of theirs is recorded until it
// ends. correct reads RecountBasis through basis when it is ready to, and corrects the
// counters before it returns. Reservations and settlements go on meanwhile (they are
// Redis's), so correct takes a snapshot of the counters after the hold and before
// basis, and keeps what moved since the snapshot on top of its correction: no record
// can land in the basis after the snapshot, and a task that starts after the basis
// read reserves into what moved. The steps recorded for the tenants wait for it (a
// few milliseconds: two Redis round trips). ErrBusy when the page could not be held
// within HoldWait.
func (l *Ledger) RecountHeld(ctx context.Context, tenants []string, now time.Time,
	correct func(basis func() (map[string]quotas.LedgerCounts, error)) error) error {
	return l.st.InTx(ctx, func(tx *store.Store) error {
		if err := tx.UnscopedHoldRollups(ctx, tenants, HoldWait); err != nil {
			return err
		}
		return correct(func() (map[string]quotas.LedgerCounts, error) {
			return (&Ledger{st: tx}).RecountBasis(ctx, tenants, now)
		})
	})
}

// RecountBasis returns, for a page of tenants, what the ledger says their counters
// should hold in their current billing period, and what their running tasks may hold
// reserved besides: two queries for the page. Tenants that do not exist are absent.
func (l *Ledger) RecountBasis(ctx context.Context, tenants []string, now time.Time) (map[string]quotas.LedgerCounts, error) {
	running, err := l.st.UnscopedRunningStepsOf(ctx, tenants)
	if err != nil {
		return nil, err
	}
	windows := make([]store.UsageWindow, 0, len(running))
	periods := make(map[string]quotas.Period, len(running))
	for _, t := range tenants {
		r, ok := running[t]
		if !ok {
			continue
		}
		p := r.Anchor.PeriodAt(now)
		periods[t] = p
		windows = append(windows, store.UsageWindow{TenantID: t, PeriodStart: p.Start, PeriodEnd: p.End})
	}
	if len(windows) == 0 {
		return map[string]quotas.LedgerCounts{}, nil
	}
	used, err := l.st.UnscopedLedgerUsageOf(ctx, windows, now.Add(-StepsWindow))
	if err != nil {
		return nil, err
	}
	out := make(map[string]quotas.LedgerCounts, len(windows))
	for _, w := range windows {
		u, r := used[w.TenantID], running[w.TenantID]
		out[w.TenantID] = quotas.LedgerCounts{
			Period:   periods[w.TenantID],
			Usage:    quotas.Usage{StepsByHour: u.StepsByHour, Tokens: u.Tokens, CostMicro: u.CostMicro},
			InFlight: quotas.InFlight{Steps: r.Running, Tokens: r.Tokens, CostMicro: r.CostMicro},
		}
	}
	return out, nil
}
