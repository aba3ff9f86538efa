package outbox

import (
	"context"
	"math"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

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
// weighted share of it (quotas.Quotas.PoolWithinShare).
type PoolShares interface {
	PoolWithinShare(ctx context.Context, pool, tenant string, ask int64) (bool, error)
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
	c.breaches, _ = a.Meter("github.com/agentq/agentq/billing/outbox").Int64Counter("agentq.sla_breaches",
		metric.WithUnit("{breach}"),
		metric.WithDescription("Commitments of a plan the platform missed (eligible_breach events written), by limit_type and tenant"))
	return &c
}

// Started runs in the transaction that started task t (tasks.LifecycleOptions.Started)
// and writes there the usage.limit_hit of each commitment the start shows missed. A
// start within its commitments reads nothing but the (cached) tenant; the checks of
// the tenant's limits and share run only for a late one. Nothing here fails a start:
// a wait that cannot be judged (the tenant or Redis not answering) is not credited.
func (c *Commitments) Started(ctx context.Context, tx *store.Store, t store.Task) error {
	firstStart := t.Attempt == 1 && t.StartedAt != nil
	poolWait := t.Resumed != nil && strings.HasPrefix(t.Resumed.Reason, "pool:")
	if !firstStart && !poolWait {
		return nil
	}
	tenant, err := c.tenant(ctx, tx, t.TenantID)
	if err != nil {
		return nil
	}
	sla, err := c.SLA(tenant)
	if err != nil {
		return nil // a tenant whose plan is gone has no commitments to keep
	}
	if within, ok := quotas.Within(sla.StartWithinS); ok && firstStart {
		if measured := t.StartedAt.Sub(t.CreatedAt); measured > within {
			if _, err := c.startBreach(ctx, tx, t, tenant.Plan, within, measured, *t.StartedAt); err != nil {
				return err
			}
		}
	}
	if within, ok := quotas.Within(sla.PoolWaitWithinS); ok && poolWait {
		if measured := time.Duration(t.Resumed.WaitedMs) * time.Millisecond; measured > within {
			return c.poolBreach(ctx, tx, t, tenant.Plan, strings.TrimPrefix(t.Resumed.Reason, "pool:"), within, measured)
		}
	}
	return nil
}

// startBreach writes the breach of a first start (or a wait for it, at) later than
// committed unless the tenant's own running cap or demand held it (StartHolds).
func (c *Commitments) startBreach(ctx context.Context, tx *store.Store, t store.Task, plan string, committed, measured time.Duration,
	at time.Time) (bool, error) {
	now := time.Now()
	heldKey := t.TenantID + "|held"
	lapse := WindowStart(t.CreatedAt.Add(committed))
	writtenKey := t.TenantID + "|" + lapse.Format(time.RFC3339)
	if c.judged.fresh(heldKey, now) || c.judged.fresh(writtenKey, now) {
		return false, nil
	}
	if c.Starts != nil {
		// The tenant's started tasks (this one included, at a start) as the
		// transaction sees them: its running set in Redis also holds tasks handed to
		// the workers ahead of time (prefetched), which are not its use of the pool.
		started, err := tx.CountTasks(ctx, store.CountTasksParams{TenantID: t.TenantID, State: store.StateRunning})
		if err != nil {
			return false, nil
		}
		if held, err := c.Starts.HeldBack(ctx, t.TenantID, t.CreatedAt, int64(started)); err != nil || held {
			if held {
				c.judged.note(heldKey, now.Add(heldFor))
			}
			return false, nil
		}
	}
	written, err := c.write(ctx, tx, Breach{TenantID: t.TenantID, Plan: plan, LimitType: LimitSLAStart,
		Committed: committed, Measured: measured, At: at})
	if err == nil {
		// Written now or before: the lapse minute has its event.
		c.judged.note(writtenKey, lapse.Add(DedupeWindow+time.Minute))
	}
	return written, err
}

// Waiting writes the breaches of tasks still waiting for their first start past their
// plan's start_within_s (at most limit, the oldest), without waiting for the start:
// the janitor runs it periodically. Each is written in a transaction of its own and
// judged as at a start (StartHolds, with the wait so far); the start writes nothing
// more for the same lapse (Breach's window). It returns how many tasks it looked at
// and how many events it wrote.
func (c *Commitments) Waiting(ctx context.Context, st *store.Store, limit int) (checked, written int, err error) {
	ts, err := st.UnscopedFirstStartsWaiting(ctx, limit)
	if err != nil {
		return 0, 0, err
	}
	now := time.Now()
	for _, t := range ts {
		tenant, err := c.tenant(ctx, st, t.TenantID)
		if err != nil {
			continue
		}
		sla, err := c.SLA(tenant)
		within, ok := quotas.Within(sla.StartWithinS)
		if err != nil || !ok || now.Sub(t.CreatedAt) <= within {
			continue
		}
		var wrote bool
		err = st.InTx(ctx, func(tx *store.Store) error {
			var err error
			wrote, err = c.startBreach(ctx, tx, t, tenant.Plan, within, now.Sub(t.CreatedAt), now)
			return err
		})
		if err != nil {
			return len(ts), written, err
		}
		if wrote {
			written++
		}
	}
	return len(ts), written, nil
}

// poolBreach writes the breach of a pool wait longer than committed unless the tenant
// had drawn more than its share of the pool.
func (c *Commitments) poolBreach(ctx context.Context, tx *store.Store, t store.Task, plan, pool string, committed, measured time.Duration) error {
	if c.Pools != nil {
		var ask int64
		if t.Wait.StepEstimate != nil {
			ask = *t.Wait.StepEstimate
		}
		if within, err := c.Pools.PoolWithinShare(ctx, pool, t.TenantID, ask); err != nil || !within {
			return nil // over its share, or not judged (Redis not answering): not credited
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
