package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"
)

// StartDeadlinesConfig configures the start-deadline pass. Zero fields take the
// defaults.
type StartDeadlinesConfig struct {
	// Interval between runs (1 s): how late past its deadline a queued task may
	// expire.
	Interval time.Duration
	// Budget is a run's time bound (5 s).
	Budget time.Duration
	// Limit bounds the tasks one run expires (500); a run that reached it runs
	// again at once.
	Limit int
}

func (c StartDeadlinesConfig) withDefaults() StartDeadlinesConfig {
	c.Interval = orDefault(c.Interval, time.Second)
	c.Budget = orDefault(c.Budget, defaultBudget)
	c.Limit = orDefault(c.Limit, 500)
	return c
}

// StartDeadlinesResult is what one run expired.
type StartDeadlinesResult struct {
	Expired int
	Stats   PassStats
}

// StartDeadlinesTestSignals are signalled after each run (initialised only in tests).
type StartDeadlinesTestSignals struct {
	Ran testsignal.TestSignal[StartDeadlinesResult]
}

// Init makes the signals waitable.
func (ts *StartDeadlinesTestSignals) Init(tb testutil.TestingTB) { ts.Ran.Init(tb) }

// StartDeadlines ends as expired the queued tasks no worker started by their start
// deadline. A worker's start refuses such a task too (tasks.Lifecycle.Start), but
// while every worker slot is taken no worker asks for hours, and a deadline is a promise about
// when the task stops waiting: this pass keeps it within about a second whatever the
// workers do.
//
// It runs on the janitor's leader, every second, because the janitor runs in every
// deployment (one replica leads it) and a pass there runs once per deployment, not
// once per scheduler replica; the dispatcher's loop was the other candidate, but it
// runs in every scheduler process and sleeps while no task is dispatched. It is no
// drift repair, so it takes no turn with the drift passes. A run is one indexed query
// on the partial index of queued tasks with a deadline, which finds nothing in the
// common case. Each end is one conditional update, so a worker's start or a cancel
// racing it ends the task at most once, and the end's effects (the session lease
// released, the task off its queue, its state message) follow the one that won
// (tasks.Ends, a subscriber of the lifecycle).
type StartDeadlines struct {
	startstop.BaseStartStop

	TestSignals StartDeadlinesTestSignals

	lifecycle Lifecycle
	leader    Leadership
	log       *slog.Logger
	cfg       StartDeadlinesConfig
}

// NewStartDeadlines returns a stopped pass that runs while leader leads.
func NewStartDeadlines(d Deps, leader Leadership, c StartDeadlinesConfig) *StartDeadlines {
	return &StartDeadlines{lifecycle: d.lifecycle(), leader: leader, log: d.logger().With("component", "janitor"), cfg: c.withDefaults()}
}

// Start runs the pass every Interval while this process leads, until Stop.
func (p *StartDeadlines) Start(ctx context.Context) error {
	return startLeaderOnly(ctx, &p.BaseStartStop, p.leader, p.log, "janitor pass failed", passStartDeadlines, func(ctx context.Context) (time.Duration, error) {
		res, err := p.runOnce(ctx)
		if err == nil && res.Expired >= p.cfg.Limit {
			return 0, nil // more are due: go on at once
		}
		return p.cfg.Interval, err
	})
}

func (p *StartDeadlines) runOnce(ctx context.Context) (StartDeadlinesResult, error) {
	var res StartDeadlinesResult
	var err error
	res.Stats, err = withinBudget(ctx, passStartDeadlines, p.cfg.Budget, func(ctx context.Context, st *PassStats) error {
		// Each end's effects (lease, queue entry, state message) follow its commit,
		// whatever is left of the budget (tasks.Ends).
		ts, err := p.lifecycle.ExpireOverdue(ctx, p.cfg.Limit)
		if err != nil {
			return err
		}
		res.Expired = len(ts)
		st.Rows, st.Done = len(ts), len(ts) < p.cfg.Limit
		return nil
	})
	p.TestSignals.Ran.Signal(res)
	return res, err
}
