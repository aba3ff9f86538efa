package maintenance

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/riverqueue/river/rivershared/startstop"
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/wire"
)

// RunningSetsConfig configures the running-set pass. Zero fields take the defaults.
type RunningSetsConfig struct {
	Interval time.Duration // between runs (5 min)
	Budget   time.Duration // a run's time bound (5 s)
	Walk     TenantWalk
	// StrandedAfter is how long a dispatched task may wait for asynq to start it
	// before it counts as lost to asynq (30 s).
	StrandedAfter time.Duration
}

func (c RunningSetsConfig) withDefaults() RunningSetsConfig {
	c.Interval = orDefault(c.Interval, defaultInterval)
	c.Budget = orDefault(c.Budget, defaultBudget)
	c.Walk = c.Walk.withDefaults()
	c.StrandedAfter = orDefault(c.StrandedAfter, 30*time.Second)
	return c
}

// RunningSetsResult is what one run of the running-set pass corrected.
type RunningSetsResult struct {
	Removed  int // entries (and worker slots) of tasks that ended or Postgres does not know
	Added    int // running tasks missing from their tenant's set
	Stranded int // dispatched tasks lost to asynq, freed and queued again
	Stats    PassStats
}

// RunningSetsTestSignals are signalled after each run (initialised only in tests).
type RunningSetsTestSignals struct {
	Ran testsignal.TestSignal[RunningSetsResult]
}

// Init makes the signals waitable.
func (ts *RunningSetsTestSignals) Init(tb testutil.TestingTB) { ts.Ran.Init(tb) }

// RunningSets compares tenants' running sets, which hold the dispatch slots their
// running caps count, with their live tasks: it frees entries (and their worker slots) of
// tasks that ended or that Postgres does not know, re-adds running tasks missing from
// the set, and frees and re-queues dispatched tasks that asynq lost before starting
// them. It walks the tenants from a cursor, within its budget.
type RunningSets struct {
	startstop.BaseStartStop

	TestSignals RunningSetsTestSignals

	store     Store
	sched     Scheduler
	push      pusher
	inspector *asynq.Inspector
	leader    Leadership
	log       *slog.Logger
	cfg       RunningSetsConfig

	runMu  *sync.Mutex // serialises runs; shared by a Janitor's passes
	drift  driftRecorder
	cursor string // the last tenant the previous run reviewed
}

// NewRunningSets returns a stopped pass that runs while leader leads.
func NewRunningSets(d Deps, leader Leadership, c RunningSetsConfig) *RunningSets {
	return &RunningSets{
		store: d.Store, sched: d.Scheduler, push: newPusher(d),
		inspector: asynq.NewInspectorFromRedisClient(d.Redis), leader: leader,
		log: d.logger().With("component", "janitor"), cfg: c.withDefaults(), runMu: new(sync.Mutex), drift: newDriftRecorder(d),
	}
}

// Start runs the pass every Interval while this process leads, until Stop.
func (p *RunningSets) Start(ctx context.Context) error {
	return startLeaderOnly(ctx, &p.BaseStartStop, p.leader, p.log, "janitor pass failed", passRunning, func(ctx context.Context) (time.Duration, error) {
		_, err := p.runOnce(ctx)
		return p.cfg.Interval, err
	})
}

// resetCursor makes the next run start from the first tenant.
func (p *RunningSets) resetCursor() {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	p.cursor = ""
}

func (p *RunningSets) runOnce(ctx context.Context) (RunningSetsResult, error) {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	var res RunningSetsResult
	var err error
	res.Stats, err = withinBudget(ctx, passRunning, p.cfg.Budget, func(ctx context.Context, st *PassStats) error {
		return walkTenants(ctx, p.store, p.cfg.Walk, &p.cursor, st, func(ctx context.Context, tenants []string, live map[string][]store.LiveTask) error {
			return p.review(ctx, tenants, live, &res)
		})
	})
	p.drift.record(ctx, passRunning, "running_removed", res.Removed, "running_added", res.Added, "repushed", res.Stranded)
	p.TestSignals.Ran.Signal(res)
	return res, err
}

// review reconciles a page of tenants' running sets with their live tasks, a snapshot
// read from Postgres before. One Redis round trip reads the whole page.
func (p *RunningSets) review(ctx context.Context, tenants []string, live map[string][]store.LiveTask, res *RunningSetsResult) error {
	sets, err := p.sched.RunningSets(ctx, tenants)
	if err != nil {
		return fmt.Errorf("running sets: %w", err)
	}
	owner := map[uuid.UUID]string{}
	priority := map[uuid.UUID]int{} // of the re-added tasks, from Postgres
	var drop, readded []uuid.UUID
	for i, t := range tenants {
		members := sets[i]
		byID := make(map[string]store.LiveTask, len(live[t]))
		for _, lt := range live[t] {
			byID[lt.ID.String()] = lt
		}
		inSet := map[string]bool{}
		for _, m := range members {
			inSet[m] = true
			if _, ok := byID[m]; ok {
				continue
			}
			if id, err := uuid.Parse(m); err == nil {
				drop = append(drop, id)
				owner[id] = t
			}
		}
		if err := p.rescueStranded(ctx, t, byID, inSet, res); err != nil {
			p.log.Warn("re-queueing dispatched tasks lost to asynq failed", "tenant_id", t, "err", err)
		}
		for id, lt := range byID {
			if lt.State != agentqtype.TaskStateRunning || inSet[id] {
				continue
			}
			if err := p.sched.AddRunning(ctx, t, id); err != nil {
				p.log.Warn("re-adding a running-set entry failed", "tenant_id", t, "task_id", id, "err", err)
				continue
			}
			readded = append(readded, lt.ID)
			owner[lt.ID] = t
			priority[lt.ID] = lt.Priority
		}
	}
	if len(drop)+len(readded) == 0 {
		return nil
	}
	// Re-check Postgres right before dropping: a task admitted and dispatched after
	// the page's snapshot is in the set but not in the snapshot, and keeps its slot.
	states, err := p.store.UnscopedTaskStates(ctx, append(append([]uuid.UUID{}, drop...), readded...))
	if err != nil {
		return err
	}
	for _, id := range drop {
		st, known := states[id]
		if known && holdsSlots(st) {
			continue
		}
		// No priority: Postgres lists this task as not live, and Done needs none here.
		// Done frees the running-set and inflight entries by task id; the priority only
		// rebuilds the task's dispatching entry, together with the estimate, which the
		// janitor does not know either. A dispatching entry is the dispatcher's: it
		// re-sends it, and the pool check recounts a slot it held. A paused task's entry
		// goes as its worker's release would have taken it (scheduler.Paused): its next
		// dispatch, after a resume, is a new asynq message.
		free := p.sched.Done
		if st == agentqtype.TaskStatePaused {
			free = p.sched.Paused
		}
		if err := free(ctx, wire.Payload{TaskID: id.String(), TenantID: owner[id]}, -1); err != nil {
			return err
		}
		res.Removed++
	}
	// As with leases: a task that ended meanwhile must not keep a running slot.
	for _, id := range readded {
		if !holdsSlots(states[id]) {
			_ = p.sched.Done(ctx, wire.Payload{TaskID: id.String(), TenantID: owner[id], Priority: priority[id]}, -1)
		} else {
			res.Added++
		}
	}
	return nil
}

// rescueStranded frees the slots of a tenant's tasks that were dispatched, never
// started, and lost to asynq, and queues them again.
func (p *RunningSets) rescueStranded(ctx context.Context, tenant string, byID map[string]store.LiveTask, inSet map[string]bool, res *RunningSetsResult) error {
	for id, t := range byID {
		if t.State != agentqtype.TaskStateQueued || !inSet[id] {
			continue
		}
		stranded, err := p.sched.Stranded(ctx, p.inspector, tenant, id, t.Priority, p.cfg.StrandedAfter)
		if err != nil || !stranded {
			continue
		}
		_ = p.sched.Done(ctx, wire.Payload{TaskID: id, TenantID: tenant, Priority: t.Priority}, -1)
		if err := p.push.requeue(ctx, tenant, t.ID, t.Priority, t.CreatedAt); err != nil {
			return err
		}
		res.Stranded++
	}
	return nil
}

// holdsSlots reports whether a task in state st may hold a running slot or a session
// lease: a queued or running one. An ended task holds neither, and neither does a
// paused one: its worker frees both before the pause is over, and a resume takes its
// lease again.
func holdsSlots(st store.TaskState) bool {
	return !st.Terminal() && st != agentqtype.TaskStatePaused
}
