package admission

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
)

// --- 0 is a limit, unlimited is off ---------------------------------------------------

func TestZeroLimitsRefuseUnlimitedOnesDoNot(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	zeroSessions := quotas.NoLimits()
	zeroSessions.Sessions = 0
	for range 2 {
		if d := f.admitExact(zeroSessions); d.Allowed || !slices.Equal(d.Violated, []string{quotas.ConcurrentSessions}) {
			t.Fatalf("concurrent_sessions 0: allowed %v, violated %v", d.Allowed, d.Violated)
		}
	}
	zeroRate := quotas.NoLimits()
	zeroRate.TenantRate = 0
	d := f.admitExact(zeroRate)
	if d.Allowed || !slices.Equal(d.Violated, []string{quotas.TenantRate}) || scopeOf(d, quotas.TenantRate).RetryAfter <= 0 {
		t.Fatalf("tenant_rate 0: %+v", d)
	}
	zeroBacklog := quotas.NoLimits()
	zeroBacklog.Backlog = 0
	if d := f.admitExact(zeroBacklog); !slices.Equal(d.Violated, []string{quotas.QueueBacklog}) {
		t.Fatalf("queue_backlog 0: %v", d.Violated)
	}
	// every limit off: admitted, and the peek tells 0 from off
	if d := f.admitExact(quotas.NoLimits()); !d.Allowed {
		t.Fatalf("no limits: %v", d.Violated)
	}
	peekL := quotas.NoLimits()
	peekL.USDMonthlyMicro = 0
	pk := f.admitExact(peekL, func(p *quotas.AdmitParams) { p.Mode = quotas.ModePeek })
	if scopeOf(pk, quotas.USDMonthly).Limit != 0 || scopeOf(pk, quotas.AITokensMonthly).Limit != quotas.Off {
		t.Fatalf("peek: usd limit %v (want 0), tokens limit %v (want off)", scopeOf(pk, quotas.USDMonthly).Limit, scopeOf(pk, quotas.AITokensMonthly).Limit)
	}
}

func TestZeroUSDQuotaRefusesStepsThatCost(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	l := quotas.NoLimits()
	l.USDMonthlyMicro = 0
	p := quotas.StepParams{TenantID: "acme", Period: f.period(), Limits: l}
	// a step nobody knows the cost of (the first of a task) runs ...
	if err := f.q.ReserveStep(ctx, p); err != nil {
		t.Fatalf("first step under $0: %v", err)
	}
	// ... it cost $0.01; the task's next step reserves that much and is refused
	if err := f.q.SettleStep(ctx, nil, quotas.StepParams{TenantID: "acme", Period: f.period(), CostMicro: 10_000}); err != nil {
		t.Fatal(err)
	}
	p.CostMicro = 10_000
	var qe *quotas.QuotaExceeded
	if err := f.q.ReserveStep(ctx, p); !errors.As(err, &qe) || qe.LimitType != quotas.USDMonthly || qe.Limit != 0 {
		t.Fatalf("a step that costs money under a $0 quota: %v", err)
	}
	// steps that cost nothing still run, and tasks are still admitted
	p.CostMicro = 0
	for range 3 {
		if err := f.q.ReserveStep(ctx, p); err != nil {
			t.Fatalf("a step that costs nothing under a $0 quota: %v", err)
		}
	}
	if d := f.admitExact(l); !d.Allowed {
		t.Fatalf("admission under a $0 quota: %v", d.Violated)
	}
	// a 0 token quota behaves the same; an unlimited one never refuses
	l.TokensMonthly = 0
	if err := f.q.ReserveStep(ctx, quotas.StepParams{TenantID: "acme", Period: f.period(), Limits: l, Tokens: 1}); !errors.As(err, &qe) || qe.LimitType != quotas.AITokensMonthly {
		t.Fatalf("a step estimated at 1 token under a 0 token quota: %v", err)
	}
	if err := f.q.ReserveStep(ctx, quotas.StepParams{TenantID: "acme", Period: f.period(), Limits: quotas.NoLimits(), Tokens: 1e9, CostMicro: 1e12}); err != nil {
		t.Fatalf("unlimited quotas: %v", err)
	}
}

// --- monthly counters across the period boundary -------------------------------------

func TestMonthlyQuotaSurvivesThePeriodBoundary(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	l := quotas.NoLimits()
	l.TokensMonthly = 6000
	old := f.period()
	next := quotas.PeriodAt(old.Start, old.End) // the following period
	if next.ID <= old.ID {
		t.Fatalf("periods %s, %s", old.ID, next.ID)
	}
	// two tasks, one started before the boundary (old period), one after, alternate
	// steps of 1,000 tokens each
	let := 0
	for i := range 20 {
		per := next
		if i%2 == 0 {
			per = old
		}
		if err := f.q.ReserveStep(ctx, quotas.StepParams{TenantID: "acme", Period: per, Limits: l, Tokens: 1000}); err == nil {
			let++
		}
	}
	// the first step (old period) goes in alone; after the new period began, at most
	// 6,000 tokens in it
	if let > 7 {
		t.Fatalf("%d steps of 1,000 tokens passed a 6,000 token limit", let)
	}
	// a late settlement of the old period books into the newest one, never below 0
	if err := f.q.SettleStep(ctx, nil, quotas.StepParams{TenantID: "acme", Period: old, Tokens: -1000}); err != nil {
		t.Fatal(err)
	}
	h := f.rdb.HGetAll(ctx, f.keys.AdmissionState("acme")).Val()
	if h["per"] != next.ID || h[rkeys.TokensField(old.ID)] != "" || h[rkeys.TokensField(next.ID)] != "5000" {
		t.Fatalf("state after the boundary: %v", h)
	}
}

// --- queue_backlog under concurrent admissions ---------------------------------------

func TestQueueBacklogHoldsUnderConcurrentAdmissions(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.q = New(f.rdb, f.keys, f.clock, Options{Coalesce: true, CoalesceTimeout: 2 * time.Second}) // as the API runs it
	l := quotas.NoLimits()
	l.Backlog = 5
	var wg sync.WaitGroup
	var mu sync.Mutex
	var admitted []string
	for i := range 40 {
		wg.Go(func() {
			id := fmt.Sprintf("task-%d", i)
			d, err := f.q.Admit(ctx, quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: "acme", Kid: "k", TaskID: id, InScope: true, Limits: l, Period: f.period()})
			if err != nil {
				t.Error(err)
				return
			}
			if d.Allowed {
				mu.Lock()
				admitted = append(admitted, id)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(admitted) != 5 {
		t.Fatalf("%d of 40 concurrent submissions admitted with a backlog of 5", len(admitted))
	}
	// pushed to the queue (what the scheduler's enqueue script does): counted there
	// instead, not twice
	for i, id := range admitted {
		f.rdb.ZAdd(ctx, f.keys.TenantQueue("acme"), redis.Z{Score: float64(i), Member: id})
		f.rdb.ZRem(ctx, f.keys.PendingQueue("acme"), id)
	}
	pk, _ := f.q.Admit(ctx, quotas.AdmitParams{Mode: quotas.ModePeek, TenantID: "acme", Kid: "k", Limits: l, Period: f.period()})
	if scopeOf(pk, quotas.QueueBacklog).Used != 5 {
		t.Fatalf("backlog after the push: %v, want 5", scopeOf(pk, quotas.QueueBacklog).Used)
	}
	// one leaves the queue; a refused insert gives its place back (Release); an
	// admission whose caller died stops counting after PendingTTL
	f.rdb.ZRem(ctx, f.keys.TenantQueue("acme"), admitted[0])
	d, _ := f.q.Admit(ctx, quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: "acme", Kid: "k", TaskID: "late", InScope: true, Limits: l, Period: f.period()})
	if !d.Allowed {
		t.Fatalf("room for one: %v", d.Violated)
	}
	if d, _ := f.q.Admit(ctx, quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: "acme", Kid: "k", TaskID: "later", InScope: true, Limits: l, Period: f.period()}); d.Allowed {
		t.Fatal("an admitted, not yet queued task was not counted")
	}
	if _, err := f.q.Release(ctx, nil, "acme", "late"); err != nil {
		t.Fatal(err)
	}
	if d, _ := f.q.Admit(ctx, quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: "acme", Kid: "k", TaskID: "dies", InScope: true, Limits: l, Period: f.period()}); !d.Allowed {
		t.Fatal("a released admission still counts")
	}
	f.advance(PendingTTL + time.Second)
	if d, _ := f.q.Admit(ctx, quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: "acme", Kid: "k", TaskID: "after", InScope: true, Limits: l, Period: f.period()}); !d.Allowed {
		t.Fatal("an admission whose caller died still counts after PendingTTL")
	}
	if ttl := f.rdb.PTTL(ctx, f.keys.PendingQueue("acme")).Val(); ttl <= 0 || ttl > PendingTTL {
		t.Fatalf("pending set TTL %v", ttl)
	}
}

// --- bounded cost of the user buckets -------------------------------------------------

func TestUsersBeyondTheCapShareTheOverflowBucket(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	l := quotas.NoLimits()
	l.UserHourly, l.UserBurst = 2, 2
	user := func(u string) func(*quotas.AdmitParams) { return func(p *quotas.AdmitParams) { p.User = u } }
	for i := range MaxUsersPerTenant {
		if !f.admitExact(l, user(fmt.Sprintf("user-%d", i))).Allowed {
			t.Fatalf("user %d refused", i)
		}
	}
	if n := userFields(t, f); n != MaxUsersPerTenant {
		t.Fatalf("%d user buckets", n)
	}
	// two new users share the overflow bucket of 2
	if !f.admitExact(l, user("new-a")).Allowed || !f.admitExact(l, user("new-b")).Allowed || f.admitExact(l, user("new-c")).Allowed {
		t.Fatal("users beyond the cap do not share one bucket of 2")
	}
	// a known user keeps its own bucket
	if !f.admitExact(l, user("user-7")).Allowed {
		t.Fatal("a tracked user was refused")
	}
	// when buckets are full again, their users are swept out as new users arrive, and
	// the new users get buckets of their own (each admits 2, not the overflow's 0)
	f.advance(time.Hour + time.Second)
	for _, u := range []string{"new-a", "new-b", "new-c"} {
		for i := range 2 {
			if d := f.admitExact(l, user(u)); !d.Allowed {
				t.Fatalf("%s, task %d, after capacity returned: %v", u, i+1, d.Violated)
			}
		}
		if _, err := f.rdb.HGet(ctx, f.keys.AdmissionState("acme"), rkeys.UserField(u)).Result(); err != nil {
			t.Fatalf("%s has no bucket of its own: %v", u, err)
		}
	}
	if n := userFields(t, f); n > MaxUsersPerTenant+1 {
		t.Fatalf("%d user buckets, cap %d (+1 overflow)", n, MaxUsersPerTenant)
	}
	if ttl := f.rdb.PTTL(ctx, f.keys.AdmissionState("acme")).Val(); ttl <= 0 {
		t.Fatal("the state hash has no TTL")
	}
}

// With MaxUsersPerTenant users tracked, a new user's admission (the overflow path)
// must cost what a known user's does: run with -bench NewUserAtCap.
func BenchmarkNewUserAtCap(b *testing.B) {
	f := &qfix{now: time.Date(2026, 11, 30, 10, 30, 0, 0, time.UTC).UnixMilli()}
	rdb, keys := testenv.Redis(b, 1)
	f.rdb, f.keys, f.q = rdb, keys, New(rdb, keys, f.clock)
	l := quotas.NoLimits()
	l.UserHourly, l.UserBurst = 1, 1
	ctx := context.Background()
	run := func(u string) {
		if _, err := f.q.Admit(ctx, quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: "acme", Kid: "k", User: u, TaskID: u, InScope: true, Limits: l, Period: f.period()}); err != nil {
			b.Fatal(err)
		}
	}
	for i := range MaxUsersPerTenant { // every bucket live: none can be dropped
		run(fmt.Sprintf("live-%d", i))
	}
	b.Run("known-user", func(b *testing.B) {
		for b.Loop() {
			run("live-1")
		}
	})
	b.Run("new-user", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			run(fmt.Sprintf("new-%d", i))
		}
	})
}

// --- leases --------------------------------------------------------------------------

func TestTouchLeasesKeepsQueuedAndLongRunningLeases(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	l := quotas.NoLimits()
	l.Sessions, l.LongRunning = 10, 10
	f.admitExact(l, func(p *quotas.AdmitParams) { p.TaskID, p.LongRunning = "queued-long", true })
	f.admitExact(l, func(p *quotas.AdmitParams) { p.TaskID = "queued" })
	// 5 h later (a lease lives 6 h) the janitor refreshes the queued tasks' leases,
	// and both sets' lives with them (shortened here to see it)
	f.advance(5 * time.Hour)
	for _, k := range []string{f.keys.Sessions("acme"), f.keys.LongRunning("acme")} {
		f.rdb.PExpire(ctx, k, time.Minute)
	}
	n, err := f.q.TouchLeases(ctx, "acme", []string{"queued-long", "queued", "not-leased"})
	if err != nil || n != 2 {
		t.Fatalf("touched %d leases (%v), want 2", n, err)
	}
	for _, k := range []string{f.keys.Sessions("acme"), f.keys.LongRunning("acme")} {
		if ttl := f.rdb.PTTL(ctx, k).Val(); ttl < leaseTTL-time.Minute {
			t.Errorf("%s lives %v more after the refresh, want about %v", k, ttl, leaseTTL)
		}
	}
	if f.rdb.ZScore(ctx, f.keys.Sessions("acme"), "not-leased").Err() != redis.Nil {
		t.Fatal("a task without a lease got one")
	}
	// another 5 h: the refreshed leases still count
	f.advance(5 * time.Hour)
	one := quotas.NoLimits()
	one.LongRunning = 1
	if d := f.admitExact(one, func(p *quotas.AdmitParams) { p.LongRunning = true }); d.Allowed {
		t.Fatal("the refreshed long-running lease expired")
	}
	// ages are on the script clock, not the process clock
	s, lg, err := f.q.LeaseAges(ctx, "acme")
	if err != nil || s["queued"] < 5*time.Hour-time.Second || s["queued"] > 5*time.Hour+time.Second || lg["queued-long"] < 5*time.Hour-time.Second {
		t.Fatalf("lease ages %v %v (%v), want 5h", s, lg, err)
	}
	if err := f.q.AddLease(ctx, "acme", "readded", true); err != nil {
		t.Fatal(err)
	}
	if sc := f.rdb.ZScore(ctx, f.keys.LongRunning("acme"), "readded").Val(); int64(sc) != f.clock()+leaseTTL.Milliseconds() {
		t.Fatalf("re-added lease expires at %v, want now + TTL on the script clock (%d)", sc, f.clock()+leaseTTL.Milliseconds())
	}
}

// agentq dev runs these scripts on an embedded miniredis (numbers as text, no struct
// library): every path changed here must work there too.
func TestScriptsOnEmbeddedRedis(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	f := &qfix{t: t, rdb: rdb, keys: rkeys.New("mr:", 1), now: time.Date(2026, 11, 30, 10, 30, 0, 0, time.UTC).UnixMilli()}
	f.q = New(rdb, f.keys, f.clock)
	ctx := context.Background()
	l := quotas.NoLimits()
	l.UserHourly, l.UserBurst = 1, 1
	for i := range MaxUsersPerTenant + 1 {
		f.admitExact(l, func(p *quotas.AdmitParams) { p.User = fmt.Sprint("u", i) })
	}
	if !f.q.textNums {
		t.Fatal("miniredis was not detected as lacking struct")
	}
	if d := f.admitExact(l, func(p *quotas.AdmitParams) { p.User = "beyond" }); !slices.Equal(d.Violated, []string{quotas.UserTasksHourly}) {
		t.Fatalf("overflow bucket on miniredis: %+v", d)
	}
	f.advance(time.Hour + time.Second)
	if d := f.admitExact(l, func(p *quotas.AdmitParams) { p.User = "fresh" }); !d.Allowed {
		t.Fatalf("after an hour on miniredis: %v", d.Violated)
	}
	b := quotas.NoLimits()
	b.Backlog, b.Sessions, b.LongRunning = 3, 10, 10
	for range 3 {
		f.admitExact(b, func(p *quotas.AdmitParams) { p.LongRunning = true })
	}
	if d := f.admitExact(b); !slices.Equal(d.Violated, []string{quotas.QueueBacklog}) {
		t.Fatalf("backlog of 3 with 3 admitted, not queued, on miniredis: %v", d.Violated)
	}
	f.rdb.ZRem(ctx, f.keys.PendingQueue("acme"), fmt.Sprintf("task-%d", f.n-1)) // as the enqueue does
	if d := f.admitExact(b); !d.Allowed {
		t.Fatalf("after a push on miniredis: %v", d.Violated)
	}
	z := quotas.NoLimits()
	z.USDMonthlyMicro = 0
	var qe *quotas.QuotaExceeded
	old := f.period()
	if err := f.q.ReserveStep(ctx, quotas.StepParams{TenantID: "acme", Period: quotas.PeriodAt(old.Start, old.End), Limits: z}); err != nil {
		t.Fatal(err)
	}
	if err := f.q.SettleStep(ctx, nil, quotas.StepParams{TenantID: "acme", Period: old, CostMicro: 5}); err != nil {
		t.Fatal(err)
	}
	if err := f.q.ReserveStep(ctx, quotas.StepParams{TenantID: "acme", Period: old, Limits: z, CostMicro: 5}); !errors.As(err, &qe) || qe.Used != 5 {
		t.Fatalf("$0 quota on miniredis: %v", err)
	}
	f.advance(time.Minute)
	if n, err := f.q.TouchLeases(ctx, "acme", []string{fmt.Sprintf("task-%d", f.n-2)}); err != nil || n != 1 {
		t.Fatalf("touch on miniredis: %d %v", n, err)
	}
	if err := f.q.AddLease(ctx, "acme", "x", true); err != nil {
		t.Fatal(err)
	}
	if s, _, err := f.q.LeaseAges(ctx, "acme"); err != nil || s["x"] != 0 {
		t.Fatalf("lease ages on miniredis: %v %v", s, err)
	}
	// The period the counters moved on to above: a used-up tokens quota's refusal
	// names it.
	cur := quotas.PeriodAt(old.Start, old.End)
	tq := quotas.NoLimits()
	tq.TokensMonthly = 1
	if err := f.q.ReserveStep(ctx, quotas.StepParams{TenantID: "acme", Period: cur, Limits: tq, Tokens: 1}); err != nil {
		t.Fatal(err)
	}
	if d := f.admitExact(tq, func(p *quotas.AdmitParams) { p.Period = cur }); !slices.Equal(d.Violated, []string{quotas.AITokensMonthly}) {
		t.Fatalf("used-up tokens quota on miniredis: %v", d.Violated)
	}
	trs, err := f.q.Rejections(ctx, []string{"acme"})
	if err != nil || !slices.ContainsFunc(trs[0].Counts(), func(c quotas.RejectionCount) bool { return c.Period == cur.ID }) {
		t.Fatalf("tokens refusal on miniredis counted %+v %v, want under period %s", trs, err, cur.ID)
	}
}

// Without Redis the in-process fallback keeps 0 a limit and unlimited off.
func TestDegradedModeKeepsZeroLimits(t *testing.T) {
	dead := testenv.DeadRedis(t)
	g := NewGuard(New(dead, rkeys.New("dead:", 1), nil), GuardOptions{Timeout: 20 * time.Millisecond})
	p := quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: "acme", Kid: "k", TaskID: "t", InScope: true, Limits: quotas.NoLimits()}
	if d, err := g.Admit(context.Background(), p); err != nil || !d.Allowed || !d.Degraded {
		t.Fatalf("every limit off, degraded: %+v %v", d, err)
	}
	p.Limits.Sessions = 0
	if d, _ := g.Admit(context.Background(), p); d.Allowed || !slices.Equal(d.Violated, []string{quotas.ConcurrentSessions}) {
		t.Fatalf("concurrent_sessions 0, degraded: %+v", d)
	}
	p.Limits = quotas.NoLimits()
	p.Limits.TenantRate = 0
	if d, _ := g.Admit(context.Background(), p); d.Allowed || !slices.Equal(d.Violated, []string{quotas.TenantRate}) {
		t.Fatalf("tenant_rate 0, degraded: %+v", d)
	}
	p.Limits = quotas.NoLimits()
	p.Limits.USDMonthlyMicro = 0
	if _, err := g.Admit(context.Background(), p); !errors.Is(err, quotas.ErrUnavailable) {
		t.Fatalf("a $0 money quota fails closed without Redis: %v", err)
	}
}

// A long-running task's lease is kept in the long-running set only, and counts as a
// session all the same; a short task's counts as a session and not as long-running.
func TestLongRunningLeaseCountsAsASession(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	l := quotas.NoLimits()
	l.Sessions, l.LongRunning = 2, 1
	long := func(p *quotas.AdmitParams) { p.LongRunning = true }
	if d := f.admitExact(l); !d.Allowed {
		t.Fatalf("short task refused: %v", d.Violated)
	}
	if d := f.admitExact(l, long); !d.Allowed {
		t.Fatalf("a short task counted as long-running: %v", d.Violated)
	}
	if d := f.admitExact(l); !slices.Equal(d.Violated, []string{quotas.ConcurrentSessions}) {
		t.Fatalf("third session: violated %v, want concurrent_sessions", d.Violated)
	}
	sess, lg, err := f.q.Leases(ctx, "acme")
	if err != nil || len(sess) != 2 || !slices.Equal(lg, []string{"task-2"}) {
		t.Fatalf("leases %v, long %v (%v): want both as sessions, task-2 long-running", sess, lg, err)
	}
	if n, err := f.q.Release(ctx, nil, "acme", "task-2"); err != nil || n != 1 {
		t.Fatalf("released %d leases (%v), want 1", n, err)
	}
	if d := f.admitExact(l, long); !d.Allowed {
		t.Fatalf("after the long-running task ended: %v", d.Violated)
	}
}
