package tasks_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/internal/testenv/testfactory"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/capacity"
	"github.com/agentq/agentq/scheduler"
)

// slaEnv is a lifecycle whose starts check the plans' commitments against the real
// scheduler and pools in Redis.
type slaEnv struct {
	*limitEnv
	q    *capacity.Pools
	rdb  *redis.Client
	keys rkeys.Keys
	c    *outbox.Commitments
}

func slaSetup(t *testing.T) *slaEnv {
	t.Helper()
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	rdb, keys := testenv.Redis(t, 1)
	e := &slaEnv{limitEnv: &limitEnv{st: store.New(testenv.Postgres(t))}, q: capacity.NewPools(rdb, keys, nil), rdb: rdb, keys: keys}
	fast := map[string]quotas.Limit{quotas.SLAStartWithin: 0.2, quotas.SLAPoolWaitWithin: 0.2}
	for id, p := range map[string]store.CreateTenantParams{
		"acme": {Plan: "pro", Overrides: fast}, "free": {Plan: "free"}, "flood": {Plan: "pro", Overrides: fast},
	} {
		p.ID, p.Name = id, id
		if _, err := e.st.CreateTenant(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	c := outbox.NewCommitments(outbox.Commitments{Events: outbox.Events{}, Starts: scheduler.New(rdb, keys, scheduler.Options{}), Pools: e.q,
		SLA: func(t store.Tenant) (quotas.SLA, error) { return plans.SLAOf(t.Plan, t.Overrides), nil }}, nil)
	e.c = c
	e.lc = tasks.NewLifecycle(e.st, tasks.LifecycleOptions{Subscribers: []tasks.Subscriber{
		&outbox.Subscriber{Store: e.st, Commitments: c}}})
	return e
}

// create makes a queued task of tenant created age ago.
func (e *slaEnv) create(t *testing.T, tenant string, age time.Duration) uuid.UUID {
	t.Helper()
	return e.createAt(t, tenant, time.Now().Add(-age))
}

// createAt makes a queued task of tenant created at at.
func (e *slaEnv) createAt(t *testing.T, tenant string, at time.Time) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	if _, _, err := e.lc.Create(context.Background(), store.InsertTaskParams{ID: id, TenantID: tenant, Kid: "k", Agent: "sim",
		Input: json.RawMessage(`{}`), Budget: json.RawMessage(`{}`), RequestHash: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	testfactory.TaskCreatedAt(t, e.st.Pool(), id, at)
	return id
}

func (e *slaEnv) start(t *testing.T, id uuid.UUID) store.Task {
	t.Helper()
	task, out, err := e.lc.Start(context.Background(), id)
	if err != nil || out != tasks.Started {
		t.Fatalf("start: %v %v", out, err)
	}
	return task
}

// breaches are the tenant's limit_hits of a commitment, read from the table: the
// feeds hold back what other tests' open transactions might still precede.
func (e *slaEnv) breaches(t *testing.T, tenant, limitType string) []outbox.LimitData {
	t.Helper()
	rows, err := e.st.Pool().Query(context.Background(),
		`SELECT payload FROM events WHERE tenant_id = $1 AND type = $2 ORDER BY seq`, tenant, outbox.TypeLimitHit)
	if err != nil {
		t.Fatal(err)
	}
	payloads, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		t.Fatal(err)
	}
	var out []outbox.LimitData
	for _, p := range payloads {
		if d, _ := decodeEvent(t, p); d.Data.LimitType == limitType {
			out = append(out, d.Data)
		}
	}
	return out
}

// A first start later than the plan's start_within_s, with the tenant within its
// limits and share, is one eligible_breach with the committed and measured values;
// a second late start whose commitment lapsed in the same minute shares it. A plan
// without the commitment has none.
func TestLateFirstStartIsABreach(t *testing.T) {
	t.Parallel()
	e := slaSetup(t)
	// A pool of 8 worker slots: acme's two started tasks are within its share.
	if err := scheduler.New(e.rdb, e.keys, scheduler.Options{}).Heartbeat(context.Background(), "w1", 8, time.Minute); err != nil {
		t.Fatal(err)
	}
	e.start(t, e.create(t, "acme", 0)) // on time
	created := time.Now().Add(-3 * time.Second)
	e.start(t, e.createAt(t, "acme", created))
	e.start(t, e.createAt(t, "acme", created))
	e.start(t, e.create(t, "free", time.Hour))
	got := e.breaches(t, "acme", outbox.LimitSLAStart)
	if len(got) != 1 {
		t.Fatalf("%d breaches, want 1: %+v", len(got), got)
	}
	d := got[0]
	if d.SLAClassification != outbox.EligibleBreach || d.RefusedBy != outbox.RefusedByPlatform || d.Enforcement != outbox.EnforcementDelayed ||
		d.CommittedMs == nil || *d.CommittedMs != 200 || d.MeasuredMs == nil || *d.MeasuredMs < 3000 || d.LimitValue.N != 1 || d.CurrentUsage.N < 3 {
		t.Fatalf("breach %+v", d)
	}
	if b := e.breaches(t, "free", outbox.LimitSLAStart); len(b) != 0 {
		t.Fatalf("free plan (no commitment): %+v", b)
	}
}

// A late start of a tenant asking for more than its share of the worker slots (its
// own tasks queued behind it: its flood) is not a breach.
func TestLateStartOfAFloodingTenantIsNoBreach(t *testing.T) {
	t.Parallel()
	e := slaSetup(t)
	ctx := context.Background()
	sched := scheduler.New(e.rdb, e.keys, scheduler.Options{})
	id := e.create(t, "flood", 3*time.Second)
	for range 3 { // its backlog: queued in Redis behind the late one
		other := e.create(t, "flood", 0)
		task, err := e.st.GetTask(ctx, store.GetTaskParams{TenantID: "flood", ID: other})
		if err != nil {
			t.Fatal(err)
		}
		if err := sched.Enqueue(ctx, scheduler.EnqueueParams{TenantID: "flood", TaskID: other, Weight: 2,
			Priority: task.Priority, CreatedAt: task.CreatedAt}); err != nil {
			t.Fatal(err)
		}
	}
	if held, err := sched.HeldBack(ctx, "flood", time.Now().Add(-time.Hour), 1); err != nil || !held {
		t.Fatalf("HeldBack(flood) = %v %v, want held by its own demand", held, err)
	}
	if held, err := sched.HeldBack(ctx, "acme", time.Now().Add(-time.Hour), 1); err != nil || held {
		t.Fatalf("HeldBack(acme) = %v %v, want within its share", held, err)
	}
	e.start(t, id)
	if b := e.breaches(t, "flood", outbox.LimitSLAStart); len(b) != 0 {
		t.Fatalf("a flooding tenant's late start: %+v", b)
	}
}

// A wait for a shared model pool longer than pool_wait_within_s is a breach at the
// resume; a wait for the tenant's own tokens_per_minute never is, and neither is one
// of a tenant that drew more than its share of the pool.
func TestPoolWaitBeyondTheCommitmentIsABreach(t *testing.T) {
	t.Parallel()
	e := slaSetup(t)
	ctx := context.Background()
	park := func(id uuid.UUID, reason string) {
		task := e.start(t, id)
		if err := e.lc.Park(ctx, tasks.ParkParams{Claim: claimOf(task), Reason: reason, Until: time.Now(), StepEstimate: 100}); err != nil {
			t.Fatal(err)
		}
	}
	e.withinPool(t, "gpt", "acme")
	pooled, own := e.create(t, "acme", 0), e.create(t, "acme", 0)
	park(pooled, "pool:gpt")
	park(own, string(agentqtype.WaitTokensPerMinute))
	time.Sleep(300 * time.Millisecond)
	e.start(t, pooled)
	e.start(t, own)
	got := e.breaches(t, "acme", outbox.LimitSLAPoolWait)
	if len(got) != 1 || *got[0].CommittedMs != 200 || *got[0].MeasuredMs < 300 || got[0].SLAClassification != outbox.EligibleBreach {
		t.Fatalf("pool wait breaches %+v, want one", got)
	}

	// flood drew far ahead of the pool's line: its wait is its own draw.
	if err := e.rdb.HSet(ctx, e.keys.PoolPasses("gpt"), "p:flood", 1e6, "w:flood", 2).Err(); err != nil {
		t.Fatal(err)
	}
	ahead := e.create(t, "flood", 0)
	task := e.start(t, ahead)
	if err := e.lc.Park(ctx, tasks.ParkParams{Claim: claimOf(task), Reason: "pool:gpt", Until: time.Now(), StepEstimate: 100}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	e.start(t, ahead)
	if b := e.breaches(t, "flood", outbox.LimitSLAPoolWait); len(b) != 0 {
		t.Fatalf("a tenant over its pool share: %+v", b)
	}
}

// A late start is the platform's even when another task of the tenant was handed to
// the workers ahead of time (prefetched: in its running set, not started): only
// started tasks count as the tenant's use of its share.
func TestLateStartWithAPrefetchedTaskIsABreach(t *testing.T) {
	t.Parallel()
	e := slaSetup(t)
	ctx := context.Background()
	sched := scheduler.New(e.rdb, e.keys, scheduler.Options{})
	late := e.create(t, "acme", 3*time.Second)
	prefetched := e.create(t, "acme", 0)
	for _, id := range []uuid.UUID{late, prefetched} {
		if err := sched.AddRunning(ctx, "acme", id.String()); err != nil {
			t.Fatal(err)
		}
	}
	e.start(t, late)
	if b := e.breaches(t, "acme", outbox.LimitSLAStart); len(b) != 1 {
		t.Fatalf("%d breaches, want 1: a prefetched task is not the tenant's use of its share", len(b))
	}
}

// A task still waiting past its commitment is reported by the periodic pass before it
// starts; its start then writes nothing more for the same lapse.
func TestWaitingPastTheCommitmentIsReportedBeforeTheStart(t *testing.T) {
	t.Parallel()
	e := slaSetup(t)
	id := e.create(t, "acme", 3*time.Second)
	e.create(t, "acme", 0)              // within its commitment so far
	e.create(t, "free", 10*time.Minute) // no commitment
	checked, written, err := e.c.Waiting(context.Background(), e.st, 100)
	if err != nil || checked != 1 || written != 1 {
		t.Fatalf("Waiting: checked %d written %d %v, want one breach", checked, written, err)
	}
	got := e.breaches(t, "acme", outbox.LimitSLAStart)
	if len(got) != 1 || *got[0].MeasuredMs < 3000 || *got[0].CommittedMs != 200 {
		t.Fatalf("breaches %+v", got)
	}
	e.start(t, id)
	if got := e.breaches(t, "acme", outbox.LimitSLAStart); len(got) != 1 {
		t.Fatalf("the start reported the lapse again: %+v", got)
	}
}

// A lapsed commitment of a paying tenant is reported even behind an older backlog of
// tasks whose plan commits to nothing: the pass looks only at tasks whose plan
// commits and whose commitment lapsed.
func TestLapsedStartBehindAnOldBacklogIsReported(t *testing.T) {
	t.Parallel()
	e := slaSetup(t)
	for range 12 { // older than acme's task, of a plan without the commitment
		e.create(t, "free", 10*time.Minute)
	}
	id := e.create(t, "acme", 3*time.Second)
	if _, written, err := e.c.Waiting(context.Background(), e.st, 10); err != nil || written != 1 {
		t.Fatalf("Waiting: written %d %v, want acme's lapse reported behind 12 older tasks of free", written, err)
	}
	if got := e.breaches(t, "acme", outbox.LimitSLAStart); len(got) != 1 || *got[0].MeasuredMs < 3000 {
		t.Fatalf("breaches %+v", got)
	}
	e.start(t, id)
	if got := e.breaches(t, "acme", outbox.LimitSLAStart); len(got) != 1 {
		t.Fatalf("the start reported the lapse again: %+v", got)
	}
}

// The pass goes on past a minute already reported: a tenant's many lapsed tasks of
// one minute do not hide a later minute's lapse.
func TestLapsesOfLaterMinutesAreReportedPastAnEarlierOne(t *testing.T) {
	t.Parallel()
	e := slaSetup(t)
	ctx := context.Background()
	early := time.Now().Add(-3 * time.Minute)
	for range 12 {
		e.createAt(t, "acme", early)
	}
	if _, written, err := e.c.Waiting(ctx, e.st, 10); err != nil || written != 1 {
		t.Fatalf("first pass: written %d %v, want 1", written, err)
	}
	e.create(t, "acme", 3*time.Second) // lapsed minutes later
	if _, written, err := e.c.Waiting(ctx, e.st, 10); err != nil || written != 1 {
		t.Fatalf("second pass: written %d %v, want the later minute's lapse", written, err)
	}
	if got := e.breaches(t, "acme", outbox.LimitSLAStart); len(got) != 2 {
		t.Fatalf("%d breaches, want 2: %+v", len(got), got)
	}
}

// parkFor starts task id and parks it for reason until until.
func (e *slaEnv) parkFor(t *testing.T, id uuid.UUID, reason string, until time.Time) {
	t.Helper()
	task := e.start(t, id)
	if err := e.lc.Park(context.Background(), tasks.ParkParams{Claim: claimOf(task), Reason: reason, Until: until, StepEstimate: 100}); err != nil {
		t.Fatal(err)
	}
}

// withinPool makes tenant known to pool and within its share of it.
func (e *slaEnv) withinPool(t *testing.T, pool, tenant string) {
	t.Helper()
	if err := e.rdb.HSet(context.Background(), e.keys.PoolPasses(pool), "p:"+tenant, 0, "w:"+tenant, 1).Err(); err != nil {
		t.Fatal(err)
	}
}

// A pool wait is measured from the park to the unpark (the wait_until the pool named);
// the rest, until the start, counts only when the tenant did not hold itself back
// (its own running cap, here: it left its capped set after the unpark).
func TestPoolWaitPastTheUnparkHeldByTheTenantIsNoBreach(t *testing.T) {
	t.Parallel()
	e := slaSetup(t)
	ctx := context.Background()
	e.withinPool(t, "gpt", "acme")
	id := e.create(t, "acme", 0)
	e.parkFor(t, id, "pool:gpt", time.Now().Add(50*time.Millisecond))
	time.Sleep(300 * time.Millisecond)
	// After the unpark, acme waited behind its own running cap: it left the capped
	// set just now.
	if err := e.rdb.HSet(ctx, e.keys.TenantConf("acme"), "uncap", time.Now().UnixMilli()).Err(); err != nil {
		t.Fatal(err)
	}
	e.start(t, id)
	if b := e.breaches(t, "acme", outbox.LimitSLAPoolWait); len(b) != 0 {
		t.Fatalf("a wait behind the tenant's own cap after the unpark was credited: %+v", b)
	}
}

// A pool wait whose rest after the unpark was the platform's (no cap of the tenant's,
// within its share) is measured to the start.
func TestPoolWaitPastTheUnparkOnThePlatformIsABreach(t *testing.T) {
	t.Parallel()
	e := slaSetup(t)
	e.withinPool(t, "gpt", "acme")
	id := e.create(t, "acme", 0)
	e.parkFor(t, id, "pool:gpt", time.Now().Add(50*time.Millisecond))
	time.Sleep(300 * time.Millisecond)
	e.start(t, id)
	if got := e.breaches(t, "acme", outbox.LimitSLAPoolWait); len(got) != 1 || *got[0].MeasuredMs < 300 {
		t.Fatalf("breaches %+v, want one measured to the start", got)
	}
}

// A wait after a throttled answer of the agent's provider is never a breach, however
// long; nor is a pool wait of a tenant the pool does not know (nothing to judge its
// share by).
func TestThrottledAndUnjudgedPoolWaitsAreNoBreach(t *testing.T) {
	t.Parallel()
	e := slaSetup(t)
	throttled, unknown := e.create(t, "acme", 0), e.create(t, "flood", 0)
	e.withinPool(t, "gpt", "acme")
	e.parkFor(t, throttled, "throttled:gpt", time.Now().Add(time.Second))
	e.parkFor(t, unknown, "pool:gpt", time.Now().Add(time.Second))
	time.Sleep(1100 * time.Millisecond)
	e.start(t, throttled)
	e.start(t, unknown)
	for _, tenant := range []string{"acme", "flood"} {
		if b := e.breaches(t, tenant, outbox.LimitSLAPoolWait); len(b) != 0 {
			t.Fatalf("%s: %+v, want no breach", tenant, b)
		}
	}
}

// deadline gives queued task id the start deadline at.
func (e *slaEnv) deadline(t *testing.T, id uuid.UUID, at time.Time) {
	t.Helper()
	testfactory.TaskStartDeadlineAt(t, e.st.Pool(), id, at)
}

// A task that expires at its start deadline after its plan's start commitment lapsed
// is a breach, written with the expiry, whether the expiry pass or a worker's late
// start ends it; one whose deadline came before the commitment lapsed is not (the
// tenant asked for less than the plan commits to).
func TestExpiryAfterTheCommitmentLapsedIsABreach(t *testing.T) {
	t.Parallel()
	e := slaSetup(t)
	ctx := context.Background()
	created := time.Now().Add(-3 * time.Minute)
	byPass, early := e.createAt(t, "acme", created), e.createAt(t, "flood", created)
	e.deadline(t, byPass, created.Add(time.Second))
	e.deadline(t, early, created.Add(100*time.Millisecond)) // before flood's 200 ms commitment
	if ts, err := e.lc.ExpireOverdue(ctx, 10); err != nil || len(ts) != 2 {
		t.Fatalf("ExpireOverdue: %d %v, want 2", len(ts), err)
	}
	got := e.breaches(t, "acme", outbox.LimitSLAStart)
	if len(got) != 1 || *got[0].CommittedMs != 200 || *got[0].MeasuredMs < 3*60*1000 {
		t.Fatalf("breaches at the expiry %+v, want one", got)
	}
	if b := e.breaches(t, "flood", outbox.LimitSLAStart); len(b) != 0 {
		t.Fatalf("a deadline before the commitment lapsed: %+v", b)
	}

	// A worker's start finds the task past its deadline: the same statement expires it.
	byStart := e.create(t, "acme", time.Minute)
	e.deadline(t, byStart, time.Now().Add(-time.Second))
	if task, out, err := e.lc.Start(ctx, byStart); err != nil || out != tasks.Ended || task.State != agentqtype.TaskStateExpired {
		t.Fatalf("start: %v %v %v, want expired", task.State, out, err)
	}
	if got := e.breaches(t, "acme", outbox.LimitSLAStart); len(got) != 2 {
		t.Fatalf("%d breaches, want a second one at the start's expiry: %+v", len(got), got)
	}
}

// A tenant whose own cap held back its lapsed tasks costs the pass one look, so the
// lapsed tasks of tenants after it are still reported within a run's bound.
func TestLapsesAfterAHeldBackTenantAreReported(t *testing.T) {
	t.Parallel()
	e := slaSetup(t)
	for range 12 {
		e.create(t, "acme", time.Minute)
	}
	// acme left its capped set just now: its own cap held all its waiting tasks.
	if err := e.rdb.HSet(context.Background(), e.keys.TenantConf("acme"), "uncap", time.Now().UnixMilli()).Err(); err != nil {
		t.Fatal(err)
	}
	e.create(t, "flood", 3*time.Second)
	if _, written, err := e.c.Waiting(context.Background(), e.st, 5); err != nil || written != 1 {
		t.Fatalf("Waiting: written %d %v, want flood's lapse reported after acme's held-back tasks", written, err)
	}
	if b := e.breaches(t, "acme", outbox.LimitSLAStart); len(b) != 0 {
		t.Fatalf("acme, held back by its own cap: %+v", b)
	}
}

// Each run starts after the tenant the previous one looked at last: tenants late in
// the order are reached even when a run's bound is spent before them.
func TestLatePassTakesTenantsInTurn(t *testing.T) {
	t.Parallel()
	e := slaSetup(t)
	ctx := context.Background()
	e.create(t, "acme", time.Minute)
	if err := e.rdb.HSet(ctx, e.keys.TenantConf("acme"), "uncap", time.Now().UnixMilli()).Err(); err != nil {
		t.Fatal(err)
	}
	e.create(t, "flood", 3*time.Second)
	written := 0
	for range 2 {
		_, n, err := e.c.Waiting(ctx, e.st, 1)
		if err != nil {
			t.Fatal(err)
		}
		written += n
	}
	if written != 1 || len(e.breaches(t, "flood", outbox.LimitSLAStart)) != 1 {
		t.Fatalf("written %d in two runs of one task each, want flood's lapse reported in the second", written)
	}
}
