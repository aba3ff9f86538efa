package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"

	"github.com/agentq/agentq/internal/periodic"
	"github.com/agentq/agentq/internal/tasks"
)

// PauseSweeper is what the pause watcher runs (*tasks.Service): the rules of when a
// paused task resumes by itself or ends are the tasks domain's.
type PauseSweeper interface {
	SweepPauses(ctx context.Context) (tasks.PauseSweep, error)
}

var _ PauseSweeper = (*tasks.Service)(nil)

// PauseWatcher resumes paused tasks whose quota allows again and ends those paused
// past their plan's pause timeout (tasks.Service.SweepPauses). Every scheduler
// process runs it, like the recovery sweep, rather than the janitor's leader alone: a
// raised quota should resume its tasks within a second or so, and each change is a
// conditional write, so processes sweeping at once change each task once. A sweep is
// one indexed read of the paused tasks, so a second's interval costs little.
type PauseWatcher struct {
	startstop.BaseStartStop

	TestSignals PauseWatcherTestSignals

	sweeper PauseSweeper
	log     *slog.Logger
	cfg     PauseWatcherConfig
}

// PauseWatcherTestSignals are signalled after each sweep (initialised only in tests).
type PauseWatcherTestSignals struct {
	Swept testsignal.TestSignal[tasks.PauseSweep]
}

// Init makes the signals waitable.
func (ts *PauseWatcherTestSignals) Init(tb testutil.TestingTB) { ts.Swept.Init(tb) }

// PauseWatcherConfig configures the pause watcher.
type PauseWatcherConfig struct {
	// Interval is the time between sweeps (default 1 s); the first runs at Start.
	Interval time.Duration
}

func (c PauseWatcherConfig) withDefaults() PauseWatcherConfig {
	c.Interval = orDefault(c.Interval, time.Second)
	return c
}

// NewPauseWatcher builds the watcher over sweeper. Nothing runs until Start.
func NewPauseWatcher(d Deps, sweeper PauseSweeper, c PauseWatcherConfig) *PauseWatcher {
	return &PauseWatcher{sweeper: sweeper, log: d.logger(), cfg: c.withDefaults()}
}

// Start sweeps now and then every Interval, until Stop.
func (w *PauseWatcher) Start(ctx context.Context) error {
	return periodic.Start(ctx, &w.BaseStartStop, func(ctx context.Context) time.Duration {
		if _, err := w.runOnce(ctx); err != nil && ctx.Err() == nil {
			w.log.Warn("pause sweep failed", "err", err)
		}
		return w.cfg.Interval
	})
}

// runOnce sweeps the paused tasks once.
func (w *PauseWatcher) runOnce(ctx context.Context) (tasks.PauseSweep, error) {
	res, err := w.sweeper.SweepPauses(ctx)
	if res.Resumed > 0 || res.Expired > 0 {
		w.log.Info("pause sweep", "resumed", res.Resumed, "expired", res.Expired)
	}
	w.TestSignals.Swept.Signal(res)
	return res, err
}
