package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"

	"github.com/agentq/agentq/internal/tasks"
)

// PauseSweeper is what the pause watcher runs (*tasks.Service): the rules of when a
// paused task resumes by itself or ends are the tasks domain's.
type PauseSweeper interface {
	SweepPauses(ctx context.Context, marks *tasks.PauseMarks) (tasks.PauseSweep, error)
}

var _ PauseSweeper = (*tasks.Service)(nil)

// PauseWatcher resumes paused tasks whose quota allows again and ends those paused
// past their plan's pause timeout (tasks.Service.SweepPauses). It is a leader-only
// janitor pass, like the start-deadline pass: one process sweeps, not every
// scheduler replica. Expiry is one indexed statement over the pauses due, and a
// tenant's quota pauses are looked at only when something that could lift them
// changed (the sweep's PauseMarks). Each change is a conditional write, so a sweep
// that overlaps a leadership change still changes each task once. It takes no turn
// with the drift passes: it moves only paused tasks, which they leave alone but for
// freeing what a paused task kept. Without a sweeper (Deps.Pauses nil) it does
// nothing.
type PauseWatcher struct {
	startstop.BaseStartStop

	TestSignals PauseWatcherTestSignals

	sweeper PauseSweeper
	leader  Leadership
	log     *slog.Logger
	cfg     PauseWatcherConfig
	marks   *tasks.PauseMarks // what the last sweeps saw of each tenant; leader-local
}

// PauseWatcherTestSignals are signalled after each sweep (initialised only in tests).
type PauseWatcherTestSignals struct {
	Swept testsignal.TestSignal[tasks.PauseSweep]
}

// Init makes the signals waitable.
func (ts *PauseWatcherTestSignals) Init(tb testutil.TestingTB) { ts.Swept.Init(tb) }

// PauseWatcherConfig configures the pause watcher.
type PauseWatcherConfig struct {
	// Interval is the time between sweeps (default 1 s); the first runs when this
	// process takes the lead.
	Interval time.Duration
}

func (c PauseWatcherConfig) withDefaults() PauseWatcherConfig {
	c.Interval = orDefault(c.Interval, time.Second)
	return c
}

// NewPauseWatcher builds the watcher over d.Pauses, to run while leader leads.
// Nothing runs until Start.
func NewPauseWatcher(d Deps, leader Leadership, c PauseWatcherConfig) *PauseWatcher {
	return &PauseWatcher{sweeper: d.Pauses, leader: leader, log: d.logger().With("component", "janitor"), cfg: c.withDefaults(),
		marks: tasks.NewPauseMarks()}
}

// Start sweeps every Interval while this process leads, until Stop. A new term
// starts with no marks: every tenant's quota pauses are looked at once.
func (w *PauseWatcher) Start(ctx context.Context) error {
	return startLeaderOnly(ctx, &w.BaseStartStop, w.leader, w.log, "janitor pass failed", passPauses, func(ctx context.Context) (time.Duration, error) {
		_, err := w.runOnce(ctx)
		return w.cfg.Interval, err
	})
}

// runOnce sweeps the paused tasks once.
func (w *PauseWatcher) runOnce(ctx context.Context) (tasks.PauseSweep, error) {
	if w.sweeper == nil {
		return tasks.PauseSweep{}, nil
	}
	res, err := w.sweeper.SweepPauses(ctx, w.marks)
	if res.Resumed > 0 || res.Expired > 0 {
		w.log.Info("pause sweep", "resumed", res.Resumed, "expired", res.Expired)
	}
	w.TestSignals.Swept.Signal(res)
	return res, err
}
