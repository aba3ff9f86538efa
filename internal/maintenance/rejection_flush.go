package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"
)

// RejectionFlusher copies admission's refusal counts from Redis into Postgres and
// writes their limit_hit events (*rejections.Rejections).
type RejectionFlusher interface {
	// FlushRejections does one flush: how many counts it copied and events it wrote.
	FlushRejections(ctx context.Context) (rows, events int, err error)
}

// RejectionFlushConfig configures the refusal-count flush. Zero fields take the
// defaults.
type RejectionFlushConfig struct {
	// Interval between runs (1 s): how long a limit's first refusal in a window may
	// wait for its limit_hit, and at most what a Redis data loss takes of the counts.
	Interval time.Duration
	// Budget is a run's time bound (5 s); a run cut by it is resumed by the next where
	// it stopped (the flusher keeps its cursor).
	Budget time.Duration
}

func (c RejectionFlushConfig) withDefaults() RejectionFlushConfig {
	c.Interval = orDefault(c.Interval, time.Second)
	c.Budget = orDefault(c.Budget, defaultBudget)
	return c
}

// RejectionFlushResult is what one run copied.
type RejectionFlushResult struct {
	Rows, Events int
	Stats        PassStats
}

// RejectionFlushTestSignals are signalled after each run (initialised only in tests).
type RejectionFlushTestSignals struct {
	Ran testsignal.TestSignal[RejectionFlushResult]
}

// Init makes the signals waitable.
func (ts *RejectionFlushTestSignals) Init(tb testutil.TestingTB) { ts.Ran.Init(tb) }

// RejectionFlush runs the refusal-count flush on the leader. It is no drift repair and
// repairs no task, so it does not take turns with the drift passes: it runs every
// second whatever they do. Without a flusher (Deps.Rejections nil) it does nothing.
type RejectionFlush struct {
	startstop.BaseStartStop

	TestSignals RejectionFlushTestSignals

	flusher RejectionFlusher
	leader  Leadership
	log     *slog.Logger
	cfg     RejectionFlushConfig
}

// NewRejectionFlush returns a stopped pass that runs while leader leads.
func NewRejectionFlush(d Deps, leader Leadership, c RejectionFlushConfig) *RejectionFlush {
	return &RejectionFlush{flusher: d.Rejections, leader: leader, log: d.logger().With("component", "janitor"), cfg: c.withDefaults()}
}

// Start runs the pass every Interval while this process leads, until Stop.
func (p *RejectionFlush) Start(ctx context.Context) error {
	return startLeaderOnly(ctx, &p.BaseStartStop, p.leader, p.log, "janitor pass failed", passRejections, func(ctx context.Context) (time.Duration, error) {
		_, err := p.runOnce(ctx)
		return p.cfg.Interval, err
	})
}

func (p *RejectionFlush) runOnce(ctx context.Context) (RejectionFlushResult, error) {
	var res RejectionFlushResult
	var err error
	res.Stats, err = withinBudget(ctx, passRejections, p.cfg.Budget, func(ctx context.Context, st *PassStats) error {
		if p.flusher == nil {
			st.Done = true
			return nil
		}
		var err error
		res.Rows, res.Events, err = p.flusher.FlushRejections(ctx)
		st.Rows, st.Done = res.Rows, err == nil
		return err
	})
	p.TestSignals.Ran.Signal(res)
	return res, err
}
