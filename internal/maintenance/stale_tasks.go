package maintenance

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/wire"
)

// StaleTasksConfig configures the stale-task pass. Zero fields take the defaults.
type StaleTasksConfig struct {
	Interval    time.Duration // between runs (5 min)
	Budget      time.Duration // a run's time bound (5 s)
	StaleAfter  time.Duration // a running task with an older heartbeat lost its worker (30 s)
	MaxAttempts int           // attempts before a task whose worker keeps dying is abandoned (3)
	Batch       int           // stale tasks handled per run (500)
}

func (c StaleTasksConfig) withDefaults() StaleTasksConfig {
	c.Interval = orDefault(c.Interval, defaultInterval)
	c.Budget = orDefault(c.Budget, defaultBudget)
	c.StaleAfter = orDefault(c.StaleAfter, 30*time.Second)
	c.MaxAttempts = orDefault(c.MaxAttempts, 3)
	c.Batch = orDefault(c.Batch, 500)
	return c
}

// StaleTasksResult is what one run of the stale-task pass corrected.
type StaleTasksResult struct {
	Requeued  int // back to the queue for another attempt
	Abandoned int // out of attempts
	// Deferred: this process took the lead less than StaleAfter ago and left stale
	// tasks alone (see StaleTasks).
	Deferred bool
	Stats    PassStats
}

// StaleTasksTestSignals are signalled after each run (initialised only in tests).
type StaleTasksTestSignals struct {
	Ran testsignal.TestSignal[StaleTasksResult]
}

// Init makes the signals waitable.
func (ts *StaleTasksTestSignals) Init(tb testutil.TestingTB) { ts.Ran.Init(tb) }

// StaleTasks handles running tasks whose worker stopped heartbeating: back to the
// queue for another attempt, or abandoned after MaxAttempts. A new leader (often one
// elected right after a Postgres outage) waits StaleAfter before its first such run,
// so live workers can stamp their heartbeats again first.
type StaleTasks struct {
	startstop.BaseStartStop

	TestSignals StaleTasksTestSignals

	store  Store
	tasks  Lifecycle
	sched  Scheduler
	quotas Quotas
	push   pusher
	leader Leadership
	log    *slog.Logger
	cfg    StaleTasksConfig

	runMu *sync.Mutex // serialises runs; shared by a Janitor's passes
	drift driftRecorder
}

// NewStaleTasks returns a stopped pass that runs while leader leads.
func NewStaleTasks(d Deps, leader Leadership, c StaleTasksConfig) *StaleTasks {
	return &StaleTasks{
		store: d.Store, tasks: d.lifecycle(), sched: d.Scheduler, quotas: d.Quotas, push: newPusher(d), leader: leader,
		log: d.logger().With("component", "janitor"), cfg: c.withDefaults(), runMu: new(sync.Mutex), drift: newDriftRecorder(d),
	}
}

// Start runs the pass every Interval while this process leads, until Stop.
func (p *StaleTasks) Start(ctx context.Context) error {
	return startLeaderOnly(ctx, &p.BaseStartStop, p.leader, p.log, "janitor pass failed", passStale, func(ctx context.Context) (time.Duration, error) {
		res, err := p.runOnce(ctx)
		if res.Deferred {
			// back as soon as stale tasks may be handled
			if since, _ := p.leader.Watch(); !since.IsZero() {
				return min(p.cfg.Interval, time.Until(since.Add(p.cfg.StaleAfter+time.Second))), err
			}
		}
		return p.cfg.Interval, err
	})
}

func (p *StaleTasks) runOnce(ctx context.Context) (StaleTasksResult, error) {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	var res StaleTasksResult
	var err error
	res.Stats, err = withinBudget(ctx, passStale, p.cfg.Budget, func(ctx context.Context, st *PassStats) error {
		if since, _ := p.leader.Watch(); !since.IsZero() && time.Since(since) < p.cfg.StaleAfter {
			res.Deferred, st.Done = true, true
			return nil
		}
		return p.rescue(ctx, &res, st)
	})
	p.drift.record(ctx, passStale, "stale_requeued", res.Requeued, "abandoned", res.Abandoned)
	p.TestSignals.Ran.Signal(res)
	return res, err
}

func (p *StaleTasks) rescue(ctx context.Context, res *StaleTasksResult, st *PassStats) error {
	stale, err := p.store.UnscopedListStaleRunning(ctx, p.cfg.StaleAfter, p.cfg.Batch)
	if err != nil {
		return err
	}
	for _, t := range stale {
		st.Rows++
		id := t.ID.String()
		// its dispatch slots are gone with its worker
		cleanup := wire.Payload{TaskID: id, TenantID: t.TenantID, Priority: t.Priority}
		if t.Attempt >= p.cfg.MaxAttempts {
			// Fenced on the attempt read: a redelivery that took the task over since
			// keeps it.
			ok, err := p.tasks.Finish(ctx, tasks.FinishParams{Claim: store.Claim{ID: t.ID, Attempt: t.Attempt},
				To: agentqtype.TaskStateAbandoned, Error: agentqtype.AbandonedAfter(t.Attempt), Abandoned: true})
			if errors.Is(err, store.ErrLostClaim) {
				continue
			}
			if err != nil {
				return err
			}
			if ok {
				// Its lease and its message followed the end (tasks.Ends).
				res.Abandoned++
				_ = p.sched.Done(ctx, cleanup, -1)
			}
			continue
		}
		task, ok, err := p.tasks.RequeueStale(ctx, t.ID, p.cfg.StaleAfter)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		res.Requeued++
		_ = p.sched.Done(ctx, cleanup, -1)
		if err := p.push.requeue(ctx, task.TenantID, task.ID, task.Priority, task.CreatedAt); err != nil {
			return err
		}
	}
	st.Done = len(stale) < p.cfg.Batch
	return nil
}
