package maintenance

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/riverqueue/river/rivershared/startstop"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/wire"
	"github.com/agentq/agentq/quotas"
)

// Janitor reconciles Redis with Postgres, the system of record, so that crashes and
// Redis data loss lose no accepted task and leak no lease. One replica runs it at a
// time: the one holding a Postgres advisory lock (a session lock, so it is released
// the moment the holder's connection dies, and another replica takes over at its next
// tick). A run is a sequence of passes (stale heartbeats, leases, running sets,
// re-push of missing queued tasks, pool correction), each bounded by its own time and
// row budget, so one slow pass never starves the others; the passes that walk tenants
// or tasks keep a cursor and resume where the previous run stopped.
type Janitor struct {
	startstop.BaseStartStop

	store     Store
	pool      *pgxpool.Pool
	sched     Scheduler
	quotas    Quotas
	recovery  *Recovery
	rdb       redis.UniversalClient
	inspector *asynq.Inspector
	keys      rkeys.Keys
	log       *slog.Logger

	cfg JanitorConfig

	drift metric.Int64Counter

	// runMu serialises runs; the cursors below are where the next run resumes.
	runMu         sync.Mutex
	leaseCursor   string    // last tenant id the lease pass reviewed
	runningCursor string    // last tenant id the running-set pass reviewed
	repushCursor  uuid.UUID // last queued task the re-push pass checked
	// afterSnapshot, when set (TestHooks), runs after a tenant pass read a page's live
	// tasks and before it reads Redis: what happens there races the pass.
	afterSnapshot func(pass string)

	mu       sync.Mutex
	leader   *pgxpool.Conn
	lockID   int64
	isLeader bool
	haltOnly bool // halted as if crashed: do not unlock on the way out
	// leaderSince: a new leader (often right after a Postgres outage) waits one
	// staleness period before re-queueing stale tasks, so live workers can stamp their
	// heartbeats again first.
	leaderSince time.Time
}

// JanitorConfig configures the janitor. Zero fields take the defaults.
type JanitorConfig struct {
	Interval    time.Duration // between runs (5 min)
	StaleAfter  time.Duration // a running task with an older heartbeat lost its worker (30 s)
	MaxAttempts int           // attempts before a task whose worker keeps dying is abandoned (3)
	PassBudget  time.Duration // each pass's time bound (5 s)
	StaleBatch  int           // stale tasks handled per run (500)
	TenantBatch int           // tenants each tenant pass reviews per run (50,000)
	TenantPage  int           // tenants read per round trip (200)
	RepushBatch int           // queued tasks the re-push pass checks per run (10,000)
}

func (c JanitorConfig) withDefaults() JanitorConfig {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	dur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	dur(&c.Interval, 5*time.Minute)
	dur(&c.StaleAfter, 30*time.Second)
	dur(&c.PassBudget, 5*time.Second)
	def(&c.MaxAttempts, 3)
	def(&c.StaleBatch, 500)
	def(&c.TenantBatch, 50000)
	def(&c.TenantPage, 200)
	def(&c.RepushBatch, 10000)
	c.TenantPage = min(c.TenantPage, c.TenantBatch)
	return c
}

// Pass names, in the order a run takes them.
const (
	passStale   = "stale_heartbeats"
	passLeases  = "leases"
	passRunning = "running_sets"
	passRepush  = "repush"
	passPool    = "pool"
)

// JanitorPass says how one pass of a run went.
type JanitorPass struct {
	Name string        `json:"name"`
	Rows int           `json:"rows"` // tenants, tasks or shards it looked at
	Took time.Duration `json:"took"`
	// Done: the pass reached the end of its work; otherwise it stopped at its budget
	// and the next run resumes from Cursor.
	Done   bool   `json:"done"`
	Cursor string `json:"cursor,omitempty"`
	Err    string `json:"err,omitempty"`
}

// JanitorReport says what one run found and fixed, per kind of drift, and how each
// pass went.
type JanitorReport struct {
	StaleRequeued   int           `json:"stale_requeued"`
	Abandoned       int           `json:"abandoned"`
	Repushed        int           `json:"repushed"`
	LeasesReleased  int           `json:"leases_released"`
	LeasesAdded     int           `json:"leases_added"`
	RunningRemoved  int           `json:"running_removed"`
	RunningAdded    int           `json:"running_added"`
	PoolCorrected   int64         `json:"pool_corrected"`
	RedisDataLoss   bool          `json:"redis_data_loss"`
	StaleDeferred   bool          `json:"stale_deferred"` // a new leader skipped stale tasks this run
	TenantsReviewed int           `json:"tenants_reviewed"`
	Passes          []JanitorPass `json:"passes"`
}

// complete reports whether every pass reached the end of its work.
func (r JanitorReport) complete() bool {
	for _, p := range r.Passes {
		if !p.Done {
			return false
		}
	}
	return len(r.Passes) > 0
}

func (r JanitorReport) drifted() bool {
	return r.StaleRequeued+r.Abandoned+r.Repushed+r.LeasesReleased+r.LeasesAdded+r.RunningRemoved+r.RunningAdded > 0 ||
		r.PoolCorrected != 0 || r.RedisDataLoss
}

// NewJanitor builds a janitor. Nothing runs until Start; RunOnce runs one pass of
// each kind without leading.
func NewJanitor(d Deps, c JanitorConfig) *Janitor {
	j := &Janitor{
		store: d.Store, pool: d.Pool, sched: d.Scheduler, quotas: d.Quotas, recovery: NewRecovery(d, RecoveryConfig{}),
		rdb: d.Redis, inspector: asynq.NewInspectorFromRedisClient(d.Redis), keys: d.Keys, log: d.logger().With("component", "janitor"),
		cfg: c.withDefaults(),
	}
	j.drift, _ = otel.Meter("agentq").Int64Counter("agentq.janitor.drift",
		metric.WithDescription("Redis state the janitor found out of line with Postgres, by kind"))
	return j
}

// Start runs the janitor loop until Stop: every tick it tries to lead; the leader
// checks the Redis generation marker every second (data loss is repaired at once) and
// runs a full reconciliation every interval.
func (j *Janitor) Start(ctx context.Context) error {
	ctx, shouldStart, started, stopped := j.StartInit(ctx)
	if !shouldStart {
		return nil
	}
	go func() {
		started()
		defer stopped()
		defer j.resign()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		next := time.Now()
		var repair generation // a new marker whose reconciliation has not finished yet
		for {
			if j.lead(ctx) {
				gen, err := j.checkGeneration(ctx)
				if err != nil && ctx.Err() == nil {
					j.log.Warn("generation check failed", "err", err)
				}
				if gen != genSame {
					// Review everything from the start, now.
					repair, next = gen, time.Now()
					j.resetCursors()
				}
				if !time.Now().Before(next) {
					rep, err := j.RunOnce(ctx)
					done := err == nil && rep.complete()
					switch {
					case err != nil && ctx.Err() == nil:
						j.log.Warn("janitor run failed", "err", err)
					case repair == genLost && done:
						rep.RedisDataLoss = true
						j.log.Warn("Redis lost its data: reconciled from Postgres", "report", rep)
					case repair == genFirst && done:
						j.log.Info("first start on this Redis: generation marker written", "report", rep)
					}
					next = time.Now().Add(j.cfg.Interval)
					if repair != genSame {
						if done {
							repair = genSame
						} else {
							// A repair runs back to back until every pass reached its
							// end; a failing run is retried a little later.
							wait := time.Second
							if err != nil {
								wait = 5 * time.Second
							}
							next = time.Now().Add(wait)
						}
					}
					if rep.StaleDeferred {
						// come back as soon as stale tasks may be handled
						j.mu.Lock()
						if soon := j.leaderSince.Add(j.cfg.StaleAfter + time.Second); soon.Before(next) {
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
	return nil
}

// TestHooks reach into a janitor at points a test cannot otherwise reach: crashing a
// leader, changing the budgets between runs, acting between a pass's two reads.
type TestHooks struct{ j *Janitor }

// TestHooks returns the janitor's hooks for tests.
func (j *Janitor) TestHooks() TestHooks { return TestHooks{j} }

// Halt stops the loop the way a crash would: no unlock, the session just ends (and
// Postgres frees the lock with it).
func (h TestHooks) Halt() { h.j.halt() }

// SetConfig replaces the janitor's configuration (defaults fill zero fields); the
// passes' cursors stay where they are.
func (h TestHooks) SetConfig(c JanitorConfig) {
	h.j.runMu.Lock()
	defer h.j.runMu.Unlock()
	h.j.cfg = c.withDefaults()
}

// AfterSnapshot sets a hook run between a tenant pass's Postgres read and its Redis
// read: what it does races the pass.
func (h TestHooks) AfterSnapshot(f func(pass string)) {
	h.j.runMu.Lock()
	defer h.j.runMu.Unlock()
	h.j.afterSnapshot = f
}

func (j *Janitor) halt() {
	j.mu.Lock()
	j.haltOnly = true
	j.mu.Unlock()
	j.Stop()
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

// generation is what the Redis generation marker says about Redis's state.
type generation int

const (
	genSame  generation = iota // the marker was there: nothing lost
	genFirst                   // newly set on a database that never had a task: a first start
	genLost                    // newly set although Postgres holds tasks: Redis lost its data
)

// checkGeneration detects Redis data loss: the marker key is set by the leader and
// vanishes with a FLUSHDB or a restart without persistence. A missing marker on a
// database that never admitted a task is a first start, not a loss.
func (j *Janitor) checkGeneration(ctx context.Context) (generation, error) {
	key := j.keys.Generation()
	ok, err := j.rdb.SetNX(ctx, key, time.Now().UTC().Format(time.RFC3339), 0).Result()
	if err != nil {
		return genSame, err
	}
	j.rdb.Expire(ctx, key, 30*24*time.Hour)
	if !ok {
		return genSame, nil
	}
	// Newly set: a reconciliation is what to do either way; the log line differs.
	hadTasks, err := j.store.AnyTask(ctx)
	if err != nil {
		return genLost, err // cannot tell: treat it as the loss it may be
	}
	if !hadTasks {
		return genFirst, nil
	}
	return genLost, nil
}

// resetCursors makes the next run's passes start from the first tenant and task.
func (j *Janitor) resetCursors() {
	j.runMu.Lock()
	defer j.runMu.Unlock()
	j.leaseCursor, j.runningCursor, j.repushCursor = "", "", uuid.Nil
}

// RunOnce reconciles Redis with Postgres once and reports the drift it fixed. Every
// pass runs, each within its own budget; a pass that fails does not stop the others,
// and the run returns their errors together.
func (j *Janitor) RunOnce(ctx context.Context) (JanitorReport, error) {
	j.runMu.Lock()
	defer j.runMu.Unlock()
	var rep JanitorReport
	var errs []error
	run := func(name string, pass func(ctx context.Context, p *JanitorPass) error) {
		pctx, cancel := context.WithTimeout(ctx, j.cfg.PassBudget)
		defer cancel()
		p := JanitorPass{Name: name}
		began := time.Now()
		err := pass(pctx, &p)
		p.Took = time.Since(began)
		if err != nil && pctx.Err() != nil && ctx.Err() == nil {
			err = nil // out of budget: the next run resumes from the cursor
		}
		if err != nil {
			p.Err = err.Error()
			errs = append(errs, fmt.Errorf("janitor: %s: %w", name, err))
		}
		rep.Passes = append(rep.Passes, p)
	}
	run(passStale, func(ctx context.Context, p *JanitorPass) error {
		j.mu.Lock()
		settled := time.Since(j.leaderSince) >= j.cfg.StaleAfter
		j.mu.Unlock()
		if !settled {
			rep.StaleDeferred, p.Done = true, true
			return nil
		}
		return j.rescueStale(ctx, &rep, p)
	})
	run(passLeases, func(ctx context.Context, p *JanitorPass) error {
		err := j.tenantPass(ctx, &j.leaseCursor, p, &rep, j.reviewLeases)
		rep.TenantsReviewed = p.Rows
		return err
	})
	run(passRunning, func(ctx context.Context, p *JanitorPass) error {
		return j.tenantPass(ctx, &j.runningCursor, p, &rep, j.reviewRunning)
	})
	run(passRepush, func(ctx context.Context, p *JanitorPass) error {
		pushed, seen, next, err := j.recovery.sweepFrom(ctx, 0, j.repushCursor, j.cfg.RepushBatch)
		rep.Repushed += pushed
		p.Rows, j.repushCursor = seen, next
		p.Done = next == uuid.Nil && err == nil
		if next != uuid.Nil {
			p.Cursor = next.String()
		}
		return err
	})
	run(passPool, func(ctx context.Context, p *JanitorPass) error {
		var err error
		rep.PoolCorrected, err = j.sched.ReconcilePool(ctx)
		p.Rows, p.Done = j.keys.Shards(), err == nil
		return err
	})
	j.record(ctx, rep)
	return rep, errors.Join(errs...)
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
// queue for another attempt, or abandoned after MaxAttempts.
func (j *Janitor) rescueStale(ctx context.Context, rep *JanitorReport, p *JanitorPass) error {
	stale, err := j.store.ListStaleRunning(ctx, j.cfg.StaleAfter, j.cfg.StaleBatch)
	if err != nil {
		return err
	}
	for _, st := range stale {
		p.Rows++
		id := st.ID.String()
		// its dispatch slots are gone with its worker
		cleanup := wire.Payload{TaskID: id, TenantID: st.TenantID, Priority: st.Priority}
		if st.Attempt >= j.cfg.MaxAttempts {
			// Fenced on the attempt read: a redelivery that took the task over since
			// keeps it.
			_, ok, err := j.store.FinishTask(ctx, store.FinishTaskParams{ID: st.ID, Attempt: st.Attempt, From: []string{store.StateRunning},
				To: store.StateAbandoned, Error: fmt.Sprintf("abandoned: its worker stopped heartbeating on %d attempts", st.Attempt)})
			if errors.Is(err, store.ErrLostClaim) {
				continue
			}
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
		t, ok, err := j.store.RequeueStale(ctx, st.ID, j.cfg.StaleAfter)
		if err != nil || !ok {
			if err != nil {
				return err
			}
			continue
		}
		rep.StaleRequeued++
		_ = j.sched.Done(ctx, cleanup, -1)
		ep, err := j.recovery.tenantParams(ctx, t.TenantID)
		if err != nil {
			return err
		}
		ep.TaskID, ep.Priority, ep.CreatedAt = t.ID, t.Priority, t.CreatedAt
		if err := j.sched.Enqueue(ctx, ep); err != nil {
			return err
		}
	}
	p.Done = len(stale) < j.cfg.StaleBatch
	return nil
}

// tenantReview reconciles one page of tenants, given their live tasks read from
// Postgres in one query.
type tenantReview func(ctx context.Context, tenants []string, live map[string][]store.LiveTask, rep *JanitorReport) error

// tenantPass walks tenants in id order from *cursor, a page per round trip, until it
// has reviewed TenantBatch tenants, its budget runs out or it reaches the last tenant
// (the cursor then wraps to the start for the next run).
func (j *Janitor) tenantPass(ctx context.Context, cursor *string, p *JanitorPass, rep *JanitorReport, review tenantReview) error {
	defer func() { p.Cursor = *cursor }()
	for p.Rows < j.cfg.TenantBatch {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(j.cfg.TenantPage, j.cfg.TenantBatch-p.Rows)
		ids, err := j.store.TenantIDsAfter(ctx, *cursor, n)
		if err != nil {
			return err
		}
		if len(ids) > 0 {
			live, err := j.store.LiveTasksOf(ctx, ids)
			if err != nil {
				return err
			}
			if j.afterSnapshot != nil {
				j.afterSnapshot(p.Name)
			}
			if err := review(ctx, ids, live, rep); err != nil {
				return err
			}
			p.Rows += len(ids)
			*cursor = ids[len(ids)-1]
		}
		if len(ids) < n {
			*cursor, p.Done = "", true
			return nil
		}
	}
	return nil
}

// leaseGrace is how old a lease of a task Postgres does not know must be before it is
// released: admission takes the lease just before the task row is committed.
const leaseGrace = time.Minute

// reviewLeases compares a page of tenants' session and long-running leases with their
// live tasks: it releases leases of tasks that ended (and of tasks Postgres does not
// know, once older than leaseGrace) and re-adds the leases of live tasks that Redis
// lost, and pushes the leases of queued tasks forward. One Redis round trip reads the
// whole page.
func (j *Janitor) reviewLeases(ctx context.Context, tenants []string, live map[string][]store.LiveTask, rep *JanitorReport) error {
	pipe := j.rdb.Pipeline()
	sess := make([]*redis.StringSliceCmd, len(tenants))
	long := make([]*redis.StringSliceCmd, len(tenants))
	for i, t := range tenants {
		sess[i] = pipe.ZRange(ctx, j.keys.Sessions(t), 0, -1)
		long[i] = pipe.ZRange(ctx, j.keys.LongRunning(t), 0, -1)
	}
	if _, err := pipe.Exec(ctx); err != nil {
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
		for _, m := range append(sess[i].Val(), long[i].Val()...) {
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
			if held[lt.ID.String()] && lt.State == store.StateQueued {
				queued = append(queued, lt.ID.String())
			}
		}
		if _, err := j.quotas.TouchLeases(ctx, t, queued); err != nil {
			return fmt.Errorf("leases: refresh: %w", err)
		}
		for _, lt := range live[t] {
			if held[lt.ID.String()] {
				continue
			}
			if err := j.quotas.AddLease(ctx, t, lt.ID.String(), lt.MaxWallclockS > quotas.LongRunningThreshold.Seconds()); err != nil {
				j.log.Warn("re-adding a lost lease failed", "tenant_id", t, "task_id", lt.ID, "err", err)
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
	states, err := j.store.TaskStates(ctx, append(append([]uuid.UUID{}, check...), added...))
	if err != nil {
		return err
	}
	ages := map[string]map[string]time.Duration{} // per tenant, read only for unknown tasks
	for _, id := range check {
		t := owner[id]
		st, known := states[id]
		if known && !store.Terminal(st) {
			continue // became live after the snapshot
		}
		if !known {
			if ages[t] == nil {
				s, l, err := j.quotas.LeaseAges(ctx, t)
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
		n, err := j.quotas.Release(ctx, t, id.String())
		if err != nil {
			return err
		}
		rep.LeasesReleased += n
	}
	for _, id := range added {
		if store.Terminal(states[id]) {
			_, _ = j.quotas.Release(ctx, owner[id], id.String()) // ended meanwhile
		} else {
			rep.LeasesAdded++
		}
	}
	return nil
}

// reviewRunning compares a page of tenants' running sets with their live tasks: it
// frees entries (and their pool slots) of tasks that ended or that Postgres does not
// know, re-queues dispatched tasks asynq lost, and re-adds running tasks missing from
// the set. One Redis round trip reads the whole page.
func (j *Janitor) reviewRunning(ctx context.Context, tenants []string, live map[string][]store.LiveTask, rep *JanitorReport) error {
	pipe := j.rdb.Pipeline()
	sets := make([]*redis.StringSliceCmd, len(tenants))
	for i, t := range tenants {
		sets[i] = pipe.SMembers(ctx, j.keys.TenantRunning(t))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("running sets: %w", err)
	}
	owner := map[uuid.UUID]string{}
	priority := map[uuid.UUID]int{} // of the re-added tasks, from Postgres
	var drop, readded []uuid.UUID
	for i, t := range tenants {
		members := sets[i].Val()
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
		if err := j.rescueStranded(ctx, t, byID, inSet, rep); err != nil {
			j.log.Warn("re-queueing dispatched tasks lost to asynq failed", "tenant_id", t, "err", err)
		}
		for id, lt := range byID {
			if lt.State != store.StateRunning || inSet[id] {
				continue
			}
			if err := j.sched.AddRunning(ctx, t, id); err != nil {
				j.log.Warn("re-adding a running-set entry failed", "tenant_id", t, "task_id", id, "err", err)
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
	states, err := j.store.TaskStates(ctx, append(append([]uuid.UUID{}, drop...), readded...))
	if err != nil {
		return err
	}
	for _, id := range drop {
		if st, known := states[id]; known && !store.Terminal(st) {
			continue
		}
		// No priority: Postgres lists this task as not live, and Done needs none here.
		// Done frees the running-set and inflight entries by task id; the priority only
		// rebuilds the task's dispatching entry, together with the estimate, which the
		// janitor does not know either. A dispatching entry is the dispatcher's: it
		// re-sends it, and the pool check recounts a slot it held.
		if err := j.sched.Done(ctx, wire.Payload{TaskID: id.String(), TenantID: owner[id]}, -1); err != nil {
			return err
		}
		rep.RunningRemoved++
	}
	// As with leases: a task that ended meanwhile must not keep a running slot.
	for _, id := range readded {
		if store.Terminal(states[id]) {
			_ = j.sched.Done(ctx, wire.Payload{TaskID: id.String(), TenantID: owner[id], Priority: priority[id]}, -1)
		} else {
			rep.RunningAdded++
		}
	}
	return nil
}

// rescueStranded frees the slots of a tenant's tasks that were dispatched, never
// started, and lost to asynq, and queues them again.
func (j *Janitor) rescueStranded(ctx context.Context, tenant string, byID map[string]store.LiveTask, inSet map[string]bool, rep *JanitorReport) error {
	for id, t := range byID {
		if t.State != store.StateQueued || !inSet[id] {
			continue
		}
		stranded, err := j.sched.Stranded(ctx, j.inspector, tenant, id, t.Priority, j.cfg.StaleAfter)
		if err != nil || !stranded {
			continue
		}
		_ = j.sched.Done(ctx, wire.Payload{TaskID: id, TenantID: tenant, Priority: t.Priority}, -1)
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
	return nil
}
