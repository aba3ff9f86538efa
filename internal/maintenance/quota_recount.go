package maintenance

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"
	"go.opentelemetry.io/otel/metric"

	"github.com/agentq/agentq/internal/store"
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
	// Busy counts the tenants it could not review: their ledger could not be held
	// still (steps being recorded for them past usage.HoldWait). They are left for
	// the next run, and counted on agentq.quotas.recount_skipped.
	Busy int
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
// the tenant's running tasks may hold reserved are lowered to that (quotas/admission/recount.go
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
	cfg    QuotaRecountConfig

	runMu   *sync.Mutex // serialises runs; shared by a Janitor's passes
	drift   driftRecorder
	skipped metric.Int64Counter
	cursor  string // the last tenant the previous run reviewed
}

// NewQuotaRecount returns a stopped pass that runs while leader leads.
func NewQuotaRecount(d Deps, leader Leadership, c QuotaRecountConfig) *QuotaRecount {
	return &QuotaRecount{
		store: d.Store, quotas: d.Quotas, usage: d.Usage, leader: leader,
		log: d.logger().With("component", "janitor"), cfg: c.withDefaults(), runMu: new(sync.Mutex), drift: newDriftRecorder(d),
		skipped: newRecountSkipped(d),
	}
}

// newRecountSkipped makes agentq.quotas.recount_skipped on d's meter provider,
// exported at 0 from the start.
func newRecountSkipped(d Deps) metric.Int64Counter {
	c, _ := d.Archetype.Meter("github.com/agentq/agentq/internal/maintenance").Int64Counter("agentq.quotas.recount_skipped",
		metric.WithUnit("{tenant}"),
		metric.WithDescription("Tenants the quota recount could not review in a run (their ledger could not be held still): left uncorrected until a later run"))
	c.Add(context.Background(), 0)
	return c
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
	p.drift.record(ctx, passRecount, "quota_tenants", res.Corrected, "quota_steps", res.Steps,
		"quota_tokens", res.Tokens, "quota_cost_micro_usd", res.CostMicro)
	if res.Busy > 0 {
		p.skipped.Add(context.WithoutCancel(ctx), int64(res.Busy))
		p.log.Warn("quota recount left tenants uncorrected: their steps' records held it off", "tenants", res.Busy)
	}
	p.TestSignals.Ran.Signal(res)
	return res, err
}

// review recounts one page of tenants: it finds those whose counters are seeded, then,
// while their ledger holds still (their steps' records wait), takes a snapshot of
// their counters, reads the ledger and corrects the counters by the drift the snapshot
// shows, keeping what moved since on top. Reservations and settlements go on meanwhile
// and commute with the correction (quotas.Correction.Held), so a tenant with steps
// always in flight is corrected too, and a step reserved or settled during the
// recount, or a task that starts during it, is never mistaken for drift.
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
	var out []quotas.RecountResult
	err = p.usage.RecountHeld(ctx, seeded, time.Now(), func(basis func() (map[string]quotas.LedgerCounts, error)) error {
		// The snapshot the correction measures drift on is taken with the ledger held,
		// before the basis is read (usage.Ledger.RecountHeld says why).
		held, err := p.quotas.SnapshotCounters(ctx, seeded)
		if err != nil {
			return err
		}
		ledger, err := basis()
		if err != nil {
			return err
		}
		var cs []quotas.Correction
		for _, s := range held {
			if l, ok := ledger[s.TenantID]; ok && s.Seeded {
				cs = append(cs, quotas.Correction{Snapshot: s, Ledger: l, Held: true})
			}
		}
		out, err = p.quotas.CorrectCounters(ctx, cs)
		return err
	})
	if errors.Is(err, store.ErrBusy) {
		res.Busy += len(seeded)
		return nil
	}
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
