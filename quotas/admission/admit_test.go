package admission

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
)

type qfix struct {
	t    *testing.T
	rdb  *redis.Client
	keys rkeys.Keys
	q    *Store
	mu   sync.Mutex
	now  int64
	n    int
}

func newQ(t *testing.T) *qfix {
	rdb, keys := testenv.Redis(t, 1)
	f := &qfix{t: t, rdb: rdb, keys: keys, now: time.Date(2026, 11, 30, 10, 30, 0, 0, time.UTC).UnixMilli()}
	f.q = New(rdb, keys, f.clock)
	return f
}

func (f *qfix) clock() int64 { f.mu.Lock(); defer f.mu.Unlock(); return f.now }
func (f *qfix) advance(d time.Duration) {
	f.mu.Lock()
	f.now += d.Milliseconds()
	f.mu.Unlock()
}

func (f *qfix) period() quotas.Period {
	return quotas.PeriodAt(time.Date(2026, 1, 15, 0, 0, 0, 0, time.UTC), time.UnixMilli(f.clock()))
}

// only turns the zero limits of l off, so a test names just the limits it is about.
func only(l quotas.Limits) quotas.Limits {
	off := func(v *float64) {
		if *v == 0 {
			*v = quotas.Off
		}
	}
	offN := func(v *int64) {
		if *v == 0 {
			*v = quotas.Off
		}
	}
	off(&l.KeyRate)
	off(&l.TenantRate)
	off(&l.KeyAgentRate)
	off(&l.UserHourly)
	for _, v := range []*int64{&l.Sessions, &l.LongRunning, &l.Backlog, &l.StepsDaily, &l.TokensMonthly, &l.USDMonthlyMicro} {
		offN(v)
	}
	return l
}

// admit runs one admission with the given limits; zero limits are off (see only).
func (f *qfix) admit(l quotas.Limits, mut ...func(*quotas.AdmitParams)) quotas.Decision {
	f.t.Helper()
	return f.admitExact(only(l), mut...)
}

// admitExact runs one admission with exactly the limits l (0 is a limit).
func (f *qfix) admitExact(l quotas.Limits, mut ...func(*quotas.AdmitParams)) quotas.Decision {
	f.t.Helper()
	f.n++
	p := quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: "acme", Kid: "acme-1", Agent: "sim", User: "u1",
		TaskID: fmt.Sprintf("task-%d", f.n), InScope: true, Limits: l, Period: f.period()}
	for _, m := range mut {
		m(&p)
	}
	d, err := f.q.Admit(context.Background(), p)
	if err != nil {
		f.t.Fatal(err)
	}
	return d
}

func scopeOf(d quotas.Decision, name string) quotas.Scope {
	for _, s := range d.Scopes {
		if s.Name == name {
			return s
		}
	}
	return quotas.Scope{Name: "missing " + name}
}

func TestTokenBucketBurstAndRefill(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	l := quotas.Limits{TenantRate: 5, TenantBurst: 5}
	for i := range 5 {
		d := f.admit(l)
		if !d.Allowed {
			t.Fatalf("request %d of the burst refused: %+v", i, d)
		}
		if got := scopeOf(d, quotas.TenantRate).Remaining; got != int64(4-i) {
			t.Fatalf("request %d: remaining %d, want %d", i, got, 4-i)
		}
	}
	d := f.admit(l)
	if d.Allowed || !slices.Equal(d.Violated, []string{quotas.TenantRate}) {
		t.Fatalf("6th request: %+v, want tenant_rate violated", d)
	}
	if ra := scopeOf(d, quotas.TenantRate).RetryAfter; ra != 200*time.Millisecond {
		t.Fatalf("retry after %v, want 200ms (one token at 5/s)", ra)
	}
	f.advance(199 * time.Millisecond)
	if f.admit(l).Allowed {
		t.Fatal("admitted before the token refilled")
	}
	f.advance(time.Millisecond)
	if !f.admit(l).Allowed {
		t.Fatal("refused after the token refilled")
	}
	f.advance(10 * time.Second)
	if d := f.admit(l); scopeOf(d, quotas.TenantRate).Remaining != 4 {
		t.Fatalf("after a long idle, remaining %d, want burst-1 = 4 (no more than burst)", scopeOf(d, quotas.TenantRate).Remaining)
	}
}

func TestAllOrNothingAndEveryViolatedScopeNamed(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	l := quotas.Limits{TenantRate: 100, TenantBurst: 100, UserHourly: 1, UserBurst: 1, Sessions: 1, KeyRate: 100, KeyBurst: 100}
	if d := f.admit(l); !d.Allowed {
		t.Fatalf("first: %+v", d)
	}
	tenantBefore := f.rdb.HGet(ctx, f.keys.AdmissionState("acme"), "t").Val()
	sessBefore := f.rdb.ZCard(ctx, f.keys.Sessions("acme")).Val()
	d := f.admit(l)
	if d.Allowed {
		t.Fatal("second admitted past one session and one task per hour")
	}
	slices.Sort(d.Violated)
	if !slices.Equal(d.Violated, []string{quotas.ConcurrentSessions, quotas.UserTasksHourly}) {
		t.Fatalf("violated = %v, want concurrent_sessions and user_tasks_hourly", d.Violated)
	}
	if got := f.rdb.HGet(ctx, f.keys.AdmissionState("acme"), "t").Val(); got != tenantBefore {
		t.Fatalf("a refused admission took a tenant token (%s → %s)", tenantBefore, got)
	}
	if got := f.rdb.ZCard(ctx, f.keys.Sessions("acme")).Val(); got != sessBefore {
		t.Fatal("a refused admission took a session")
	}
	// the key bucket comes first and counts every request
	if scopeOf(d, quotas.KeyRate).Remaining != 98 {
		t.Fatalf("key bucket remaining %d, want 98", scopeOf(d, quotas.KeyRate).Remaining)
	}
}

func TestOutOfScopeSpendsOnlyTheKeyBucket(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	l := quotas.Limits{KeyRate: 20, KeyBurst: 40, TenantRate: 5, TenantBurst: 5, Sessions: 10}
	for range 100 {
		d := f.admit(l, func(p *quotas.AdmitParams) { p.InScope = false; p.Kid = "acme-bad" })
		if d.Allowed {
			t.Fatal("out-of-scope admitted")
		}
	}
	if n := f.rdb.HExists(ctx, f.keys.AdmissionState("acme"), "t").Val(); n {
		t.Fatal("out-of-scope requests touched the tenant bucket")
	}
	for i := range 5 {
		if d := f.admit(l); !d.Allowed {
			t.Fatalf("in-scope request %d refused after out-of-scope hammering: %v", i, d.Violated)
		}
	}
	// the hammering key was stopped by its own bucket after its burst
	d := f.admit(l, func(p *quotas.AdmitParams) { p.InScope = false; p.Kid = "acme-bad" })
	if !slices.Equal(d.Violated, []string{quotas.KeyRate}) {
		t.Fatalf("hammering key: violated %v, want key_rate", d.Violated)
	}
}

func TestKeyAgentRate(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	l := quotas.Limits{KeyAgentRate: 1, KeyAgentBurst: 2}
	for range 2 {
		if !f.admit(l).Allowed {
			t.Fatal("refused within the (key, agent) burst")
		}
	}
	if d := f.admit(l); !slices.Equal(d.Violated, []string{quotas.KeyAgentRate}) {
		t.Fatalf("violated %v", d.Violated)
	}
	if !f.admit(l, func(p *quotas.AdmitParams) { p.Agent = "other" }).Allowed {
		t.Fatal("another agent of the same key shares the bucket")
	}
}

func TestUserBucketsAreBounded(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	l := quotas.Limits{UserHourly: 1, UserBurst: 1}
	for i := range MaxUsersPerTenant + 50 {
		f.admit(l, func(p *quotas.AdmitParams) { p.User = fmt.Sprintf("user-%d", i) })
	}
	if users := userFields(t, f); users > MaxUsersPerTenant+1 {
		t.Fatalf("user buckets hold %d fields, cap %d (+1 overflow)", users, MaxUsersPerTenant)
	}
	// the 50 users beyond the cap shared one bucket: only the first got through
	d := f.admit(l, func(p *quotas.AdmitParams) { p.User = "yet-another" })
	if d.Allowed {
		t.Fatal("a user beyond the cap got its own fresh bucket")
	}
	// an hour later the full buckets are pruned and new users get their own again
	f.advance(time.Hour + time.Second)
	if !f.admit(l, func(p *quotas.AdmitParams) { p.User = "fresh" }).Allowed {
		t.Fatal("pruning did not make room")
	}
}

func TestSessionLeasesAndRelease(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	l := quotas.Limits{Sessions: 2}
	var ids []string
	for range 2 {
		f.admit(l)
		ids = append(ids, fmt.Sprintf("task-%d", f.n))
	}
	d := f.admit(l)
	if !slices.Equal(d.Violated, []string{quotas.ConcurrentSessions}) {
		t.Fatalf("third session: %v", d.Violated)
	}
	if n, _ := f.q.Release(ctx, nil, "acme", ids[0]); n != 1 {
		t.Fatalf("release removed %d leases", n)
	}
	if n, _ := f.q.Release(ctx, nil, "acme", ids[0]); n != 0 {
		t.Fatal("a second release removed something")
	}
	if !f.admit(l).Allowed {
		t.Fatal("refused after a release")
	}
	// a lease whose task was never released expires on its own
	f.advance(leaseTTL + time.Second)
	if !f.admit(l).Allowed {
		t.Fatal("expired leases still count")
	}
}

func TestLongRunningLease(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	l := quotas.Limits{LongRunning: 1, Sessions: 10}
	long := func(p *quotas.AdmitParams) { p.LongRunning = true }
	if !f.admit(l, long).Allowed {
		t.Fatal("first long task refused")
	}
	if d := f.admit(l, long); !slices.Equal(d.Violated, []string{quotas.LongRunningInflight}) {
		t.Fatalf("second long task: %v", d.Violated)
	}
	if !f.admit(l).Allowed {
		t.Fatal("a short task is refused by the long-running limit")
	}
}

func TestQueueBacklog(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	for i := range 3 {
		f.rdb.ZAdd(ctx, f.keys.TenantQueue("acme"), redis.Z{Score: float64(i), Member: fmt.Sprint(i)})
	}
	if d := f.admit(quotas.Limits{Backlog: 3}); !slices.Equal(d.Violated, []string{quotas.QueueBacklog}) {
		t.Fatalf("backlog full: %v", d.Violated)
	}
	if !f.admit(quotas.Limits{Backlog: 4}).Allowed {
		t.Fatal("refused below the backlog limit")
	}
}

func TestStepsDailySlidingWindow(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	l := quotas.Limits{StepsDaily: 3}
	for range 2 {
		if err := f.q.ReserveStep(ctx, quotas.StepParams{TenantID: "acme", Period: f.period(), Limits: quotas.NoLimits()}); err != nil {
			t.Fatal(err)
		}
	}
	f.advance(5 * time.Hour)
	_ = f.q.ReserveStep(ctx, quotas.StepParams{TenantID: "acme", Period: f.period(), Limits: quotas.NoLimits()})
	d := f.admit(l)
	if !slices.Equal(d.Violated, []string{quotas.AgentStepsDaily}) || scopeOf(d, quotas.AgentStepsDaily).Used != 3 {
		t.Fatalf("after 3 steps: %+v", d)
	}
	// the first two steps leave the window 24 h after their hour
	f.advance(19 * time.Hour)
	if d := f.admit(l); !d.Allowed || scopeOf(d, quotas.AgentStepsDaily).Used != 1 {
		t.Fatalf("24 h after the first steps: %+v", d)
	}
}

func TestMonthlyTokenAndUSDQuotas(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	l := quotas.Limits{TokensMonthly: 1000, USDMonthlyMicro: 50_000_000}
	_ = f.q.ReserveStep(ctx, quotas.StepParams{TenantID: "acme", Tokens: 999, CostMicro: 49_999_999, Period: f.period(), Limits: quotas.NoLimits()})
	if d := f.admit(l); !d.Allowed || scopeOf(d, quotas.AITokensMonthly).Remaining != 1 {
		t.Fatalf("below both quotas: %+v", d)
	}
	_ = f.q.ReserveStep(ctx, quotas.StepParams{TenantID: "acme", Tokens: 1, CostMicro: 1, Period: f.period(), Limits: quotas.NoLimits()})
	d := f.admit(l)
	slices.Sort(d.Violated)
	if !slices.Equal(d.Violated, []string{quotas.AITokensMonthly, quotas.USDMonthly}) {
		t.Fatalf("at both quotas: %v", d.Violated)
	}
	// the next billing period starts from zero
	f.advance(time.Until(f.period().End.Add(time.Hour)) + time.Duration(time.Now().UnixMilli()-f.clock())*time.Millisecond)
	if d := f.admit(l); !d.Allowed {
		t.Fatalf("new period: %v", d.Violated)
	}
}

func TestPeekTakesNothingAndAgreesWithAdmit(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	l := quotas.Limits{TenantRate: 10, TenantBurst: 10, Sessions: 3, StepsDaily: 50, KeyRate: 20, KeyBurst: 40}
	f.admit(l)
	f.admit(l)
	peek := func() quotas.Decision { return f.admit(l, func(p *quotas.AdmitParams) { p.Mode = quotas.ModePeek }) }
	a, b := peek(), peek()
	if scopeOf(a, quotas.TenantRate).Remaining != 8 || scopeOf(b, quotas.TenantRate).Remaining != 8 {
		t.Fatalf("peek remaining %d, %d; want 8 twice", scopeOf(a, quotas.TenantRate).Remaining, scopeOf(b, quotas.TenantRate).Remaining)
	}
	if scopeOf(a, quotas.ConcurrentSessions).Used != 2 || scopeOf(a, quotas.KeyRate).Remaining != 38 {
		t.Fatalf("peek sessions used %v, key remaining %d", scopeOf(a, quotas.ConcurrentSessions).Used, scopeOf(a, quotas.KeyRate).Remaining)
	}
	d := f.admit(l)
	if scopeOf(d, quotas.TenantRate).Remaining != 7 || scopeOf(d, quotas.ConcurrentSessions).Remaining != 0 {
		t.Fatalf("admit after peeks: tenant remaining %d, sessions remaining %d", scopeOf(d, quotas.TenantRate).Remaining, scopeOf(d, quotas.ConcurrentSessions).Remaining)
	}
}

func TestEveryAdmissionKeyExpires(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	l := quotas.Limits{KeyRate: 20, KeyBurst: 40, TenantRate: 5, TenantBurst: 10, KeyAgentRate: 1, KeyAgentBurst: 1,
		UserHourly: 5, UserBurst: 5, Sessions: 3, LongRunning: 1, StepsDaily: 50, TokensMonthly: 100, USDMonthlyMicro: 100}
	f.admit(l, func(p *quotas.AdmitParams) { p.LongRunning = true })
	_ = f.q.ReserveStep(ctx, quotas.StepParams{TenantID: "acme", Tokens: 1, CostMicro: 1, Period: f.period(), Limits: quotas.NoLimits()})
	keys := f.rdb.Keys(ctx, f.keys.Prefix()+"*").Val()
	if len(keys) < 2 {
		t.Fatalf("only %d keys: %v", len(keys), keys)
	}
	for _, k := range keys {
		if ttl := f.rdb.PTTL(ctx, k).Val(); ttl <= 0 {
			t.Errorf("%s has no TTL", k)
		}
	}
}

func TestReserveAndSettleStep(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	l := quotas.Limits{StepsDaily: 3, TokensMonthly: 100, USDMonthlyMicro: 1000}
	p := quotas.StepParams{TenantID: "acme", Period: f.period(), Limits: only(l)}
	used := func() (float64, float64, float64) {
		d := f.admit(quotas.Limits{}, func(a *quotas.AdmitParams) { a.Mode = quotas.ModePeek })
		return scopeOf(d, quotas.AgentStepsDaily).Used, scopeOf(d, quotas.AITokensMonthly).Used, scopeOf(d, quotas.USDMonthly).Used
	}
	// reserve an estimate of 40 tokens, the step used 30: 10 come back
	p.Tokens, p.CostMicro = 40, 400
	if err := f.q.ReserveStep(ctx, p); err != nil {
		t.Fatal(err)
	}
	if s, tok, usd := used(); s != 1 || tok != 40 || usd != 400 {
		t.Fatalf("after reserving: steps %v tokens %v usd %v", s, tok, usd)
	}
	if err := f.q.SettleStep(ctx, nil, quotas.StepParams{TenantID: "acme", Period: f.period(), Tokens: 30 - 40, CostMicro: 500 - 400}); err != nil {
		t.Fatal(err)
	}
	if s, tok, usd := used(); s != 1 || tok != 30 || usd != 500 {
		t.Fatalf("after settling: steps %v tokens %v usd %v, want 1 30 500", s, tok, usd)
	}
	// an estimate that would overdraw the month is refused, naming the quota
	p.Tokens, p.CostMicro = 80, 0
	var qe *quotas.QuotaExceeded
	if err := f.q.ReserveStep(ctx, p); !errors.As(err, &qe) || qe.LimitType != quotas.AITokensMonthly {
		t.Fatalf("overdrawing reservation: %v", err)
	}
	// a failed step gives its reservation back
	p.Tokens = 10
	if err := f.q.ReserveStep(ctx, p); err != nil {
		t.Fatal(err)
	}
	_ = f.q.SettleStep(ctx, nil, quotas.StepParams{TenantID: "acme", Period: f.period(), Steps: -1, Tokens: -10})
	if s, tok, _ := used(); s != 1 || tok != 30 {
		t.Fatalf("after a refund: steps %v tokens %v", s, tok)
	}
	// the day's steps run out
	p.Tokens, p.CostMicro = 0, 0
	_ = f.q.ReserveStep(ctx, p)
	_ = f.q.ReserveStep(ctx, p)
	if err := f.q.ReserveStep(ctx, p); !errors.As(err, &qe) || qe.LimitType != quotas.AgentStepsDaily || qe.Limit != 3 {
		t.Fatalf("fourth step of 3: %v", err)
	}
}

func TestRaisedLimitTakesEffectAtOnce(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	slow := quotas.Limits{TenantRate: 0.01, TenantBurst: 1}
	if !f.admit(slow).Allowed || f.admit(slow).Allowed {
		t.Fatal("burst 1 at 0.01/s: want one admitted, then refused")
	}
	fast := quotas.Limits{TenantRate: 100, TenantBurst: 100}
	for i := range 2 {
		if d := f.admit(fast); !d.Allowed {
			t.Fatalf("request %d right after raising the limit refused: %v", i, d.Violated)
		}
		f.advance(10 * time.Millisecond)
	}
}

// userFields counts the user buckets (overflow included) in the tenant's state hash.
func userFields(t testing.TB, f *qfix) int {
	t.Helper()
	fields, err := f.rdb.HKeys(context.Background(), f.keys.AdmissionState("acme")).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, k := range fields {
		if strings.HasPrefix(k, rkeys.UserPrefix) {
			n++
		}
	}
	return n
}

// The lease sets must outlive their newest lease, though admissions push their expiry
// forward only once per leaseSlack: a set an admission recreates, one whose noted
// expiry is near, and one AddLease recreates all get a full life. A long-running
// task's lease is in the long-running set only, any other's in the session set.
func TestLeaseSetsOutliveTheirNewestLease(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	l := quotas.Limits{Sessions: 10, LongRunning: 10}
	sets := []string{f.keys.Sessions("acme"), f.keys.LongRunning("acme")}
	check := func(when string, atLeast time.Duration) {
		t.Helper()
		for _, k := range sets {
			if ttl := f.rdb.PTTL(ctx, k).Val(); ttl < atLeast-time.Minute {
				t.Errorf("%s: %s lives %v, want at least %v", when, k, ttl, atLeast)
			}
		}
	}
	long := func(p *quotas.AdmitParams) { p.LongRunning = true }
	both := func() { // one lease in each set
		t.Helper()
		if d := f.admit(l, long); !d.Allowed {
			t.Fatalf("long-running admission refused: %v", d.Violated)
		}
		if d := f.admit(l); !d.Allowed {
			t.Fatalf("admission refused: %v", d.Violated)
		}
	}
	releaseAll := func() {
		t.Helper()
		for i := 1; i <= f.n; i++ {
			if _, err := f.q.Release(ctx, nil, "acme", fmt.Sprintf("task-%d", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	both()
	check("first admissions", leaseTTL)
	if n := f.rdb.Exists(ctx, sets...).Val(); n != 2 {
		t.Fatalf("%d of the two lease sets exist after a long-running and a short admission", n)
	}
	if f.rdb.ZScore(ctx, sets[0], "task-1").Err() != redis.Nil || f.rdb.ZScore(ctx, sets[1], "task-2").Err() != redis.Nil {
		t.Fatal("a lease is in both sets, or in the wrong one")
	}
	releaseAll()
	both() // recreates both sets while the noted expiry is far
	check("recreated", leaseTTL)
	for _, k := range sets {
		f.rdb.PExpire(ctx, k, time.Minute)
	}
	f.advance(leaseSlack + time.Minute) // the noted expiry is now less than a lease TTL away
	both()
	check("noted expiry near", leaseTTL)
	releaseAll()
	if err := f.q.AddLease(ctx, "acme", "lost-long", true); err != nil {
		t.Fatal(err)
	}
	if err := f.q.AddLease(ctx, "acme", "lost", false); err != nil {
		t.Fatal(err)
	}
	check("re-added leases", leaseTTL+leaseSlack)
}
