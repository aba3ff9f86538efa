package maintenance

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/riverqueue/river/rivershared/startstop"
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// LeasesConfig configures the lease pass. Zero fields take the defaults.
type LeasesConfig struct {
	Interval time.Duration // between runs (5 min)
	Budget   time.Duration // a run's time bound (5 s)
	Walk     TenantWalk
}

func (c LeasesConfig) withDefaults() LeasesConfig {
	c.Interval = orDefault(c.Interval, defaultInterval)
	c.Budget = orDefault(c.Budget, defaultBudget)
	c.Walk = c.Walk.withDefaults()
	return c
}

// LeasesResult is what one run of the lease pass corrected.
type LeasesResult struct {
	Released int // leases of tasks that ended, or that Postgres does not know
	Added    int // leases of live tasks that Redis lost
	Stats    PassStats
}

// LeasesTestSignals are signalled after each run (initialised only in tests).
type LeasesTestSignals struct {
	Ran testsignal.TestSignal[LeasesResult]
}

// Init makes the signals waitable.
func (ts *LeasesTestSignals) Init(tb testutil.TestingTB) { ts.Ran.Init(tb) }

// leaseGrace is how old a lease of a task Postgres does not know must be before it is
// released: admission takes the lease just before the task row is committed.
const leaseGrace = time.Minute

// Leases compares tenants' session and long-running leases with their live tasks: it
// releases leases of tasks that ended (and of tasks Postgres does not know, once older
// than a minute), re-adds the leases of live tasks that Redis lost, and pushes the
// leases of queued tasks forward, since only a running task's worker refreshes its
// own. It walks the tenants from a cursor, within its budget.
type Leases struct {
	startstop.BaseStartStop

	TestSignals LeasesTestSignals

	store  Store
	quotas Quotas
	leader Leadership
	log    *slog.Logger
	cfg    LeasesConfig

	runMu  *sync.Mutex // serialises runs; shared by a Janitor's passes
	drift  driftRecorder
	cursor string // the last tenant the previous run reviewed
}

// NewLeases returns a stopped pass that runs while leader leads.
func NewLeases(d Deps, leader Leadership, c LeasesConfig) *Leases {
	return &Leases{
		store: d.Store, quotas: d.Quotas, leader: leader,
		log: d.logger().With("component", "janitor"), cfg: c.withDefaults(), runMu: new(sync.Mutex), drift: newDriftRecorder(d),
	}
}

// Start runs the pass every Interval while this process leads, until Stop.
func (p *Leases) Start(ctx context.Context) error {
	return startLeaderOnly(ctx, &p.BaseStartStop, p.leader, p.log, "janitor pass failed", passLeases, func(ctx context.Context) (time.Duration, error) {
		_, err := p.runOnce(ctx)
		return p.cfg.Interval, err
	})
}

// resetCursor makes the next run start from the first tenant.
func (p *Leases) resetCursor() {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	p.cursor = ""
}

func (p *Leases) runOnce(ctx context.Context) (LeasesResult, error) {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	var res LeasesResult
	var err error
	res.Stats, err = withinBudget(ctx, passLeases, p.cfg.Budget, func(ctx context.Context, st *PassStats) error {
		return walkTenants(ctx, p.store, p.cfg.Walk, &p.cursor, st, func(ctx context.Context, tenants []string, live map[string][]store.LiveTask) error {
			return p.review(ctx, tenants, live, &res)
		})
	})
	p.drift.record(ctx, passLeases, "leases_released", res.Released, "leases_added", res.Added)
	p.TestSignals.Ran.Signal(res)
	return res, err
}

// review reconciles a page of tenants' leases with their live tasks. One Redis round
// trip reads the whole page.
func (p *Leases) review(ctx context.Context, tenants []string, live map[string][]store.LiveTask, res *LeasesResult) error {
	sess, long, err := p.quotas.LeaseMembers(ctx, tenants)
	if err != nil {
		return fmt.Errorf("leases: %w", err)
	}
	owner := map[uuid.UUID]string{}
	var check, added []uuid.UUID
	for i, t := range tenants {
		liveIDs := map[string]bool{}
		for _, lt := range live[t] {
			liveIDs[lt.ID.String()] = true
		}
		held := map[string]bool{}
		for _, m := range append(sess[i], long[i]...) {
			if held[m] {
				continue
			}
			held[m] = true
			if liveIDs[m] {
				continue
			}
			if id, err := uuid.Parse(m); err == nil {
				check = append(check, id)
				owner[id] = t
			}
		}
		// Leases live 6 h from admission or their last refresh; a running task's worker
		// refreshes its own, queued tasks' leases are refreshed here.
		var queued []string
		for _, lt := range live[t] {
			if held[lt.ID.String()] && lt.State == agentqtype.TaskStateQueued {
				queued = append(queued, lt.ID.String())
			}
		}
		if _, err := p.quotas.TouchLeases(ctx, t, queued); err != nil {
			return fmt.Errorf("leases: refresh: %w", err)
		}
		for _, lt := range live[t] {
			if held[lt.ID.String()] || lt.Spawned { // a spawned task's session is its root's
				continue
			}
			if err := p.quotas.AddLease(ctx, t, lt.ID.String(), lt.MaxWallclockS > quotas.LongRunningThreshold.Seconds()); err != nil {
				p.log.Warn("re-adding a lost lease failed", "tenant_id", t, "task_id", lt.ID, "err", err)
				continue
			}
			added = append(added, lt.ID)
			owner[lt.ID] = t
		}
	}
	if len(check)+len(added) == 0 {
		return nil
	}
	// Re-read the states right before acting: a task may have become live or ended
	// since the page's snapshot.
	states, err := p.store.UnscopedTaskStates(ctx, append(append([]uuid.UUID{}, check...), added...))
	if err != nil {
		return err
	}
	if err := p.releaseEnded(ctx, check, owner, states, res); err != nil {
		return err
	}
	for _, id := range added {
		if !holdsSlots(states[id]) {
			_, _ = p.quotas.Release(ctx, nil, owner[id], id.String()) // ended meanwhile
		} else {
			res.Added++
		}
	}
	return nil
}

// releaseEnded releases the leases in check (by task) whose task ended, is paused, or
// is unknown to Postgres and not young, given the states read right before.
func (p *Leases) releaseEnded(ctx context.Context, check []uuid.UUID, owner map[uuid.UUID]string,
	states map[uuid.UUID]store.TaskState, res *LeasesResult) error {
	ages := map[string]map[string]time.Duration{} // per tenant, read only for unknown tasks
	for _, id := range check {
		t := owner[id]
		st, known := states[id]
		if known && holdsSlots(st) {
			continue // became live after the snapshot
		}
		if !known {
			if ages[t] == nil {
				s, l, err := p.quotas.LeaseAges(ctx, t)
				if err != nil {
					return err
				}
				ages[t] = s
				for m, a := range l {
					ages[t][m] = max(ages[t][m], a)
				}
			}
			if ages[t][id.String()] < leaseGrace {
				continue // maybe an admission still writing its task
			}
		}
		release := func(ctx context.Context, t, id string) (int, error) { return p.quotas.Release(ctx, nil, t, id) }
		if st == agentqtype.TaskStatePaused {
			// A resume may have taken the task's lease since the state was read: a
			// lease fresher than leaseGrace is the resume's and stays.
			release = func(ctx context.Context, t, id string) (int, error) {
				return p.quotas.ReleaseSettled(ctx, t, id, leaseGrace)
			}
		}
		n, err := release(ctx, t, id.String())
		if err != nil {
			return err
		}
		res.Released += n
	}
	return nil
}
