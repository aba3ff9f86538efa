package maintenance

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/riverqueue/river/rivershared/startstop"
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"

	"github.com/agentq/agentq/internal/periodic"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/scheduler"
)

// Recovery is the recovery sweep: it pushes queued tasks that Postgres holds but Redis
// lost back onto their tenants' queues, in admission order: after a Redis restart
// without persistence, a crash between the Postgres write and the Redis push, or
// admissions taken while Redis was down. Every scheduler process runs it; pushing
// twice is harmless (the queue is a set). The janitor's re-push pass runs the same
// walk in bounded steps.
type Recovery struct {
	startstop.BaseStartStop

	TestSignals RecoveryTestSignals

	push pusher
	log  *slog.Logger
	cfg  RecoveryConfig
}

// RecoveryTestSignals are signalled after each sweep (initialised only in tests).
type RecoveryTestSignals struct {
	Swept testsignal.TestSignal[int] // how many tasks the sweep pushed
}

// Init makes the signals waitable.
func (ts *RecoveryTestSignals) Init(tb testutil.TestingTB) { ts.Swept.Init(tb) }

// DefaultRecoveryMinAge is the MinAge a process's sweep uses: the push of a task
// admitted less than 5 s ago may still be on its way.
const DefaultRecoveryMinAge = 5 * time.Second

// RecoveryConfig configures the recovery sweep.
type RecoveryConfig struct {
	// Interval is the time between sweeps (default 30 s); the first runs at Start.
	Interval time.Duration
	// MinAge skips tasks admitted less than MinAge ago, whose push may still be on its
	// way. It has no default: zero sweeps every queued task.
	MinAge time.Duration
}

func (c RecoveryConfig) withDefaults() RecoveryConfig {
	if c.Interval <= 0 {
		c.Interval = 30 * time.Second
	}
	return c
}

// NewRecovery builds a recovery sweep. Nothing runs until Start.
func NewRecovery(d Deps, c RecoveryConfig) *Recovery {
	return &Recovery{push: newPusher(d), log: d.logger(), cfg: c.withDefaults()}
}

// Start runs a sweep now and then every Interval, until Stop.
func (r *Recovery) Start(ctx context.Context) error {
	return periodic.Start(ctx, &r.BaseStartStop, func(ctx context.Context) time.Duration {
		if n, err := r.runOnce(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("recovery sweep failed", "err", err)
		} else if n > 0 {
			r.log.Warn("recovery sweep re-pushed queued tasks missing from Redis", "tasks", n)
		}
		return r.cfg.Interval
	})
}

// runOnce walks every queued task older than MinAge once and re-pushes the ones
// missing from Redis. It returns how many it pushed. Pushing a task that is there
// already changes nothing, and a dispatched one is found in its running set, so MinAge
// only spares work on tasks whose admission is still pushing them.
func (r *Recovery) runOnce(ctx context.Context) (int, error) {
	pushed, _, _, err := r.push.sweepFrom(ctx, r.cfg.MinAge, uuid.Nil, 0)
	r.TestSignals.Swept.Signal(pushed)
	return pushed, err
}

// pusher puts Postgres's queued tasks back on their tenants' queues: the recovery
// sweep's walk, and the re-push of a task a pass freed.
type pusher struct {
	store Store
	sched Scheduler
	plans *quotas.Catalogue
}

func newPusher(d Deps) pusher { return pusher{store: d.Store, sched: d.Scheduler, plans: d.Plans} }

// sweepFrom re-pushes the queued tasks older than minAge that Redis is missing, in
// admission order from the task after the cursor, stopping once it has looked at
// maxRows tasks (0: no bound). seen counts the tasks it looked at; next is
// where the following call resumes, uuid.Nil once the walk reached the end.
func (r pusher) sweepFrom(ctx context.Context, minAge time.Duration, after uuid.UUID, maxRows int) (pushed, seen int, next uuid.UUID, err error) {
	const page = 500
	tenants := map[string]scheduler.EnqueueParams{}
	for {
		limit := page
		if maxRows > 0 {
			if left := maxRows - seen; left <= 0 {
				return pushed, seen, after, nil
			} else if left < limit {
				limit = left
			}
		}
		rows, err := r.store.UnscopedListQueued(ctx, store.ListQueuedParams{MinAge: minAge, After: after, Limit: limit})
		if err != nil {
			return pushed, seen, after, err
		}
		if len(rows) == 0 {
			return pushed, seen, uuid.Nil, nil
		}
		seen += len(rows)
		qs := make([]scheduler.Queued, len(rows))
		byID := map[uuid.UUID]store.QueuedTask{}
		for i, t := range rows {
			qs[i] = scheduler.Queued{TenantID: t.TenantID, TaskID: t.ID}
			byID[t.ID] = t
		}
		missing, err := r.sched.Missing(ctx, qs)
		if err != nil {
			return pushed, seen, after, err
		}
		for _, m := range missing {
			t := byID[m.TaskID]
			p, ok := tenants[t.TenantID]
			if !ok {
				if p, err = r.tenantParams(ctx, t.TenantID); err != nil {
					return pushed, seen, after, err
				}
				tenants[t.TenantID] = p
			}
			p.TaskID, p.Priority, p.CreatedAt = t.ID, t.Priority, t.CreatedAt
			if err := r.sched.Enqueue(ctx, p); err != nil {
				return pushed, seen, after, err
			}
			pushed++
		}
		after = rows[len(rows)-1].ID
		if len(rows) < limit {
			return pushed, seen, uuid.Nil, nil
		}
	}
}

func (r pusher) tenantParams(ctx context.Context, tenantID string) (scheduler.EnqueueParams, error) {
	t, err := r.store.GetTenant(ctx, tenantID)
	if err != nil {
		return scheduler.EnqueueParams{}, err
	}
	p, err := tenants.PolicyOf(r.plans, t)
	if err != nil {
		return scheduler.EnqueueParams{}, fmt.Errorf("tenant %s: %w", t.ID, err)
	}
	return scheduler.EnqueueParams{TenantID: t.ID, Weight: p.Weight, RunningCap: p.RunningCap}, nil
}

// requeue pushes one task back on its tenant's queue.
func (r pusher) requeue(ctx context.Context, tenantID string, id uuid.UUID, priority int, createdAt time.Time) error {
	p, err := r.tenantParams(ctx, tenantID)
	if err != nil {
		return err
	}
	p.TaskID, p.Priority, p.CreatedAt = id, priority, createdAt
	return r.sched.Enqueue(ctx, p)
}
