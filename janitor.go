package agentq

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/wire"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/scheduler"
)

// Janitor reconciles Redis with Postgres, the system of record, so that crashes and
// Redis data loss lose no accepted task and leak no lease. One replica runs it at a
// time: the one holding a Postgres advisory lock (a session lock, so it is released
// the moment the holder's connection dies, and another replica takes over at its next
// tick). Each run is bounded in time and batch size.
type Janitor struct {
	store     *store.Store
	pool      *pgxpool.Pool
	sched     *scheduler.Scheduler
	quotas    *quotas.Quotas
	recovery  *recovery
	rdb       redis.UniversalClient
	inspector *asynq.Inspector
	keys      rkeys.Keys
	log       *slog.Logger

	every       time.Duration // between runs
	staleAfter  time.Duration // a running task with an older heartbeat lost its worker
	maxAttempts int           // attempts before a task whose worker keeps dying is abandoned
	budget      time.Duration // one run's time bound
	batch       int           // stale tasks handled per run

	drift metric.Int64Counter

	mu       sync.Mutex
	cancel   context.CancelFunc
	done     chan struct{}
	leader   *pgxpool.Conn
	lockID   int64
	isLeader bool
	haltOnly bool // halted as if crashed: do not unlock on the way out
	// leaderSince: a new leader (often right after a Postgres outage) waits one
	// staleness period before re-queueing stale tasks, so live workers can stamp their
	// heartbeats again first.
	leaderSince time.Time
}

// JanitorReport says what one run found and fixed, per kind of drift.
type JanitorReport struct {
	StaleRequeued   int   `json:"stale_requeued"`
	Abandoned       int   `json:"abandoned"`
	Repushed        int   `json:"repushed"`
	LeasesReleased  int   `json:"leases_released"`
	LeasesAdded     int   `json:"leases_added"`
	RunningRemoved  int   `json:"running_removed"`
	RunningAdded    int   `json:"running_added"`
	PoolCorrected   int64 `json:"pool_corrected"`
	RedisDataLoss   bool  `json:"redis_data_loss"`
	StaleDeferred   bool  `json:"stale_deferred"` // a new leader skipped stale tasks this run
	TenantsReviewed int   `json:"tenants_reviewed"`
}

func (r JanitorReport) drifted() bool {
	return r.StaleRequeued+r.Abandoned+r.Repushed+r.LeasesReleased+r.LeasesAdded+r.RunningRemoved+r.RunningAdded > 0 ||
		r.PoolCorrected != 0 || r.RedisDataLoss
}

func newJanitor(a *App, every time.Duration) *Janitor {
	j := &Janitor{
		store: a.Store, pool: a.Store.Pool(), sched: a.Scheduler, quotas: a.Quotas, recovery: a.recovery,
		rdb: a.Redis, inspector: asynq.NewInspectorFromRedisClient(a.Redis), keys: a.Keys, log: a.log.With("component", "janitor"),
		every: every, staleAfter: 30 * time.Second, maxAttempts: 3, budget: 30 * time.Second, batch: 500,
	}
	if j.every <= 0 {
		j.every = 5 * time.Minute
	}
	j.drift, _ = otel.Meter("agentq").Int64Counter("agentq.janitor.drift",
		metric.WithDescription("Redis state the janitor found out of line with Postgres, by kind"))
	return j
}

// Start runs the janitor loop until Stop: every tick it tries to lead; the leader
// checks the Redis generation marker every second (data loss is repaired at once) and
// runs a full reconciliation every interval.
func (j *Janitor) Start(ctx context.Context) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.cancel != nil {
		return
	}
	ctx, j.cancel = context.WithCancel(ctx)
	j.done = make(chan struct{})
	go func() {
		defer close(j.done)
		defer j.resign()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		next := time.Now()
		for {
			if j.lead(ctx) {
				lost, err := j.checkGeneration(ctx)
				if err != nil && ctx.Err() == nil {
					j.log.Warn("generation check failed", "err", err)
				}
				if lost || !time.Now().Before(next) {
					rep, err := j.RunOnce(ctx)
					if err != nil && ctx.Err() == nil {
						j.log.Warn("janitor run failed", "err", err)
					} else if lost {
						rep.RedisDataLoss = true
						j.log.Warn("Redis lost its data: reconciled from Postgres", "report", rep)
					}
					next = time.Now().Add(j.every)
					if rep.StaleDeferred {
						// come back as soon as stale tasks may be handled
						j.mu.Lock()
						if soon := j.leaderSince.Add(j.staleAfter + time.Second); soon.Before(next) {
							next = soon
						}
						j.mu.Unlock()
					}
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}

// Stop ends the loop and gives up leadership.
func (j *Janitor) Stop() {
	j.mu.Lock()
	cancel, done := j.cancel, j.done
	j.cancel = nil
	j.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// halt stops the loop the way a crash would: no unlock, the session just ends (and
// Postgres frees the lock with it). Tests use it to kill a leader.
func (j *Janitor) halt() {
	j.mu.Lock()
	cancel, done := j.cancel, j.done
	j.cancel = nil
	j.haltOnly = true
	j.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// Leader reports whether this replica holds the janitor lock.
func (j *Janitor) Leader() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.isLeader
}

func (j *Janitor) lockKey(ctx context.Context) int64 {
	if j.lockID == 0 {
		var schema string
		if err := j.pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
			return 0 // not cached: the next tick asks again
		}
		h := fnv.New64a()
		h.Write([]byte("agentq-janitor:" + schema + ":" + j.keys.Prefix()))
		j.lockID = int64(h.Sum64() >> 1)
	}
	return j.lockID
}

// lead keeps or takes the advisory lock. The lock lives with its connection: if that
// connection broke (Postgres restarted), leadership is gone and is taken again.
func (j *Janitor) lead(ctx context.Context) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if j.leader != nil {
		if _, err := j.leader.Exec(cctx, `SELECT 1`); err == nil {
			return true
		}
		j.leader.Conn().Close(context.Background())
		j.leader.Release()
		j.leader, j.isLeader = nil, false
		j.log.Warn("janitor lost its lock connection; leadership given up")
	}
	conn, err := j.pool.Acquire(cctx)
	if err != nil {
		return false
	}
	var ok bool
	key := j.lockKey(cctx)
	if key == 0 {
		conn.Release()
		return false
	}
	if err := conn.QueryRow(cctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&ok); err != nil || !ok {
		conn.Release()
		return false
	}
	j.leader, j.isLeader = conn, true
	j.leaderSince = time.Now()
	j.log.Info("janitor leadership taken")
	return true
}

func (j *Janitor) resign() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.leader == nil {
		return
	}
	if j.haltOnly {
		// a crash: the session just ends, and Postgres frees the lock with it
		j.leader.Conn().Close(context.Background())
		j.leader.Release()
		j.leader, j.isLeader = nil, false
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = j.leader.Exec(ctx, `SELECT pg_advisory_unlock($1)`, j.lockID)
	j.leader.Release()
	j.leader, j.isLeader = nil, false
}

// checkGeneration detects Redis data loss: the marker key is set by the leader and
// vanishes with a FLUSHDB or a restart without persistence.
func (j *Janitor) checkGeneration(ctx context.Context) (bool, error) {
	key := j.keys.Generation()
	ok, err := j.rdb.SetNX(ctx, key, time.Now().UTC().Format(time.RFC3339), 0).Result()
	if err != nil {
		return false, err
	}
	j.rdb.Expire(ctx, key, 30*24*time.Hour)
	if !ok {
		return false, nil
	}
	// Newly set: either the first run on this Redis, or its data is gone. Either way a
	// reconciliation is what to do.
	return true, nil
}

// RunOnce reconciles Redis with Postgres once and reports the drift it fixed.
func (j *Janitor) RunOnce(ctx context.Context) (JanitorReport, error) {
	var rep JanitorReport
	ctx, cancel := context.WithTimeout(ctx, j.budget)
	defer cancel()
	j.mu.Lock()
	settled := time.Since(j.leaderSince) >= j.staleAfter
	j.mu.Unlock()
	if settled {
		if err := j.rescueStale(ctx, &rep); err != nil {
			return rep, fmt.Errorf("janitor: stale tasks: %w", err)
		}
	} else {
		rep.StaleDeferred = true
	}
	tenants, err := j.store.TenantsWithLiveTasks(ctx)
	if err != nil {
		return rep, fmt.Errorf("janitor: tenants: %w", err)
	}
	for _, t := range tenants {
		if ctx.Err() != nil {
			break // bounded: the next run continues
		}
		if err := j.reconcileTenant(ctx, t, &rep); err != nil {
			j.log.Warn("reconciling a tenant failed", "tenant_id", t, "err", err)
		}
		rep.TenantsReviewed++
	}
	if err := j.reconcileLeaks(ctx, &rep); err != nil {
		j.log.Warn("reconciling leases of ended tasks failed", "err", err)
	}
	pushed, err := j.recovery.sweep(ctx, 0)
	rep.Repushed += pushed
	if err != nil {
		return rep, fmt.Errorf("janitor: re-push: %w", err)
	}
	if rep.PoolCorrected, err = j.sched.ReconcilePool(ctx); err != nil {
		return rep, fmt.Errorf("janitor: pool: %w", err)
	}
	j.record(ctx, rep)
	return rep, nil
}

func (j *Janitor) record(ctx context.Context, rep JanitorReport) {
	for kind, n := range map[string]int64{
		"stale_requeued": int64(rep.StaleRequeued), "abandoned": int64(rep.Abandoned), "repushed": int64(rep.Repushed),
		"leases_released": int64(rep.LeasesReleased), "leases_added": int64(rep.LeasesAdded),
		"running_removed": int64(rep.RunningRemoved), "running_added": int64(rep.RunningAdded), "pool": abs64(rep.PoolCorrected),
	} {
		if n > 0 {
			j.drift.Add(ctx, n, metric.WithAttributes(attribute.String("kind", kind)))
		}
	}
	if rep.drifted() {
		j.log.Warn("janitor fixed drift between Redis and Postgres", "stale_requeued", rep.StaleRequeued,
			"abandoned", rep.Abandoned, "repushed", rep.Repushed, "leases_released", rep.LeasesReleased,
			"leases_added", rep.LeasesAdded, "running_removed", rep.RunningRemoved, "running_added", rep.RunningAdded,
			"pool_corrected", rep.PoolCorrected)
	}
}

func abs64(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// rescueStale handles running tasks whose worker stopped heartbeating: back to the
// queue for another attempt, or abandoned after maxAttempts.
func (j *Janitor) rescueStale(ctx context.Context, rep *JanitorReport) error {
	stale, err := j.store.ListStaleRunning(ctx, j.staleAfter, j.batch)
	if err != nil {
		return err
	}
	for _, st := range stale {
		id := st.ID.String()
		// its dispatch slots are gone with its worker
		cleanup := wire.Payload{TaskID: id, TenantID: st.TenantID, Band: fmt.Sprintf("p%d", st.Priority)}
		if st.Attempt >= j.maxAttempts {
			_, ok, err := j.store.FinishTask(ctx, store.FinishTaskParams{ID: st.ID, From: []string{store.StateRunning},
				To: store.StateAbandoned, Error: fmt.Sprintf("abandoned: its worker stopped heartbeating on %d attempts", st.Attempt)})
			if err != nil {
				return err
			}
			if ok {
				rep.Abandoned++
				if _, err := j.quotas.Release(ctx, st.TenantID, id); err != nil {
					return err
				}
				_ = j.sched.Done(ctx, cleanup, -1)
			}
			continue
		}
		t, ok, err := j.store.RequeueStale(ctx, st.ID, j.staleAfter)
		if err != nil || !ok {
			if err != nil {
				return err
			}
			continue
		}
		rep.StaleRequeued++
		_ = j.sched.Done(ctx, cleanup, -1)
		p, err := j.recovery.tenantParams(ctx, t.TenantID)
		if err != nil {
			return err
		}
		p.TaskID, p.Priority, p.CreatedAt = t.ID, t.Priority, t.CreatedAt
		if err := j.sched.Enqueue(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// reconcileTenant compares a tenant's leases and running set with its live tasks.
func (j *Janitor) reconcileTenant(ctx context.Context, tenant string, rep *JanitorReport) error {
	live, err := j.store.LiveTasks(ctx, tenant)
	if err != nil {
		return err
	}
	byID := make(map[string]store.LiveTask, len(live))
	for _, t := range live {
		byID[t.ID.String()] = t
	}
	if err := j.releaseEnded(ctx, tenant, byID, rep); err != nil {
		return err
	}
	sessions, long, err := j.quotas.Leases(ctx, tenant)
	if err != nil {
		return err
	}
	held := map[string]bool{}
	for _, m := range append(sessions, long...) {
		held[m] = true
	}
	// Leases live 6 h from admission or their last refresh; a running task's worker
	// refreshes its own, queued tasks' leases are refreshed here.
	var queued []string
	for id, t := range byID {
		if held[id] && t.State == store.StateQueued {
			queued = append(queued, id)
		}
	}
	if _, err := j.quotas.TouchLeases(ctx, tenant, queued); err != nil {
		return err
	}
	var added []uuid.UUID
	for id, t := range byID {
		if !held[id] {
			if err := j.quotas.AddLease(ctx, tenant, id, t.MaxWallclockS > quotas.LongRunningThreshold.Seconds()); err != nil {
				return err
			}
			added = append(added, t.ID)
		}
	}
	// A task may have ended (and released its lease) between the Postgres read and the
	// lease read: give back any re-added lease whose task is no longer live.
	if len(added) > 0 {
		states, err := j.store.TaskStates(ctx, added)
		if err != nil {
			return err
		}
		for _, id := range added {
			if store.Terminal(states[id]) {
				_, _ = j.quotas.Release(ctx, tenant, id.String())
			} else {
				rep.LeasesAdded++
			}
		}
	}
	members, err := j.sched.RunningMembers(ctx, tenant)
	if err != nil {
		return err
	}
	inSet := map[string]bool{}
	for _, m := range members {
		inSet[m] = true
	}
	if err := j.dropEndedRunning(ctx, tenant, members, byID, rep); err != nil {
		return err
	}
	// Dispatched, never started, and lost to asynq: free its slots and queue it again.
	for id, t := range byID {
		if t.State != store.StateQueued || !inSet[id] {
			continue
		}
		stranded, err := j.sched.Stranded(ctx, j.inspector, tenant, id, t.Priority, j.staleAfter)
		if err != nil || !stranded {
			continue
		}
		_ = j.sched.Done(ctx, wire.Payload{TaskID: id, TenantID: tenant, Band: fmt.Sprintf("p%d", t.Priority)}, -1)
		p, err := j.recovery.tenantParams(ctx, tenant)
		if err != nil {
			return err
		}
		p.TaskID, p.Priority, p.CreatedAt = t.ID, t.Priority, t.CreatedAt
		if err := j.sched.Enqueue(ctx, p); err != nil {
			return err
		}
		rep.Repushed++
	}
	var readded []uuid.UUID
	for id, t := range byID {
		if t.State == store.StateRunning && !inSet[id] {
			if err := j.sched.AddRunning(ctx, tenant, id); err != nil {
				return err
			}
			readded = append(readded, t.ID)
		}
	}
	// As with leases: a task that ended meanwhile must not keep a running slot.
	if len(readded) > 0 {
		states, err := j.store.TaskStates(ctx, readded)
		if err != nil {
			return err
		}
		for _, id := range readded {
			if store.Terminal(states[id]) {
				_ = j.sched.Done(ctx, wire.Payload{TaskID: id.String(), TenantID: tenant, Band: "p5"}, -1)
			} else {
				rep.RunningAdded++
			}
		}
	}
	return nil
}

// leaseGrace is how old a lease of a task Postgres does not know must be before it is
// released: admission takes the lease just before the task row is committed.
const leaseGrace = time.Minute

// releaseEnded releases leases of tasks that ended, and of tasks Postgres does not know
// once they are older than leaseGrace. Leases of open event streams ("stream:…") are
// not tasks; they expire on their own within a minute of their stream's end.
func (j *Janitor) releaseEnded(ctx context.Context, tenant string, live map[string]store.LiveTask, rep *JanitorReport) error {
	sessions, long, err := j.quotas.LeaseAges(ctx, tenant)
	if err != nil {
		return err
	}
	ages := map[string]time.Duration{}
	for m, a := range sessions {
		ages[m] = a
	}
	for m, a := range long {
		ages[m] = max(ages[m], a)
	}
	var check []uuid.UUID
	for m := range ages {
		if _, ok := live[m]; ok || strings.HasPrefix(m, "stream:") {
			continue
		}
		if id, err := uuid.Parse(m); err == nil {
			check = append(check, id)
		}
	}
	if len(check) == 0 {
		return nil
	}
	states, err := j.store.TaskStates(ctx, check)
	if err != nil {
		return err
	}
	for _, id := range check {
		st, known := states[id]
		if known && !store.Terminal(st) {
			continue // became live after the caller's read
		}
		if !known && ages[id.String()] < leaseGrace {
			continue // maybe an admission still writing its task
		}
		n, err := j.quotas.Release(ctx, tenant, id.String())
		if err != nil {
			return err
		}
		rep.LeasesReleased += n
	}
	return nil
}

// dropEndedRunning frees running-set entries (and their pool slots) of tasks that
// ended or that Postgres does not know.
func (j *Janitor) dropEndedRunning(ctx context.Context, tenant string, members []string, live map[string]store.LiveTask, rep *JanitorReport) error {
	var check []uuid.UUID
	for _, m := range members {
		if _, ok := live[m]; ok {
			continue
		}
		if id, err := uuid.Parse(m); err == nil {
			check = append(check, id)
		}
	}
	if len(check) == 0 {
		return nil
	}
	for _, id := range check {
		if err := j.sched.Done(ctx, wire.Payload{TaskID: id.String(), TenantID: tenant, Band: "p5"}, -1); err != nil {
			return err
		}
		rep.RunningRemoved++
	}
	return nil
}

// reconcileLeaks releases leases of tenants that have no live task at all (their
// tasks ended while the release was lost), found among tenants that hold leases.
func (j *Janitor) reconcileLeaks(ctx context.Context, rep *JanitorReport) error {
	tenants, err := j.store.ListTenants(ctx)
	if err != nil {
		return err
	}
	liveTenants, err := j.store.TenantsWithLiveTasks(ctx)
	if err != nil {
		return err
	}
	hasLive := map[string]bool{}
	for _, t := range liveTenants {
		hasLive[t] = true
	}
	for _, t := range tenants {
		if hasLive[t.ID] || ctx.Err() != nil {
			continue
		}
		if err := j.releaseEnded(ctx, t.ID, nil, rep); err != nil {
			return err
		}
		members, err := j.sched.RunningMembers(ctx, t.ID)
		if err != nil {
			return err
		}
		if err := j.dropEndedRunning(ctx, t.ID, members, nil, rep); err != nil {
			return err
		}
	}
	return nil
}
