package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"
)

// GenerationCheckConfig configures the generation check. Zero fields take the defaults.
type GenerationCheckConfig struct {
	Interval time.Duration // between checks of the marker (1 s)
	// RetryAfter is the pause between two repair runs whose passes did not all reach
	// their end (1 s); a failing run is retried after five times as long.
	RetryAfter time.Duration
	// FollowUpAfter is when, after the repair of a loss, every pass runs once more
	// (35 s): a task dispatched just before the loss and lost with asynq's copy can
	// only be told stranded once RunningSets.StrandedAfter (30 s) has passed since
	// its dispatch, and the passes' own interval may be minutes.
	FollowUpAfter time.Duration
}

func (c GenerationCheckConfig) withDefaults() GenerationCheckConfig {
	c.Interval = orDefault(c.Interval, time.Second)
	c.RetryAfter = orDefault(c.RetryAfter, time.Second)
	c.FollowUpAfter = orDefault(c.FollowUpAfter, 35*time.Second)
	return c
}

// Generation is what the Redis generation marker says about Redis's state.
type Generation int

// Generations.
const (
	GenerationSame  Generation = iota // the marker was there: nothing lost
	GenerationFirst                   // newly set on a database that never had a task: a first start
	GenerationLost                    // newly set although Postgres holds tasks: Redis lost its data
)

// GenerationResult is what one check found, and the repair it ran if it had to.
type GenerationResult struct {
	Generation Generation
	// Repair is the report of the last repair run (nil when the marker was there).
	Repair *Report
	// Runs counts the repair runs it took for every pass to reach its end.
	Runs int
	// FollowUp is set on the check that ran the follow-up repair of an earlier loss.
	FollowUp bool
}

// GenerationTestSignals are signalled after each check (initialised only in tests).
type GenerationTestSignals struct {
	Checked testsignal.TestSignal[GenerationResult]
}

// Init makes the signals waitable.
func (ts *GenerationTestSignals) Init(tb testutil.TestingTB) { ts.Checked.Init(tb) }

// GenerationCheck detects Redis data loss and repairs it at once. The leader sets a
// marker key, which vanishes with a FLUSHDB or a restart without persistence; when it
// finds the marker missing it resets every walking pass's cursor and runs all the
// passes back to back until each has reached its end. A missing marker on a database
// that never admitted a task is a first start, logged at info rather than as a loss.
type GenerationCheck struct {
	startstop.BaseStartStop

	TestSignals GenerationTestSignals

	store  Store
	sched  Scheduler
	runner *Janitor // the passes a repair runs
	leader Leadership
	log    *slog.Logger
	cfg    GenerationCheckConfig

	followUp time.Time // when to repair once more after a loss; zero: not due
}

func newGenerationCheck(d Deps, leader Leadership, runner *Janitor, c GenerationCheckConfig) *GenerationCheck {
	return &GenerationCheck{
		store: d.Store, sched: d.Scheduler, runner: runner, leader: leader,
		log: d.logger().With("component", "janitor"), cfg: c.withDefaults(),
	}
}

// Start checks the marker every Interval while this process leads, until Stop.
func (g *GenerationCheck) Start(ctx context.Context) error {
	return startLeaderOnly(ctx, &g.BaseStartStop, g.leader, g.log, "generation check failed", passGeneration, func(ctx context.Context) (time.Duration, error) {
		_, err := g.runOnce(ctx)
		return g.cfg.Interval, err
	})
}

// runOnce checks the marker and, if it was missing, repairs: every pass from the
// start, run after run until all reached their end or ctx ends.
func (g *GenerationCheck) runOnce(ctx context.Context) (GenerationResult, error) {
	var res GenerationResult
	defer func() { g.TestSignals.Checked.Signal(res) }()
	gen, err := g.check(ctx)
	res.Generation = gen
	if gen == GenerationSame {
		if err != nil || g.followUp.IsZero() || time.Now().Before(g.followUp) {
			return res, err
		}
		g.followUp = time.Time{}
		res.FollowUp = true
		err := g.repair(ctx, &res)
		if err == nil {
			g.log.Info("follow-up of a Redis data loss: reconciled from Postgres again", "report", *res.Repair)
		}
		return res, err
	}
	if err != nil {
		g.log.Warn("generation check failed", "err", err)
	}
	if err := g.repair(ctx, &res); err != nil {
		return res, err
	}
	if res.Generation == GenerationLost {
		res.Repair.RedisDataLoss = true
		g.log.Warn("Redis lost its data: reconciled from Postgres", "report", *res.Repair)
		g.followUp = time.Now().Add(g.cfg.FollowUpAfter)
	} else {
		g.log.Info("first start on this Redis: generation marker written", "report", *res.Repair)
	}
	return res, nil
}

// repair runs every pass from the start, run after run, until all reached their end
// or ctx ends; a marker lost again meanwhile starts it over.
func (g *GenerationCheck) repair(ctx context.Context, res *GenerationResult) error {
	g.runner.resetCursors()
	for {
		rep, err := g.runner.runOnce(ctx)
		res.Runs++
		res.Repair = &rep
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil && rep.complete() {
			return nil
		}
		wait := g.cfg.RetryAfter
		if err != nil {
			g.log.Warn("janitor repair run failed", "err", err)
			wait *= 5
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		// Lost again meanwhile: start over from the first tenant and task.
		if again, _ := g.check(ctx); again != GenerationSame {
			res.Generation = max(res.Generation, again)
			g.runner.resetCursors()
		}
	}
}

// check sets the marker if it is missing and says what its absence means.
func (g *GenerationCheck) check(ctx context.Context) (Generation, error) {
	ok, err := g.sched.MarkGeneration(ctx)
	if err != nil {
		return GenerationSame, err
	}
	if !ok {
		return GenerationSame, nil
	}
	// Newly set: a reconciliation is what to do either way; the log line differs.
	hadTasks, err := g.store.UnscopedAnyTask(ctx)
	if err != nil {
		return GenerationLost, err // cannot tell: treat it as the loss it may be
	}
	if !hadTasks {
		return GenerationFirst, nil
	}
	return GenerationLost, nil
}
