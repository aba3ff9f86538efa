package outbox

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// The limit_types of a missed commitment: the override keys of the commitments.
const (
	LimitSLAStart    = quotas.SLAStartWithin
	LimitSLAPoolWait = quotas.SLAPoolWaitWithin
)

// Breach is a commitment of a tenant's plan the platform missed.
type Breach struct {
	TenantID  string
	Plan      string
	LimitType string // LimitSLAStart or LimitSLAPoolWait
	Committed time.Duration
	Measured  time.Duration
	At        time.Time
}

// Breach returns the usage.limit_hit of a missed commitment: eligible_breach,
// enforcement "delayed", refused_by platform, limit_value and current_usage the
// committed and measured seconds (rounded up), committed_ms and measured_ms exact.
// One per tenant, commitment and DedupeWindow in which the commitment lapsed: its key
// is that window's, marked as the platform's.
func (e Events) Breach(b Breach) (Event, error) {
	// The window is the minute the commitment lapsed (At − Measured + Committed), so a
	// wait reported while it goes on (Commitments.Waiting) and at its start share one
	// event.
	due := b.At.Add(b.Committed - b.Measured)
	start := WindowStart(due)
	committed, measured := b.Committed.Milliseconds(), b.Measured.Milliseconds()
	d := LimitData{
		TenantID: b.TenantID, Plan: b.Plan, LimitType: b.LimitType,
		LimitValue: Amount{N: ceilSeconds(b.Committed)}, CurrentUsage: Amount{N: ceilSeconds(b.Measured)},
		CommittedMs: &committed, MeasuredMs: &measured,
		Window: &Span{Start: start, End: start.Add(DedupeWindow)}, Enforcement: EnforcementDelayed, RefusedBy: RefusedByPlatform,
		SLAClassification: Classify(Cause{Threshold: 100, By: LimitedByPlatform, How: HowCommitmentMissed}),
	}
	return e.build(TypeLimitHit, WindowKey(b.TenantID, b.LimitType, due)+"|"+RefusedByPlatform, b.At, d)
}

func ceilSeconds(d time.Duration) int64 { return int64(math.Ceil(d.Seconds())) }

// StartHolds tells whether a tenant's own running cap or demand may have held back a
// task created at since that starts now (scheduler.Scheduler.HeldBack).
type StartHolds interface {
	HeldBack(ctx context.Context, tenantID string, since time.Time, started int64) (bool, error)
}

// PoolShares tells whether a tenant asking a model pool for ask tokens is within its
// weighted share of it, and whether the pool knows the tenant at all
// (capacity.Pools.PoolWithinShare).
type PoolShares interface {
	PoolWithinShare(ctx context.Context, pool, tenant string, ask int64) (within, known bool, err error)
}

// TenantReader reads a tenant (the server's is a cache).
type TenantReader interface {
	GetTenant(ctx context.Context, id string) (store.Tenant, error)
}

// Commitments writes the events of the commitments a task's start shows missed
// (quotas.SLA): a first start later than start_within_s after the task's creation,
// and a wait for a shared model pool longer than pool_wait_within_s, each only while
// the tenant was within its own limits and share (docs/limits.md). Build it with
// NewCommitments.
type Commitments struct {
	Events Events
	// SLA returns a tenant's commitments (tenants.Policy's SLA).
	SLA func(store.Tenant) (quotas.SLA, error)
	// Tenants reads the started task's tenant; nil: read on the start's transaction.
	Tenants TenantReader
	// Starts and Pools judge whether the tenant was within its limits and share; a
	// nil one judges it always within.
	Starts StartHolds
	Pools  PoolShares

	breaches metric.Int64Counter
	// judged spares late starts a judgment already made (NewCommitments makes it).
	judged *judgments
	// cursors are where the late-start pass goes on in each tenant's lapsed tasks
	// (NewCommitments makes them).
	cursors *lateCursors
}

// judgments remember, by key, until when a late start needs no judgment of its own:
// a tenant's own limits or demand held one of its starts back a moment ago (judged
// again after heldFor), or the breach of a lapse minute is written (the window's other
// late starts would write nothing). A flood's late starts then cost no Redis reads
// each. Entries past their time are dropped as the map grows.
type judgments struct {
	mu    sync.Mutex
	until map[string]time.Time
}

// heldFor is how long a judgment that the tenant held itself back stands.
const heldFor = time.Second

func (j *judgments) fresh(key string, now time.Time) bool {
	if j == nil {
		return false
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return now.Before(j.until[key])
}

func (j *judgments) note(key string, until time.Time) {
	if j == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.until) >= 4096 {
		now := time.Now()
		for k, t := range j.until {
			if !now.Before(t) {
				delete(j.until, k)
			}
		}
	}
	j.until[key] = until
}

// NewCommitments returns c with its meter (agentq.sla_breaches) from a.
func NewCommitments(c Commitments, a *baseservice.Archetype) *Commitments {
	c.judged = &judgments{until: map[string]time.Time{}}
	c.cursors = &lateCursors{from: map[string]time.Time{}}
	c.breaches, _ = a.Meter("github.com/agentq/agentq/billing/outbox").Int64Counter("agentq.sla_breaches",
		metric.WithUnit("{breach}"),
		metric.WithDescription("Commitments of a plan the platform missed (eligible_breach events written), by limit_type and tenant"))
	return &c
}

// Started runs right after the start of task t committed (Subscriber's AfterCommit)
// and writes on st the usage.limit_hit of each commitment the start shows missed. A
// start within its commitments reads nothing but the (cached) tenant; the checks of
// the tenant's limits and share run only for a late one. Nothing here fails a start:
// a wait that cannot be judged (the tenant, the pool or Redis not answering) is not
// credited.
func (c *Commitments) Started(ctx context.Context, st *store.Store, t store.Task) error {
	firstStart := t.Attempt == 1 && t.StartedAt != nil
	pool, poolWait := "", false
	if t.Resumed != nil {
		// Only a wait for a shared model pool is one the pool wait commitment covers.
		// A wait after a throttled answer of the agent's provider is not: the provider
		// refused, not the pool, and the agent names the retry time (up to an hour);
		// nor is a wait for the tenant's own tokens a minute.
		pool, poolWait = agentqtype.WaitReason(t.Resumed.Reason).Pool()
	}
	if !firstStart && !poolWait {
		return nil
	}
	tenant, err := c.tenant(ctx, st, t.TenantID)
	if err != nil {
		return nil
	}
	sla, err := c.SLA(tenant)
	if err != nil {
		return nil // a tenant whose plan is gone has no commitments to keep
	}
	if within, ok := quotas.Within(sla.StartWithinS); ok && firstStart {
		if measured := t.StartedAt.Sub(t.CreatedAt); measured > within {
			if _, _, err := c.startBreach(ctx, st, t, tenant.Plan, within, measured, *t.StartedAt); err != nil {
				return err
			}
		}
	}
	if within, ok := quotas.Within(sla.PoolWaitWithinS); ok && poolWait {
		return c.poolBreach(ctx, st, t, tenant.Plan, pool, within)
	}
	return nil
}

// startBreach writes the breach of a first start (or a wait for it, at) later than
// committed unless the tenant's own running cap or demand held it (StartHolds).
// covered tells that the lapse minute has its event (written now or before).
func (c *Commitments) startBreach(ctx context.Context, tx *store.Store, t store.Task, plan string, committed, measured time.Duration,
	at time.Time) (written, covered bool, err error) {
	now := time.Now()
	heldKey := t.TenantID + "|held"
	lapse := WindowStart(t.CreatedAt.Add(committed))
	writtenKey := t.TenantID + "|" + lapse.Format(time.RFC3339)
	if c.judged.fresh(writtenKey, now) {
		return false, true, nil
	}
	if c.judged.fresh(heldKey, now) {
		return false, false, nil
	}
	if held, err := c.heldBack(ctx, tx, t.TenantID, t.CreatedAt); err != nil || held {
		if held {
			c.judged.note(heldKey, now.Add(heldFor))
		}
		return false, false, nil
	}
	written, err = c.write(ctx, tx, Breach{TenantID: t.TenantID, Plan: plan, LimitType: LimitSLAStart,
		Committed: committed, Measured: measured, At: at})
	if err != nil {
		return false, false, err
	}
	// Written now or before: the lapse minute has its event.
	c.judged.note(writtenKey, lapse.Add(DedupeWindow+time.Minute))
	return written, true, nil
}

// heldBack tells whether the tenant's own running cap or demand may have held back
// its task waiting since since (StartHolds); an error leaves the wait unjudged.
func (c *Commitments) heldBack(ctx context.Context, tx *store.Store, tenantID string, since time.Time) (bool, error) {
	if c.Starts == nil {
		return false, nil
	}
	// The tenant's started tasks (this one included, at a start) as the transaction
	// sees them: its running set in Redis also holds tasks handed to the workers
	// ahead of time (prefetched), which are not its use of the pool.
	started, err := tx.CountTasks(ctx, store.CountTasksParams{TenantID: tenantID, State: agentqtype.TaskStateRunning})
	if err != nil {
		return false, err
	}
	return c.Starts.HeldBack(ctx, tenantID, since, int64(started))
}

// Waiting writes the breaches of tasks still waiting for their first start past their
// plan's start_within_s, without waiting for the start: the janitor runs it
// periodically. It looks only at the tenants whose plan commits and whose oldest
// waiting task's commitment lapsed, each run starting after the tenant the previous
// run looked at last, and, of each, at its lapsed tasks from where the previous run
// left it (lateCursors), at most limit tasks in all. Each is written in a transaction
// of its own and judged as at a start (StartHolds, with the wait so far); the start
// writes nothing more for the same lapse (Breach's window). It returns how many tasks
// it looked at and how many events it wrote.
func (c *Commitments) Waiting(ctx context.Context, st *store.Store, limit int) (checked, written int, err error) {
	ws, err := st.UnscopedFirstStartsWaiting(ctx)
	if err != nil {
		return 0, 0, err
	}
	first := c.cursors.keep(ws)
	for i := range ws {
		if checked >= limit {
			break
		}
		w := ws[(first+i)%len(ws)]
		tenant, err := c.tenant(ctx, st, w.TenantID)
		if err != nil {
			continue
		}
		sla, err := c.SLA(tenant)
		within, ok := quotas.Within(sla.StartWithinS)
		if err != nil || !ok || time.Since(w.Oldest) <= within {
			continue
		}
		n, k, err := c.waitingOf(ctx, st, tenant, within, min(limit-checked, lateBatch))
		checked, written = checked+n, written+k
		c.cursors.looked(tenant.ID)
		if err != nil {
			return checked, written, err
		}
	}
	return checked, written, nil
}

// lateBatch bounds the lapsed tasks of one tenant a run of Waiting looks at.
const lateBatch = 50

// waitingOf judges up to limit of a tenant's tasks whose start commitment (within)
// lapsed, from its cursor on, and moves the cursor past each lapse minute that has its
// event. It stops at a task the tenant held back (or that could not be judged): its
// later tasks would be judged alike.
func (c *Commitments) waitingOf(ctx context.Context, st *store.Store, tenant store.Tenant, within time.Duration,
	limit int) (checked, written int, err error) {
	ts, err := st.UnscopedFirstStartsLapsed(ctx, tenant.ID, c.cursors.get(tenant.ID), within, limit)
	if err != nil {
		return 0, 0, err
	}
	for _, t := range ts {
		now := time.Now()
		var wrote, covered bool
		err = st.InTx(ctx, func(tx *store.Store) error {
			var err error
			wrote, covered, err = c.startBreach(ctx, tx, t, tenant.Plan, within, now.Sub(t.CreatedAt), now)
			return err
		})
		checked++
		if err != nil || !covered {
			return checked, written, err
		}
		if wrote {
			written++
		}
		// The tasks created from here lapse in a later minute.
		c.cursors.advance(tenant.ID, WindowStart(t.CreatedAt.Add(within)).Add(DedupeWindow-within))
	}
	return checked, written, nil
}

// lateCursors are, by tenant, the creation time from which its waiting tasks may
// still lapse in a minute without its event: the late-start pass moves a tenant's past
// each minute whose event is written, so a backlog lapsed in one minute does not hide
// the later minutes' lapses. A tenant with no task waiting any more is forgotten. last
// is the tenant the latest run looked at last: the next run starts after it, so
// tenants late in the order are not left out when many lapse at once.
type lateCursors struct {
	mu   sync.Mutex
	from map[string]time.Time
	last string
}

func (l *lateCursors) get(tenant string) time.Time {
	if l == nil {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.from[tenant]
}

func (l *lateCursors) advance(tenant string, to time.Time) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if to.After(l.from[tenant]) {
		l.from[tenant] = to
	}
}

func (l *lateCursors) looked(tenant string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last = tenant
}

// keep forgets the cursors of the tenants not in ws (in tenant order), and returns
// the index in ws of the tenant to start at: the one after the last one looked at.
func (l *lateCursors) keep(ws []store.FirstStartsWaiting) (first int) {
	if l == nil {
		return 0
	}
	waiting := make(map[string]bool, len(ws))
	for _, w := range ws {
		waiting[w.TenantID] = true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for t := range l.from {
		if !waiting[t] {
			delete(l.from, t)
		}
	}
	if i := slices.IndexFunc(ws, func(w store.FirstStartsWaiting) bool { return w.TenantID == l.last }); i >= 0 {
		return (i + 1) % len(ws)
	}
	return max(0, slices.IndexFunc(ws, func(w store.FirstStartsWaiting) bool { return w.TenantID > l.last }))
}

// poolBreach writes the breach of a pool wait longer than committed. The wait is
// measured from the park to the unpark (the wait_until the pool named); the rest, on
// the tenant's queue until the start, counts too unless the tenant's own running cap
// or demand held it back there (StartHolds, since the unpark), or that cannot be
// judged. No breach when the tenant had drawn more than its share of the pool, or the
// pool does not know the tenant (nothing to judge its share by).
func (c *Commitments) poolBreach(ctx context.Context, tx *store.Store, t store.Task, plan, pool string, committed time.Duration) error {
	w := t.Resumed
	measured := time.Duration(w.WaitedMs) * time.Millisecond
	if measured <= committed {
		return nil
	}
	if toUnpark := time.Duration(w.ToUnparkMs) * time.Millisecond; w.Until != nil && toUnpark < measured {
		if held, err := c.heldBack(ctx, tx, t.TenantID, *w.Until); err != nil || held {
			measured = toUnpark
		}
	}
	if measured <= committed {
		return nil
	}
	if c.Pools != nil {
		var ask int64
		if t.Wait.StepEstimate != nil {
			ask = *t.Wait.StepEstimate
		}
		if within, known, err := c.Pools.PoolWithinShare(ctx, pool, t.TenantID, ask); err != nil || !known || !within {
			return nil // over its share, or not judged: not credited
		}
	}
	_, err := c.write(ctx, tx, Breach{TenantID: t.TenantID, Plan: plan, LimitType: LimitSLAPoolWait,
		Committed: committed, Measured: measured, At: time.Now()})
	return err
}

func (c *Commitments) tenant(ctx context.Context, tx *store.Store, id string) (store.Tenant, error) {
	if c.Tenants != nil {
		return c.Tenants.GetTenant(ctx, id)
	}
	return tx.GetTenant(ctx, id)
}

// write writes a breach's event on tx and counts it when it is the first of its
// window (written).
func (c *Commitments) write(ctx context.Context, tx *store.Store, b Breach) (written bool, err error) {
	ev, err := c.Events.Breach(b)
	if err != nil {
		return false, err
	}
	if written, err = WriteEvent(ctx, tx, ev); err != nil {
		return false, err
	}
	if written && c.breaches != nil {
		c.breaches.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(
			attribute.String("limit_type", b.LimitType), attribute.String("tenant_id", b.TenantID)))
	}
	return written, nil
}

// Expired runs after task t, which never started, ended expired at its start deadline
// (Subscriber's AfterCommit): when its plan's start commitment lapsed before the
// deadline, it writes the breach, in a transaction of its own on st, judged as at a
// start with the wait until the expiry. A deadline at or before the lapse is the
// tenant's own choice: no breach. Like a start, nothing here is retried: a wait that
// cannot be judged is not credited.
func (c *Commitments) Expired(ctx context.Context, st *store.Store, t store.Task) error {
	if t.StartedAt != nil || t.FinishedAt == nil {
		return nil
	}
	tenant, err := c.tenant(ctx, st, t.TenantID)
	if err != nil {
		return nil
	}
	sla, err := c.SLA(tenant)
	within, ok := quotas.Within(sla.StartWithinS)
	if err != nil || !ok {
		return nil
	}
	lapse := t.CreatedAt.Add(within)
	if measured := t.FinishedAt.Sub(t.CreatedAt); measured <= within || (t.StartDeadline != nil && !t.StartDeadline.After(lapse)) {
		return nil
	}
	return st.InTx(ctx, func(tx *store.Store) error {
		_, _, err := c.startBreach(ctx, tx, t, tenant.Plan, within, t.FinishedAt.Sub(t.CreatedAt), *t.FinishedAt)
		return err
	})
}
