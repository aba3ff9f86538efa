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

	"github.com/agentq/agentq/internal/rkeys"
)

// PoolCounterConfig configures the pool-counter pass. Zero fields take the defaults.
type PoolCounterConfig struct {
	Interval time.Duration // between runs (5 min)
	Budget   time.Duration // a run's time bound (5 s)
}

func (c PoolCounterConfig) withDefaults() PoolCounterConfig {
	c.Interval = orDefault(c.Interval, defaultInterval)
	c.Budget = orDefault(c.Budget, defaultBudget)
	return c
}

// PoolCounterResult is what one run of the pool-counter pass corrected.
type PoolCounterResult struct {
	Corrected int64 // what the counter was off by (negative: it counted slots no task held)
	Stats     PassStats
}

// PoolCounterTestSignals are signalled after each run (initialised only in tests).
type PoolCounterTestSignals struct {
	Ran testsignal.TestSignal[PoolCounterResult]
}

// Init makes the signals waitable.
func (ts *PoolCounterTestSignals) Init(tb testutil.TestingTB) { ts.Ran.Init(tb) }

// PoolCounter recounts the worker pool's in-flight counter, which the dispatcher
// checks against the pool's capacity, from the dispatch slots the shards hold.
type PoolCounter struct {
	startstop.BaseStartStop

	TestSignals PoolCounterTestSignals

	sched  Scheduler
	keys   rkeys.Keys
	leader Leadership
	log    *slog.Logger
	drift  metric.Int64Counter
	cfg    PoolCounterConfig

	runMu *sync.Mutex // serialises runs; shared by a Janitor's passes
}

// NewPoolCounter returns a stopped pass that runs while leader leads.
func NewPoolCounter(d Deps, leader Leadership, c PoolCounterConfig) *PoolCounter {
	return &PoolCounter{sched: d.Scheduler, keys: d.Keys, leader: leader, log: d.logger().With("component", "janitor"), drift: d.drift(), cfg: c.withDefaults(), runMu: new(sync.Mutex)}
}

// Start runs the pass every Interval while this process leads, until Stop.
func (p *PoolCounter) Start(ctx context.Context) error {
	return startLeaderOnly(ctx, &p.BaseStartStop, p.leader, p.log, "janitor pass failed", passPool, func(ctx context.Context) (time.Duration, error) {
		_, err := p.runOnce(ctx)
		return p.cfg.Interval, err
	})
}

func (p *PoolCounter) runOnce(ctx context.Context) (PoolCounterResult, error) {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	var res PoolCounterResult
	var err error
	res.Stats, err = withinBudget(ctx, passPool, p.cfg.Budget, func(ctx context.Context, st *PassStats) error {
		var err error
		res.Corrected, err = p.sched.ReconcilePool(ctx)
		st.Rows, st.Done = p.keys.Shards(), err == nil
		return err
	})
	recordDrift(ctx, p.drift, p.log, passPool, "pool", res.Corrected)
	p.TestSignals.Ran.Signal(res)
	return res, err
}
