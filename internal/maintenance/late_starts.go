package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"
)

// LateStartWatcher writes the breaches of tasks still waiting for their first start
// past their plan's commitment (outbox.Commitments.Waiting).
type LateStartWatcher interface {
	// WatchLateStarts does one pass: how many waiting tasks it looked at and how many
	// events it wrote.
	WatchLateStarts(ctx context.Context) (checked, written int, err error)
}

// LateStartsConfig configures the late-start pass. Zero fields take the defaults.
type LateStartsConfig struct {
	// Interval between runs (10 s): how late past its commitment a task still waiting
	// is reported at the latest (its start, or its expiry at its own start deadline,
	// reports it too, whichever comes first).
	Interval time.Duration
	Budget   time.Duration // a run's time bound (5 s)
}

func (c LateStartsConfig) withDefaults() LateStartsConfig {
	c.Interval = orDefault(c.Interval, 10*time.Second)
	c.Budget = orDefault(c.Budget, defaultBudget)
	return c
}

// LateStartsResult is what one run found.
type LateStartsResult struct {
	Checked, Written int
	Stats            PassStats
}

// LateStartsTestSignals are signalled after each run (initialised only in tests).
type LateStartsTestSignals struct {
	Ran testsignal.TestSignal[LateStartsResult]
}

// Init makes the signals waitable.
func (ts *LateStartsTestSignals) Init(tb testutil.TestingTB) { ts.Ran.Init(tb) }

// LateStarts runs the late-start pass on the leader. It repairs nothing, so like the
// refusal flush it takes no turn with the drift passes. Without a watcher
// (Deps.LateStarts nil) it does nothing.
type LateStarts struct {
	startstop.BaseStartStop

	TestSignals LateStartsTestSignals

	watcher LateStartWatcher
	leader  Leadership
	log     *slog.Logger
	cfg     LateStartsConfig
}

// NewLateStarts returns a stopped pass that runs while leader leads.
func NewLateStarts(d Deps, leader Leadership, c LateStartsConfig) *LateStarts {
	return &LateStarts{watcher: d.LateStarts, leader: leader, log: d.logger().With("component", "janitor"), cfg: c.withDefaults()}
}

// Start runs the pass every Interval while this process leads, until Stop.
func (p *LateStarts) Start(ctx context.Context) error {
	return startLeaderOnly(ctx, &p.BaseStartStop, p.leader, p.log, "janitor pass failed", passLateStarts, func(ctx context.Context) (time.Duration, error) {
		_, err := p.runOnce(ctx)
		return p.cfg.Interval, err
	})
}

func (p *LateStarts) runOnce(ctx context.Context) (LateStartsResult, error) {
	var res LateStartsResult
	var err error
	res.Stats, err = withinBudget(ctx, passLateStarts, p.cfg.Budget, func(ctx context.Context, st *PassStats) error {
		if p.watcher == nil {
			st.Done = true
			return nil
		}
		var err error
		res.Checked, res.Written, err = p.watcher.WatchLateStarts(ctx)
		st.Rows, st.Done = res.Checked, err == nil
		return err
	})
	p.TestSignals.Ran.Signal(res)
	return res, err
}
