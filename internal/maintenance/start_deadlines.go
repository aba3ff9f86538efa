package maintenance

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/riverqueue/river/rivershared/startstop"
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
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
// racing it ends the task at most once, and whoever won releases the session lease,
// takes the task off its queue and publishes its state message.
type StartDeadlines struct {
	startstop.BaseStartStop

	TestSignals StartDeadlinesTestSignals

	lifecycle Lifecycle
	sched     Scheduler
	quotas    Quotas
	rdb       redis.UniversalClient
	keys      rkeys.Keys
	leader    Leadership
	log       *slog.Logger
	cfg       StartDeadlinesConfig
}

// NewStartDeadlines returns a stopped pass that runs while leader leads.
func NewStartDeadlines(d Deps, leader Leadership, c StartDeadlinesConfig) *StartDeadlines {
	return &StartDeadlines{lifecycle: d.lifecycle(), sched: d.Scheduler, quotas: d.Quotas, rdb: d.Redis, keys: d.Keys,
		leader: leader, log: d.logger().With("component", "janitor"), cfg: c.withDefaults()}
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
		ts, err := p.lifecycle.ExpireOverdue(ctx, p.cfg.Limit)
		if err != nil {
			return err
		}
		// Committed: the ends are this run's, and so are their side effects. They
		// run whatever is left of the budget, as a cancel's do.
		ectx := context.WithoutCancel(ctx)
		for _, t := range ts {
			p.expired(ectx, t)
		}
		res.Expired = len(ts)
		st.Rows, st.Done = len(ts), len(ts) < p.cfg.Limit
		return nil
	})
	p.TestSignals.Ran.Signal(res)
	return res, err
}

// expired does what the end of an expired task owns: its session lease goes back, it
// leaves its queue, and its watchers hear of the end. A failure only logs: the lease
// pass releases a lease whose task ended, and dispatch skips a task no longer queued.
func (p *StartDeadlines) expired(ctx context.Context, t store.Task) {
	id := t.ID.String()
	if _, err := p.quotas.Release(ctx, nil, t.TenantID, id); err != nil {
		p.log.Warn("releasing an expired task's lease failed; the lease pass releases it", "task_id", id, "err", err)
	}
	if _, err := p.sched.Remove(ctx, t.TenantID, t.ID); err != nil {
		p.log.Warn("removing an expired task from its queue failed; dispatch skips it", "task_id", id, "err", err)
	}
	ev, _ := json.Marshal(map[string]any{"type": "state", "task_id": id, "state": agentqtype.TaskStateExpired,
		"error": store.ExpiredError, "time": time.Now().UTC()})
	_ = p.rdb.Publish(ctx, p.keys.TaskEvents(id), ev).Err()
}
