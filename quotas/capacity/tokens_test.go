package capacity

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
)

const tokensT0 = 1_700_000_000_000

// testCapacity is a test's buckets and pools, on one Redis and one clock.
type testCapacity struct {
	*Buckets
	*Pools
}

func newTokenQuotas(t *testing.T) (*testCapacity, *atomic.Int64) {
	t.Helper()
	rdb, keys := testenv.Redis(t, 4)
	var now atomic.Int64
	now.Store(tokensT0)
	return &testCapacity{NewBuckets(rdb, keys, now.Load), NewPools(rdb, keys, now.Load)}, &now
}

func TestTenantTokensBurstRateRefundAndDebt(t *testing.T) {
	t.Parallel()
	q, now := newTokenQuotas(t)
	ctx := context.Background()
	p := quotas.TenantTokensParams{Tenant: "tt", PerMinute: 6000} // 100 tokens a second, burst 6000
	steps := []struct {
		name     string
		advance  time.Duration
		reserve  int64
		settle   int64 // applied when reserve == 0
		granted  bool
		wait     time.Duration
		level    int64
		settleTo int64
	}{
		{name: "a full bucket grants its burst", reserve: 6000, granted: true, level: 0},
		{name: "an empty one says how long", reserve: 500, wait: 5 * time.Second},
		{name: "refilled at the rate", advance: 5 * time.Second, reserve: 500, granted: true, level: 0},
		{name: "a refund comes back", settle: -300, settleTo: 300},
		{name: "a refund never passes the burst", settle: -1_000_000, settleTo: 6000},
		{name: "an excess is debt", advance: 0, reserve: 6000, granted: true, level: 0},
		{name: "debt settles below zero", settle: 1000, settleTo: -1000},
		{name: "and delays the next grant", reserve: 100, wait: 11 * time.Second},
		{name: "an ask above the burst needs a full bucket", advance: 70 * time.Second, reserve: 9000, granted: true, level: -3000},
	}
	for _, s := range steps {
		now.Add(s.advance.Milliseconds())
		if s.reserve == 0 {
			p.Tokens = s.settle
			lvl, err := q.SettleTenantTokens(ctx, p)
			if err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			if lvl != s.settleTo {
				t.Fatalf("%s: level %d, want %d", s.name, lvl, s.settleTo)
			}
			continue
		}
		p.Tokens = s.reserve
		a, err := q.ReserveTenantTokens(ctx, p)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if a.Granted != s.granted || a.Wait != s.wait || (s.granted && a.Level != s.level) {
			t.Fatalf("%s: %+v, want granted %v wait %v level %d", s.name, a, s.granted, s.wait, s.level)
		}
	}
	if _, err := q.ReserveTenantTokens(ctx, quotas.TenantTokensParams{Tenant: "tt"}); err == nil {
		t.Fatal("a bucket without a rate reserved")
	}
}

// simPool drives tenants that each want steps of a fixed size from one pool: a tenant
// asks when its last wait is over, as a parked task comes back when it was told to.
type simTenant struct {
	name   string
	weight int
	step   int64
	every  time.Duration // a light tenant asks at most this often; 0: as often as it may
	next   int64
	got    int64
	waits  []time.Duration
	asked  int64 // when the pending ask was first made (for waits)
	asking bool
}

func runPool(t *testing.T, q *testCapacity, now *atomic.Int64, pool quotas.PoolConfig, tenants []*simTenant, d, tick time.Duration) {
	t.Helper()
	ctx := context.Background()
	end := now.Load() + d.Milliseconds()
	for now.Load() < end {
		for _, st := range tenants {
			if now.Load() < st.next {
				continue
			}
			if !st.asking {
				st.asking, st.asked = true, now.Load()
			}
			a, err := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: st.name, Weight: st.weight, Tokens: st.step})
			if err != nil {
				t.Fatal(err)
			}
			if !a.Granted {
				st.next = now.Load() + a.Wait.Milliseconds()
				continue
			}
			st.got += st.step
			st.waits = append(st.waits, time.Duration(now.Load()-st.asked)*time.Millisecond)
			st.asking = false
			st.next = now.Load() + st.every.Milliseconds()
		}
		now.Add(tick.Milliseconds())
	}
}

func TestPoolUncontendedGivesAll(t *testing.T) {
	t.Parallel()
	q, now := newTokenQuotas(t)
	pool := quotas.PoolConfig{Name: "solo", TokensPerMinute: 60_000, BurstTokens: 5000}
	a := &simTenant{name: "a", weight: 1, step: 1000}
	runPool(t, q, now, pool, []*simTenant{a}, 10*time.Second, 10*time.Millisecond)
	// burst 5,000 plus 1,000 a second for 10 s
	if a.got < 14_000 || a.got > 15_000 {
		t.Fatalf("a lone tenant got %d tokens in 10 s, want about 15000 (all of burst and rate)", a.got)
	}
}

func TestPoolSharesByWeightInTokens(t *testing.T) {
	t.Parallel()
	q, now := newTokenQuotas(t)
	pool := quotas.PoolConfig{Name: "shared", TokensPerMinute: 120_000, BurstTokens: 6000}
	a := &simTenant{name: "a", weight: 1, step: 1000}
	b := &simTenant{name: "b", weight: 2, step: 1000}
	c := &simTenant{name: "c", weight: 1, step: 250} // smaller steps, same weight as a
	runPool(t, q, now, pool, []*simTenant{a, b, c}, 2*time.Second, 5*time.Millisecond)
	a.got, b.got, c.got = 0, 0, 0 // the first burst went to whoever came first
	runPool(t, q, now, pool, []*simTenant{a, b, c}, 60*time.Second, 5*time.Millisecond)
	tot := float64(a.got + b.got + c.got)
	for _, w := range []struct {
		st   *simTenant
		want float64
	}{{a, 0.25}, {b, 0.5}, {c, 0.25}} {
		if got := float64(w.st.got) / tot; math.Abs(got-w.want) > 0.02 {
			t.Errorf("tenant %s (weight %d, steps of %d) got %.3f of the pool, want %.2f", w.st.name, w.st.weight, w.st.step, got, w.want)
		}
	}
	if tot > 120_000*1.01 || tot < 120_000*0.95 {
		t.Errorf("the pool let %.0f tokens through in 60 s, want about its rate, 120000", tot)
	}
}

// A tenant asking for less than its share is served at once in a saturated pool:
// the tenants at or past the line leave one step's worth for it.
func TestPoolServesALightTenantAtOnce(t *testing.T) {
	t.Parallel()
	q, now := newTokenQuotas(t)
	pool := quotas.PoolConfig{Name: "busy", TokensPerMinute: 60_000, BurstTokens: 3000}
	heavy1 := &simTenant{name: "h1", weight: 1, step: 1000}
	heavy2 := &simTenant{name: "h2", weight: 1, step: 1000}
	light := &simTenant{name: "l", weight: 1, step: 500, every: 3 * time.Second}
	runPool(t, q, now, pool, []*simTenant{heavy1, heavy2, light}, 60*time.Second, 5*time.Millisecond)
	var worst time.Duration
	for _, w := range light.waits {
		worst = max(worst, w)
	}
	if worst > 10*time.Millisecond {
		t.Fatalf("the light tenant waited up to %v beside two flooding tenants; want at once", worst)
	}
	if heavy1.got+heavy2.got < 50_000 {
		t.Fatalf("the flooding tenants got %d of the pool's ~60000 a minute", heavy1.got+heavy2.got)
	}
}

// In any 60 s window a pool lets through at most its burst plus a minute's rate, plus
// the largest step's excess over its estimate.
func TestPoolWindowBoundWithSettlement(t *testing.T) {
	t.Parallel()
	q, now := newTokenQuotas(t)
	ctx := context.Background()
	pool := quotas.PoolConfig{Name: "window", TokensPerMinute: 30_000, BurstTokens: 10_000}
	type grant struct{ at, tokens int64 }
	var grants []grant
	var maxExcess int64
	end := now.Load() + 180_000
	for i := 0; now.Load() < end; i++ {
		est := int64(500)
		a, err := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: "w", Weight: 1, Tokens: est})
		if err != nil {
			t.Fatal(err)
		}
		if a.Granted {
			actual := est + int64(i%7-3)*100 // refunds and debts alike
			if _, err := q.SettlePool(ctx, nil, quotas.PoolSettleParams{Pool: pool, Tenant: "w", Tokens: actual - est}); err != nil {
				t.Fatal(err)
			}
			maxExcess = max(maxExcess, actual-est)
			grants = append(grants, grant{now.Load(), actual})
		}
		now.Add(7)
	}
	allowed := pool.Burst() + pool.TokensPerMinute + maxExcess
	for i := range grants {
		var sum int64
		for j := i; j < len(grants) && grants[j].at < grants[i].at+60_000; j++ {
			sum += grants[j].tokens
		}
		if sum > allowed {
			t.Fatalf("a window from %d ms let %d tokens through, the bucket allows %d", grants[i].at-tokensT0, sum, allowed)
		}
	}
	st, err := q.PoolStatus(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if st.UsedLastMinute < 25_000 || st.UsedLastMinute > 31_000 {
		t.Fatalf("used in the last minute %d, want about the rate, 30000", st.UsedLastMinute)
	}
}

func TestPoolThrottlingLowersAndRestoresTheRate(t *testing.T) {
	t.Parallel()
	q, now := newTokenQuotas(t)
	ctx := context.Background()
	pool := quotas.PoolConfig{Name: "aimd", TokensPerMinute: 100_000}
	// Refusals of two tenants in turn: evidence about the pool, with no measurement
	// (each comes within 3 s of the last pool-wide one, or there is none).
	throttle := func(tenant string) int64 {
		t.Helper()
		th, err := q.ThrottlePool(ctx, quotas.PoolThrottleParams{Pool: pool, Tenant: tenant, Tokens: 10, RetryAfter: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return th.EffectiveRate
	}
	if eff := throttle("b"); eff != 100_000 {
		t.Fatalf("after one tenant's refusal: %d, want the configured 100000", eff)
	}
	if eff := throttle("a"); eff != 70_000 {
		t.Fatalf("after two tenants' refusals: %d, want 70000", eff)
	}
	if eff := throttle("b"); eff != 70_000 {
		t.Fatalf("a refusal right after lowered the rate again: %d", eff)
	}
	a, _ := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: "c", Weight: 1, Tokens: 10})
	if a.Granted || a.EffectiveRate != 70_000 {
		t.Fatalf("after a pool-wide refusal: %+v, want refused (the retry time holds for the pool) at the lowered rate 70000", a)
	}
	for i := range 300 {
		now.Add(2000)
		throttle([]string{"a", "b"}[i%2])
	}
	if eff := throttle("a"); eff != 1000 {
		t.Fatalf("rate after many refusals %d, want the floor 1000", eff)
	}
	// nothing throttled: +2 % of 100,000 a second from 2 s on
	now.Add(13_000)
	_, _ = q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: "c", Weight: 1, Tokens: 1})
	st, _ := q.PoolStatus(ctx, pool)
	if st.EffectiveRate != 23_000 {
		t.Fatalf("rate 13 s after the last throttle %d, want 1000 + 11 s × 2000", st.EffectiveRate)
	}
	now.Add(120_000)
	_, _ = q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: "c", Weight: 1, Tokens: 1})
	if st, _ = q.PoolStatus(ctx, pool); st.EffectiveRate != 100_000 || st.Throttled {
		t.Fatalf("rate long after %d (throttled %v), want the configured 100000", st.EffectiveRate, st.Throttled)
	}
}

// A tenant that took a place in line and never came back (its tasks were cancelled)
// holds the others up only until its place lapses.
func TestPoolPlaceLapses(t *testing.T) {
	t.Parallel()
	q, now := newTokenQuotas(t)
	ctx := context.Background()
	pool := quotas.PoolConfig{Name: "lapse", TokensPerMinute: 60_000, BurstTokens: 1000}
	ask := func(tenant string) quotas.TokenAnswer {
		t.Helper()
		a, err := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: tenant, Weight: 1, Tokens: 1000})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	if !ask("a").Granted {
		t.Fatal("first ask refused")
	}
	ask("b") // b waits about 1 s, then never comes back
	now.Add(200)
	first := ask("a")
	if first.Granted {
		t.Fatal("a was served ahead of b, which waits with a smaller pass")
	}
	st, err := q.PoolStatus(ctx, pool)
	if err != nil || len(st.Waiting) != 2 {
		t.Fatalf("waiting %+v %v, want a and b", st.Waiting, err)
	}
	now.Add((first.Wait + poolClaimGrace + time.Second).Milliseconds())
	if a := ask("a"); !a.Granted {
		t.Fatalf("a is still held up by b's lapsed place: %+v", a)
	}
}

func TestPoolRequestsPerMinute(t *testing.T) {
	t.Parallel()
	q, now := newTokenQuotas(t)
	ctx := context.Background()
	pool := quotas.PoolConfig{Name: "rpm", TokensPerMinute: 1_000_000, RequestsPerMinute: 60}
	granted := 0
	for range 200 {
		if a, _ := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: "a", Weight: 1, Tokens: 1}); a.Granted {
			granted++
		}
		now.Add(100)
	}
	// 60 at once, then one a second for 20 s
	if granted < 79 || granted > 81 {
		t.Fatalf("granted %d requests in 20 s, want 60 + 20", granted)
	}
}

// The usage report's read of a tenant's bucket: full before any reservation, what a
// reservation took as used, refilled at the rate as time passes, debt as more than
// the burst, and nothing changed by reading.
func TestTenantTokensLevel(t *testing.T) {
	t.Parallel()
	q, now := newTokenQuotas(t)
	ctx := context.Background()
	p := quotas.TenantTokensParams{Tenant: "tl", PerMinute: 6000} // 100 tokens a second
	check := func(name string, level, used int64, fullIn time.Duration) {
		t.Helper()
		st, err := q.TenantTokensLevel(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Level != level || st.Used != used || st.FullIn != fullIn {
			t.Fatalf("%s: %+v, want level %d used %d full in %v", name, st, level, used, fullIn)
		}
	}
	check("untouched", 6000, 0, 0)
	p.Tokens = 1500
	if a, err := q.ReserveTenantTokens(ctx, p); err != nil || !a.Granted {
		t.Fatalf("reserve: %+v %v", a, err)
	}
	check("after a reservation", 4500, 1500, 15*time.Second)
	check("reading changes nothing", 4500, 1500, 15*time.Second)
	now.Add(5000)
	check("refilled for 5 s", 5000, 1000, 10*time.Second)
	p.Tokens = 7000
	if _, err := q.SettleTenantTokens(ctx, p); err != nil {
		t.Fatal(err)
	}
	check("in debt", -2000, 8000, 80*time.Second)
	now.Add(120_000)
	check("full again", 6000, 0, 0)
	if _, err := q.TenantTokensLevel(ctx, quotas.TenantTokensParams{Tenant: "tl"}); err == nil {
		t.Fatal("a bucket without a rate was read")
	}
}

// Tenants with several steps waiting at once (several workers each, steps of mixed
// sizes) still share the pool by weight: one of a tenant's grants does not let a
// tenant further back pass it before its other asks come back.
func TestPoolSharesByWeightWithSeveralWorkers(t *testing.T) {
	t.Parallel()
	q, now := newTokenQuotas(t)
	pool := quotas.PoolConfig{Name: "workers", TokensPerMinute: 600_000, BurstTokens: 20_000}
	weights := map[string]int{"a": 1, "b": 2, "c": 4}
	var sims []*simTenant
	for _, name := range []string{"a", "b", "c"} {
		for _, step := range []int64{500, 2000, 8000} {
			// each step runs 100 ms before its worker asks again, so a tenant's asks
			// come back at different times
			sims = append(sims, &simTenant{name: name, weight: weights[name], step: step, every: 100 * time.Millisecond})
		}
	}
	runPool(t, q, now, pool, sims, 2*time.Second, time.Millisecond)
	for _, s := range sims {
		s.got = 0
	}
	runPool(t, q, now, pool, sims, 30*time.Second, time.Millisecond)
	got := map[string]float64{}
	var tot float64
	for _, s := range sims {
		got[s.name] += float64(s.got)
		tot += float64(s.got)
	}
	for name, w := range weights {
		if share, want := got[name]/tot, float64(w)/7; math.Abs(share-want) > 0.02 {
			t.Errorf("tenant %s (weight %d, three workers) got %.3f of the pool, want %.3f", name, w, share, want)
		}
	}
}

// runPoolSettled is runPool with every grant settled at once for its actual use,
// actual(est) tokens, as the worker does once the step has run. The settlement
// names no weight: the pool settles at the weight the reservation wrote.
func runPoolSettled(t *testing.T, q *testCapacity, now *atomic.Int64, pool quotas.PoolConfig, tenants []*simTenant, actual func(int64) int64, d, tick time.Duration) {
	t.Helper()
	ctx := context.Background()
	end := now.Load() + d.Milliseconds()
	for now.Load() < end {
		for _, st := range tenants {
			if now.Load() < st.next {
				continue
			}
			a, err := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: st.name, Weight: st.weight, Tokens: st.step})
			if err != nil {
				t.Fatal(err)
			}
			if !a.Granted {
				st.next = now.Load() + a.Wait.Milliseconds()
				continue
			}
			used := actual(st.step)
			if _, err := q.SettlePool(ctx, nil, quotas.PoolSettleParams{Pool: pool, Tenant: st.name, Tokens: used - st.step}); err != nil {
				t.Fatal(err)
			}
			st.got += used
			st.next = now.Load() + st.every.Milliseconds()
		}
		now.Add(tick.Milliseconds())
	}
}

// Weights hold in the tokens really used when every estimate falls short (an agent
// whose context grows): a settlement moves a tenant's pass at its weight, as its
// reservation did.
func TestPoolSharesByWeightWhenEstimatesFallShort(t *testing.T) {
	t.Parallel()
	for _, short := range []float64{0.3, 0.5} {
		q, now := newTokenQuotas(t)
		pool := quotas.PoolConfig{Name: "short", TokensPerMinute: 60_000, BurstTokens: 9000}
		a := &simTenant{name: "a", weight: 1, step: 1000}
		b := &simTenant{name: "b", weight: 2, step: 1000}
		// an estimate short by 30 % is 70 % of the actual use
		actual := func(est int64) int64 { return int64(math.Round(float64(est) / (1 - short))) }
		tenants := []*simTenant{a, b}
		runPoolSettled(t, q, now, pool, tenants, actual, 10*time.Second, 5*time.Millisecond)
		a.got, b.got = 0, 0
		runPoolSettled(t, q, now, pool, tenants, actual, 60*time.Second, 5*time.Millisecond)
		if share := float64(b.got) / float64(a.got+b.got); math.Abs(share-2.0/3) > 0.02 {
			t.Errorf("estimates %.0f %% short: the weight-2 tenant got %.3f of the pool's tokens, want 0.667", short*100, share)
		}
	}
}

// A head of the line that never comes back (its task cancelled, its worker gone)
// holds the tenants behind it until its place lapses, but they do not ask every
// millisecond meanwhile: an ask that is not next in line waits at least until the
// head is due back, then as long again as the head is overdue.
func TestPoolAskBehindAnAbsentHeadDoesNotSpin(t *testing.T) {
	t.Parallel()
	q, now := newTokenQuotas(t)
	ctx := context.Background()
	pool := quotas.PoolConfig{Name: "absent", TokensPerMinute: 60_000, BurstTokens: 10_000}
	ask := func(tenant string, tokens int64) quotas.TokenAnswer {
		t.Helper()
		a, err := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: tenant, Weight: 1, Tokens: tokens})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	if !ask("b", 500).Granted {
		t.Fatal("b's first ask refused")
	}
	h := ask("h", 10_000) // h waits for a full bucket, then never comes back
	if h.Granted {
		t.Fatal("h's ask above the level was granted")
	}
	began, asks := now.Load(), 0
	for {
		asks++
		a := ask("b", 500)
		if a.Granted {
			break
		}
		if a.Wait < time.Millisecond || asks > 1000 {
			t.Fatalf("ask %d told %v", asks, a.Wait)
		}
		now.Add(a.Wait.Milliseconds())
	}
	waited := time.Duration(now.Load()-began) * time.Millisecond
	if asks > 10 {
		t.Fatalf("b asked %d times in %v behind a head that never came back; want a few", asks, waited)
	}
	if lapse := h.Wait + poolClaimGrace; waited > lapse+poolMinIneligible {
		t.Fatalf("b was served %v after the head's ask, its place lapses after %v", waited, lapse)
	}
}

// A give-back (a granted step that did not run) undoes what its reservation did: the
// tokens and the request go back, the tenant's pass moves back at its weight, and the
// virtual time goes back when the grant moved it.
func TestPoolGiveBackUndoesTheReservation(t *testing.T) {
	t.Parallel()
	q, _ := newTokenQuotas(t)
	ctx := context.Background()
	pool := quotas.PoolConfig{Name: "giveback", TokensPerMinute: 60_000, BurstTokens: 10_000, RequestsPerMinute: 60}
	passes, state := q.Pools.keys.PoolPasses(pool.Name), q.Pools.keys.PoolState(pool.Name)
	num := func(key, field string) float64 {
		t.Helper()
		f, err := q.Pools.rdb.HGet(ctx, key, field).Float64()
		if err != nil {
			t.Fatalf("%s %s: %v", key, field, err)
		}
		return f
	}
	grant := func(tenant string, w int) {
		t.Helper()
		if a, err := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: tenant, Weight: w, Tokens: 1000}); err != nil || !a.Granted {
			t.Fatalf("%s: %+v %v", tenant, a, err)
		}
	}
	giveBack := func(tenant string) {
		t.Helper()
		if _, err := q.GiveBackPool(ctx, nil, quotas.PoolSettleParams{Pool: pool, Tenant: tenant, Tokens: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	// Another tenant's debt leaves the bucket below half its burst, so every grant
	// below is paced.
	if _, err := q.SettlePool(ctx, nil, quotas.PoolSettleParams{Pool: pool, Tenant: "other", Tokens: 5000}); err != nil {
		t.Fatal(err)
	}
	grant("b", 1)
	grant("b", 1) // from pass 1000: the virtual time moves to 1000
	grant("a", 2) // from the virtual time, 1000, to 1500
	steps := []struct {
		name              string
		tenant            string
		pass, vt, level   float64
		requests, passOfB float64
	}{
		{name: "a weight-2 tenant's pass moves back by half", tenant: "a", pass: 1000, vt: 1000, level: 3000, requests: 58, passOfB: 2000},
		{name: "a grant that moved the virtual time moves it back", tenant: "b", pass: 1000, vt: 0, level: 4000, requests: 59, passOfB: 1000},
	}
	for _, s := range steps {
		giveBack(s.tenant)
		got := []float64{num(passes, "p:"+s.tenant), num(state, "v"), num(state, "l"), num(state, "r"), num(passes, "p:b")}
		want := []float64{s.pass, s.vt, s.level, s.requests, s.passOfB}
		if !slices.Equal(got, want) {
			t.Fatalf("%s: pass, virtual time, level, requests, b's pass %v, want %v", s.name, got, want)
		}
	}
}

// A try at a pool is granted as an ask would be; refused, it answers the wait an ask
// would be told and takes nothing: no tokens, no request, no place in line.
func TestPoolTryTakesNoPlace(t *testing.T) {
	t.Parallel()
	q, _ := newTokenQuotas(t)
	ctx := context.Background()
	batch := redisx.NewBatch(q.Pools.rdb, 0)
	try := func(p quotas.PoolReserveParams) (quotas.TokenAnswer, error) {
		var answer func() (quotas.TokenAnswer, error)
		_ = batch.Do(ctx, func(pipe redis.Pipeliner) { answer = q.TryPool(ctx, pipe, p) })
		return answer()
	}
	pool := quotas.PoolConfig{Name: "try", TokensPerMinute: 60_000, BurstTokens: 1000, RequestsPerMinute: 60}
	if a, err := try(quotas.PoolReserveParams{Pool: pool, Tenant: "d", Weight: 1, Tokens: 1000}); err != nil || !a.Granted {
		t.Fatalf("d's try of the idle pool's burst: %+v %v, want a grant", a, err)
	}
	p := quotas.PoolReserveParams{Pool: pool, Tenant: "c", Weight: 1, Tokens: 500}
	before := q.Pools.rdb.HGetAll(ctx, q.Pools.keys.PoolState(pool.Name)).Val()
	w, err := try(p)
	if err != nil || w.Granted || w.Wait <= 0 {
		t.Fatalf("a try of a drained pool: %+v %v, want a wait", w, err)
	}
	if after := q.Pools.rdb.HGetAll(ctx, q.Pools.keys.PoolState(pool.Name)).Val(); !maps.Equal(before, after) {
		t.Fatalf("a refused try changed the pool: %v, then %v", before, after)
	}
	if _, err := q.Pools.rdb.ZScore(ctx, q.Pools.keys.PoolWaiters(pool.Name), "c").Result(); err == nil {
		t.Fatal("a refused try took a place in line")
	}
	if a, _ := q.ReservePool(ctx, p); a.Granted || a.Wait != w.Wait {
		t.Fatalf("the reservation answered %+v after a try told %v", a, w.Wait)
	}
	if _, err := q.Pools.rdb.ZScore(ctx, q.Pools.keys.PoolWaiters(pool.Name), "c").Result(); err != nil {
		t.Fatal("the ask after the try took no place in line")
	}
}

// While no tenant waits and the bucket keeps half its burst, a grant is not paced: it
// takes the tokens and the request and counts the tenant among the recent askers, but
// moves no pass and no virtual time, and says so, so that its give-back moves none
// either. Once the bucket would keep less than half, grants are paced again.
func TestPoolGrantsUnpacedWhileNoOneWaits(t *testing.T) {
	t.Parallel()
	q, _ := newTokenQuotas(t)
	ctx := context.Background()
	pool := quotas.PoolConfig{Name: "unpaced", TokensPerMinute: 60_000, BurstTokens: 10_000, RequestsPerMinute: 60}
	passes, state, claims := q.Pools.keys.PoolPasses(pool.Name), q.Pools.keys.PoolState(pool.Name), q.Pools.keys.PoolClaims(pool.Name)
	reserve := func(tokens int64) quotas.TokenAnswer {
		t.Helper()
		a, err := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: "b", Weight: 1, Tokens: tokens})
		if err != nil || !a.Granted {
			t.Fatalf("ask of %d: %+v %v", tokens, a, err)
		}
		return a
	}
	if a := reserve(1000); !a.Unpaced || a.Level != 9000 {
		t.Fatalf("a grant from a full bucket: %+v, want unpaced at level 9000", a)
	}
	if n := q.Pools.rdb.HLen(ctx, passes).Val(); n != 0 {
		t.Fatalf("an unpaced grant wrote %d pass fields", n)
	}
	if _, err := q.Pools.rdb.ZScore(ctx, claims, "b").Result(); err != nil {
		t.Fatalf("the tenant is not among the recent askers: %v", err)
	}
	if _, err := q.GiveBackPool(ctx, nil, quotas.PoolSettleParams{Pool: pool, Tenant: "b", Tokens: 1000, Unpaced: true}); err != nil {
		t.Fatal(err)
	}
	if l, _ := q.Pools.rdb.HGet(ctx, state, "l").Float64(); l != 10_000 || q.Pools.rdb.HLen(ctx, passes).Val() != 0 {
		t.Fatalf("after the give-back: level %v, %d pass fields; want 10000 and none", l, q.Pools.rdb.HLen(ctx, passes).Val())
	}
	reserve(4000) // level 6000, still half
	if a := reserve(2000); a.Unpaced {
		t.Fatalf("a grant leaving 4000 of a 10000 burst: %+v, want paced", a)
	}
	if p, _ := q.Pools.rdb.HGet(ctx, passes, "p:b").Float64(); p != 2000 {
		t.Fatalf("b's pass %v after its paced grant of 2000, want 2000", p)
	}
}

// A busy pool does not keep the pass of every tenant that ever drew on it: a tenant
// gone (its place lapsed) whose pass the virtual time has caught up with is pruned.
func TestPoolPrunesTheTenantsThatLeft(t *testing.T) {
	t.Parallel()
	q, now := newTokenQuotas(t)
	ctx := context.Background()
	pool := quotas.PoolConfig{Name: "prune", TokensPerMinute: 6_000_000, BurstTokens: 100_000}
	for i := range 200 {
		if a, _ := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: fmt.Sprintf("once%d", i), Weight: 1, Tokens: 100}); !a.Granted {
			t.Fatalf("tenant %d refused", i)
		}
	}
	// one tenant draws on alone for a minute: the virtual time passes the others'
	for range 600 {
		now.Add(100)
		if _, err := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: "busy", Weight: 1, Tokens: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	if n := q.Pools.rdb.HLen(ctx, q.Pools.keys.PoolPasses(pool.Name)).Val(); n > 60 {
		t.Fatalf("the passes hold %d fields for one tenant drawing; want the 200 gone tenants pruned", n)
	}
}

// A task that leaves while it waits for a pool (cancelled while parked) drops its
// tenant's place in line, so the tenants behind it are served at once rather than
// when the place lapses; a place a later ask of the tenant holds stays.
func TestPoolLeaveDropsThePlace(t *testing.T) {
	t.Parallel()
	q, now := newTokenQuotas(t)
	ctx := context.Background()
	pool := quotas.PoolConfig{Name: "leave", TokensPerMinute: 60_000, BurstTokens: 10_000}
	ask := func(tenant string, tokens int64) quotas.TokenAnswer {
		t.Helper()
		a, err := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: tenant, Weight: 1, Tokens: tokens})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	at := func(d time.Duration) time.Time { return time.UnixMilli(now.Load()).Add(d) }
	ask("b", 6000)        // paced: the bucket keeps less than half its burst
	h := ask("h", 10_000) // h's task parks for the full bucket
	if ok, err := q.LeavePool(ctx, pool.Name, "h", at(h.Wait-time.Second)); err != nil || ok {
		t.Fatalf("an ask due before h's latest left: dropped %v %v; want the place kept", ok, err)
	}
	if ask("b", 500).Granted {
		t.Fatal("b was served ahead of h's place")
	}
	if ok, err := q.LeavePool(ctx, pool.Name, "h", at(h.Wait)); err != nil || !ok {
		t.Fatalf("h's parked task left: dropped %v %v; want the place dropped", ok, err)
	}
	if a := ask("b", 500); !a.Granted {
		t.Fatalf("b behind a place that was left: %+v, want served at once", a)
	}
	if name, ok := pool.WaitReason().Pool(); !ok || name != pool.Name {
		t.Fatalf("%q.Pool() = %q, %v", pool.WaitReason(), name, ok)
	}
	if _, ok := agentqtype.WaitTokensPerMinute.Pool(); ok {
		t.Fatal("tokens_per_minute read as a pool")
	}
}
