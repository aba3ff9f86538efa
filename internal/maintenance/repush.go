package maintenance

import (
	"context"
	"go.opentelemetry.io/otel/metric"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/riverqueue/river/rivershared/startstop"
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"
)

// RepushConfig configures the re-push pass. Zero fields take the defaults.
type RepushConfig struct {
	Interval time.Duration // between runs (5 min)
	Budget   time.Duration // a run's time bound (5 s)
	Batch    int           // queued tasks checked per run (10,000)
}

func (c RepushConfig) withDefaults() RepushConfig {
	c.Interval = orDefault(c.Interval, defaultInterval)
	c.Budget = orDefault(c.Budget, defaultBudget)
	c.Batch = orDefault(c.Batch, 10000)
	return c
}

// RepushResult is what one run of the re-push pass corrected.
type RepushResult struct {
	Repushed int // queued tasks Redis was missing, pushed back
	Stats    PassStats
}

// RepushTestSignals are signalled after each run (initialised only in tests).
type RepushTestSignals struct {
	Ran testsignal.TestSignal[RepushResult]
}

// Init makes the signals waitable.
func (ts *RepushTestSignals) Init(tb testutil.TestingTB) { ts.Ran.Init(tb) }

// Repush is the recovery sweep's walk in bounded steps: it checks up to Batch queued
// tasks per run, in admission order from a cursor, and pushes the ones Redis is
// missing back onto their tenants' queues. Unlike the sweep it spares no young task:
// after a data loss every queued task is due.
type Repush struct {
	startstop.BaseStartStop

	TestSignals RepushTestSignals

	push   pusher
	leader Leadership
	log    *slog.Logger
	drift  metric.Int64Counter
	cfg    RepushConfig

	runMu  *sync.Mutex // serialises runs; shared by a Janitor's passes
	cursor uuid.UUID   // the last queued task the previous run checked
}

// NewRepush returns a stopped pass that runs while leader leads.
func NewRepush(d Deps, leader Leadership, c RepushConfig) *Repush {
	return &Repush{push: newPusher(d), leader: leader, log: d.logger().With("component", "janitor"), drift: d.drift(), cfg: c.withDefaults(), runMu: new(sync.Mutex)}
}

// Start runs the pass every Interval while this process leads, until Stop.
func (p *Repush) Start(ctx context.Context) error {
	return startLeaderOnly(ctx, &p.BaseStartStop, p.leader, p.log, "janitor pass failed", passRepush, func(ctx context.Context) (time.Duration, error) {
		_, err := p.runOnce(ctx)
		return p.cfg.Interval, err
	})
}

// resetCursor makes the next run start from the oldest queued task.
func (p *Repush) resetCursor() {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	p.cursor = uuid.Nil
}

func (p *Repush) runOnce(ctx context.Context) (RepushResult, error) {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	var res RepushResult
	var err error
	res.Stats, err = withinBudget(ctx, passRepush, p.cfg.Budget, func(ctx context.Context, st *PassStats) error {
		pushed, seen, next, err := p.push.sweepFrom(ctx, 0, p.cursor, p.cfg.Batch)
		res.Repushed += pushed
		st.Rows, p.cursor = seen, next
		st.Done = next == uuid.Nil && err == nil
		if next != uuid.Nil {
			st.Cursor = next.String()
		}
		return err
	})
	recordDrift(ctx, p.drift, p.log, passRepush, "repushed", res.Repushed)
	p.TestSignals.Ran.Signal(res)
	return res, err
}
