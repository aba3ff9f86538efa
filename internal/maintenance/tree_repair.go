package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"
)

// TreeRepairConfig configures the tree repair pass. Zero fields take the defaults.
type TreeRepairConfig struct {
	// Interval between runs (10 s): how long a task may outlive its parent when the
	// process that ended the parent died before cancelling it.
	Interval time.Duration
	// Budget is a run's time bound (5 s).
	Budget time.Duration
	// Limit bounds the tasks one run cancels (500); a run that reached it runs again
	// at once.
	Limit int
}

func (c TreeRepairConfig) withDefaults() TreeRepairConfig {
	c.Interval = orDefault(c.Interval, 10*time.Second)
	c.Budget = orDefault(c.Budget, defaultBudget)
	c.Limit = orDefault(c.Limit, 500)
	return c
}

// TreeRepairResult is what one run cancelled.
type TreeRepairResult struct {
	Cancelled int
	Stats     PassStats
}

// TreeRepairTestSignals are signalled after each run (initialised only in tests).
type TreeRepairTestSignals struct {
	Ran testsignal.TestSignal[TreeRepairResult]
}

// Init makes the signals waitable.
func (ts *TreeRepairTestSignals) Init(tb testutil.TestingTB) { ts.Ran.Init(tb) }

// TreeRepair cancels the live tasks whose parent has ended (killed, parent_ended):
// nothing in a tree outlives its parent. A parent's end cancels its live children
// once it committed (tasks.Trees, a subscriber of the lifecycle); a process that died
// in between left them running, and this pass ends them. It takes no turn with the
// drift passes: it ends tasks by conditional updates, as a cancel does, and a
// cancel's effects follow each (tasks.Ends). A run is one query over the tasks
// spawned by others, which finds nothing in the common case.
type TreeRepair struct {
	startstop.BaseStartStop

	TestSignals TreeRepairTestSignals

	trees  Trees
	leader Leadership
	log    *slog.Logger
	cfg    TreeRepairConfig
}

// NewTreeRepair returns a stopped pass that runs while leader leads.
func NewTreeRepair(d Deps, leader Leadership, c TreeRepairConfig) *TreeRepair {
	return &TreeRepair{trees: d.trees(), leader: leader, log: d.logger().With("component", "janitor"), cfg: c.withDefaults()}
}

// Start runs the pass every Interval while this process leads, until Stop.
func (p *TreeRepair) Start(ctx context.Context) error {
	return startLeaderOnly(ctx, &p.BaseStartStop, p.leader, p.log, "janitor pass failed", passTrees, func(ctx context.Context) (time.Duration, error) {
		res, err := p.runOnce(ctx)
		if err == nil && res.Cancelled >= p.cfg.Limit {
			return 0, nil // more are due: go on at once
		}
		return p.cfg.Interval, err
	})
}

func (p *TreeRepair) runOnce(ctx context.Context) (TreeRepairResult, error) {
	var res TreeRepairResult
	var err error
	res.Stats, err = withinBudget(ctx, passTrees, p.cfg.Budget, func(ctx context.Context, st *PassStats) error {
		// Each end's effects (lease, queue entry, state message, the task's own
		// children) follow its commit, whatever is left of the budget.
		ts, err := p.trees.CancelOrphans(ctx, p.cfg.Limit)
		res.Cancelled = len(ts)
		if err != nil {
			return err
		}
		st.Rows, st.Done = len(ts), len(ts) < p.cfg.Limit
		return nil
	})
	p.TestSignals.Ran.Signal(res)
	return res, err
}
