package maintenance

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"

	"github.com/agentq/agentq/internal/rkeys"
)

// SlotCounterConfig configures the slot-counter pass. Zero fields take the defaults.
type SlotCounterConfig struct {
	Interval time.Duration // between runs (5 min)
	Budget   time.Duration // a run's time bound (5 s)
}

func (c SlotCounterConfig) withDefaults() SlotCounterConfig {
	c.Interval = orDefault(c.Interval, defaultInterval)
	c.Budget = orDefault(c.Budget, defaultBudget)
	return c
}

// SlotCounterResult is what one run of the slot-counter pass corrected.
type SlotCounterResult struct {
	Corrected int64 // what the counter was off by (negative: it counted slots no task held)
	Stats     PassStats
}

// SlotCounterTestSignals are signalled after each run (initialised only in tests).
type SlotCounterTestSignals struct {
	Ran testsignal.TestSignal[SlotCounterResult]
}

// Init makes the signals waitable.
func (ts *SlotCounterTestSignals) Init(tb testutil.TestingTB) { ts.Ran.Init(tb) }

// SlotCounter recounts the worker slots' in-flight counter, which the dispatcher
// checks against the live workers' slots, from the dispatch slots the shards hold.
type SlotCounter struct {
	startstop.BaseStartStop

	TestSignals SlotCounterTestSignals

	sched  Scheduler
	keys   rkeys.Keys
	leader Leadership
	log    *slog.Logger
	cfg    SlotCounterConfig

	runMu *sync.Mutex // serialises runs; shared by a Janitor's passes
	drift driftRecorder
}

// NewSlotCounter returns a stopped pass that runs while leader leads.
func NewSlotCounter(d Deps, leader Leadership, c SlotCounterConfig) *SlotCounter {
	return &SlotCounter{sched: d.Scheduler, keys: d.Keys, leader: leader, log: d.logger().With("component", "janitor"), cfg: c.withDefaults(), runMu: new(sync.Mutex), drift: newDriftRecorder(d)}
}

// Start runs the pass every Interval while this process leads, until Stop.
func (p *SlotCounter) Start(ctx context.Context) error {
	return startLeaderOnly(ctx, &p.BaseStartStop, p.leader, p.log, "janitor pass failed", passSlots, func(ctx context.Context) (time.Duration, error) {
		_, err := p.runOnce(ctx)
		return p.cfg.Interval, err
	})
}

func (p *SlotCounter) runOnce(ctx context.Context) (SlotCounterResult, error) {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	var res SlotCounterResult
	var err error
	res.Stats, err = withinBudget(ctx, passSlots, p.cfg.Budget, func(ctx context.Context, st *PassStats) error {
		var err error
		res.Corrected, err = p.sched.ReconcileSlots(ctx)
		st.Rows, st.Done = p.keys.Shards(), err == nil
		return err
	})
	p.drift.record(ctx, passSlots, "pool", res.Corrected) // the report's names: "pool", pool_corrected
	p.TestSignals.Ran.Signal(res)
	return res, err
}
