package maintenance

import (
	"context"
	"go.opentelemetry.io/otel/metric"
	"log/slog"
	"sync"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"

	"github.com/agentq/agentq/quotas"
)

// QuotaRecountConfig configures the quota recount. Zero fields take the defaults.
type QuotaRecountConfig struct {
	Interval time.Duration // between runs (5 min)
	Budget   time.Duration // a run's time bound (5 s)
	Walk     TenantWalk
}

func (c QuotaRecountConfig) withDefaults() QuotaRecountConfig {
	c.Interval = orDefault(c.Interval, defaultInterval)
	c.Budget = orDefault(c.Budget, defaultBudget)
	c.Walk = c.Walk.withDefaults()
	return c
}

// QuotaRecountResult is what one run of the quota recount corrected.
type QuotaRecountResult struct {
	Corrected int // tenants whose counters it moved
	Busy      int // tenants whose counters moved while it read the ledger: left for the next run
	// How far it moved the counters, summed over tenants as absolute values: steps of
	// the sliding day, the period's tokens and micro-dollars.
	Steps, Tokens, CostMicro int64
	Stats                    PassStats
}

// QuotaRecountTestSignals are signalled after each run (initialised only in tests).
type QuotaRecountTestSignals struct {
	Ran testsignal.TestSignal[QuotaRecountResult]
}

// Init makes the signals waitable.
func (ts *QuotaRecountTestSignals) Init(tb testutil.TestingTB) { ts.Ran.Init(tb) }

// QuotaRecount compares tenants' period quota counters in Redis (the sliding day's
// steps, the period's tokens and micro-dollars) with the usage ledger and corrects the
// drift: counters below the ledger are raised to it, counters above it by more than
// the tenant's running tasks may hold reserved are lowered to that (quotas/recount.go
// says why that bound). Tenants whose counters Redis lost (unseeded) are skipped: the
// next admission rebuilds them, and creating them here would keep idle tenants' state
// alive. It walks the tenants from a cursor, within its budget. Without a ledger
// (Deps.Usage nil) it does nothing.
type QuotaRecount struct {
	startstop.BaseStartStop

	TestSignals QuotaRecountTestSignals

	store  Store
	quotas Quotas
	usage  UsageLedger
	leader Leadership
	log    *slog.Logger
	drift  metric.Int64Counter
	cfg    QuotaRecountConfig

	runMu  *sync.Mutex // serialises runs; shared by a Janitor's passes
	cursor string      // the last tenant the previous run reviewed
}

// NewQuotaRecount returns a stopped pass that runs while leader leads.
func NewQuotaRecount(d Deps, leader Leadership, c QuotaRecountConfig) *QuotaRecount {
	return &QuotaRecount{
		store: d.Store, quotas: d.Quotas, usage: d.Usage, leader: leader,
		log: d.logger().With("component", "janitor"), drift: d.drift(), cfg: c.withDefaults(), runMu: new(sync.Mutex),
	}
}

// Start runs the pass every Interval while this process leads, until Stop.
func (p *QuotaRecount) Start(ctx context.Context) error {
	return startLeaderOnly(ctx, &p.BaseStartStop, p.leader, p.log, "janitor pass failed", passRecount, func(ctx context.Context) (time.Duration, error) {
		_, err := p.runOnce(ctx)
		return p.cfg.Interval, err
	})
}

func (p *QuotaRecount) runOnce(ctx context.Context) (QuotaRecountResult, error) {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	var res QuotaRecountResult
	var err error
	res.Stats, err = withinBudget(ctx, passRecount, p.cfg.Budget, func(ctx context.Context, st *PassStats) error {
		if p.usage == nil {
			st.Done = true
			return nil
		}
		return walkTenantIDs(ctx, p.store, p.cfg.Walk, &p.cursor, st, func(ctx context.Context, tenants []string) error {
			return p.review(ctx, tenants, &res)
		})
	})
	recordDrift(ctx, p.drift, p.log, passRecount, "quota_tenants", res.Corrected, "quota_steps", res.Steps,
		"quota_tokens", res.Tokens, "quota_cost_micro_usd", res.CostMicro)
	p.TestSignals.Ran.Signal(res)
	return res, err
}

// review recounts one page of tenants: it reads their counters, then the ledger, then
// corrects the counters that did not move in between, so a step reserved or settled
// while the ledger was read is never mistaken for drift.
func (p *QuotaRecount) review(ctx context.Context, tenants []string, res *QuotaRecountResult) error {
	snaps, err := p.quotas.SnapshotCounters(ctx, tenants)
	if err != nil {
		return err
	}
	var seeded []string
	for _, s := range snaps {
		if s.Seeded {
			seeded = append(seeded, s.TenantID)
		}
	}
	if len(seeded) == 0 {
		return nil
	}
	basis, err := p.usage.RecountBasis(ctx, seeded, time.Now())
	if err != nil {
		return err
	}
	var cs []quotas.Correction
	for _, s := range snaps {
		if l, ok := basis[s.TenantID]; ok && s.Seeded {
			cs = append(cs, quotas.Correction{Snapshot: s, Ledger: l})
		}
	}
	out, err := p.quotas.CorrectCounters(ctx, cs)
	if err != nil {
		return err
	}
	for _, r := range out {
		switch r.Outcome {
		case quotas.RecountCorrected:
			res.Corrected++
			res.Steps += abs(r.Steps)
			res.Tokens += abs(r.Tokens)
			res.CostMicro += abs(r.CostMicro)
			p.log.Info("quota counters recounted from the usage ledger", "tenant_id", r.TenantID,
				"steps", r.Steps, "tokens", r.Tokens, "cost_micro_usd", r.CostMicro)
		case quotas.RecountBusy:
			res.Busy++
		}
	}
	return nil
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}
