package capacity

import (
	"context"
	"math"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/quotas"
)

// One tenant's refusals, repeated, neither lower a shared pool nor empty its bucket
// while another tenant draws on it; the refused tenant is held back, and says why.
func TestPoolOneTenantsThrottlesKeepThePool(t *testing.T) {
	t.Parallel()
	q, now := newTokenQuotas(t)
	ctx := context.Background()
	pool := quotas.PoolConfig{Name: "shared", TokensPerMinute: 60_000, BurstTokens: 3000}
	if a, _ := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: "calm", Weight: 1, Tokens: 1000}); !a.Granted {
		t.Fatalf("calm's first step: %+v", a)
	}
	var back time.Duration
	for i := range 10 {
		now.Add(max(300, back.Milliseconds()))
		if a, _ := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: "calm", Weight: 1, Tokens: 1}); !a.Granted {
			t.Fatalf("calm refused beside a throttled tenant: %+v", a)
		}
		th, err := q.ThrottlePool(ctx, quotas.PoolThrottleParams{Pool: pool, Tenant: "noisy", Tokens: 1000, RetryAfter: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if th.PoolWide || th.EffectiveRate != 60_000 {
			t.Fatalf("refusal %d of one tenant: %+v, want the pool untouched", i+1, th)
		}
		if th.Backoff < 200*time.Millisecond || (i > 2 && th.Backoff <= back) {
			t.Fatalf("refusal %d: back-off %v after %v, want the retry time at least, growing with the streak", i+1, th.Backoff, back)
		}
		back = th.Backoff
		a, _ := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: "noisy", Weight: 1, Tokens: 1000})
		if a.Granted || !a.Throttled || a.Wait != back {
			t.Fatalf("the refused tenant asks again at once: %+v, want held back %v", a, back)
		}
	}
	now.Add(back.Milliseconds())
	a, _ := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: "calm", Weight: 1, Tokens: 1000})
	if !a.Granted || a.EffectiveRate != 60_000 || a.Level < 1000 {
		t.Fatalf("calm beside a throttled tenant: %+v, want granted at the configured rate from a bucket never emptied", a)
	}
	if a, _ := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: "noisy", Weight: 1, Tokens: 1000}); !a.Granted {
		t.Fatalf("the refused tenant after its back-off: %+v", a)
	}
}

// ThrottlePool's decisions from seeded pool states: who is held back, when the pool
// is lowered and to what, and where its bucket goes.
func TestPoolThrottleEvidence(t *testing.T) {
	t.Parallel()
	const cfg = 120_000 // 2,000 tokens a second
	cases := []struct {
		name   string
		seed   map[string]string // pool state fields; "t" and the level default to now and the burst
		active []string          // tenants that asked lately
		p      quotas.PoolThrottleParams
		want   quotas.PoolThrottle
		level  int64 // the bucket after, tokens
		c      int64 // the learned rate after (0: none)
	}{
		{name: "one tenant among others: held back, the bucket down one step at most",
			active: []string{"a", "b"},
			p:      quotas.PoolThrottleParams{Tenant: "a", Tokens: 4000, RetryAfter: 3 * time.Second},
			want:   quotas.PoolThrottle{EffectiveRate: cfg, Backoff: 3 * time.Second}, level: 4000},
		{name: "one tenant: the retry time says more is left than a step",
			active: []string{"a", "b"},
			p:      quotas.PoolThrottleParams{Tenant: "a", Tokens: 1000, RetryAfter: 200 * time.Millisecond},
			want:   quotas.PoolThrottle{EffectiveRate: cfg, Backoff: 200 * time.Millisecond}, level: 7000},
		{name: "a streak: the bucket stays, the back-off doubles past the retry time",
			seed:   map[string]string{"k:a": "-500:4:800", "l": "6000"},
			active: []string{"a", "b"},
			p:      quotas.PoolThrottleParams{Tenant: "a", Tokens: 1000, RetryAfter: 200 * time.Millisecond},
			want:   quotas.PoolThrottle{EffectiveRate: cfg, Backoff: 1600 * time.Millisecond}, level: 6000},
		{name: "a step granted before the back-off, refused during it: the same streak step",
			seed:   map[string]string{"k:a": "-100:3:400", "b:a": "+300", "l": "6000"},
			active: []string{"a", "b"},
			p:      quotas.PoolThrottleParams{Tenant: "a", Tokens: 1000, RetryAfter: 200 * time.Millisecond},
			want:   quotas.PoolThrottle{EffectiveRate: cfg, Backoff: 300 * time.Millisecond}, level: 6000},
		{name: "the same, with a later retry time",
			seed:   map[string]string{"k:a": "-100:1:400", "b:a": "+300", "l": "6000"},
			active: []string{"a", "b"},
			p:      quotas.PoolThrottleParams{Tenant: "a", Tokens: 1000, RetryAfter: 700 * time.Millisecond},
			want:   quotas.PoolThrottle{EffectiveRate: cfg, Backoff: 700 * time.Millisecond}, level: 6000},
		{name: "a streak ends after a quiet",
			seed:   map[string]string{"k:a": "-20000:4:800"},
			active: []string{"a", "b"},
			p:      quotas.PoolThrottleParams{Tenant: "a", Tokens: 1000, RetryAfter: 50 * time.Millisecond},
			want:   quotas.PoolThrottle{EffectiveRate: cfg, Backoff: 100 * time.Millisecond}, level: 7000},
		{name: "another tenant refused lately: the pool drops, the bucket to what is left upstream",
			seed:   map[string]string{"y": "-1000:b"},
			active: []string{"a", "b"},
			p:      quotas.PoolThrottleParams{Tenant: "a", Tokens: 4000, RetryAfter: time.Second},
			want:   quotas.PoolThrottle{EffectiveRate: 84_000, Backoff: time.Second, PoolWide: true}, level: 2600},
		{name: "another tenant refused long ago: not evidence",
			seed:   map[string]string{"y": "-6000:b"},
			active: []string{"a", "b"},
			p:      quotas.PoolThrottleParams{Tenant: "a", Tokens: 4000, RetryAfter: time.Second},
			want:   quotas.PoolThrottle{EffectiveRate: cfg, Backoff: time.Second}, level: 4000},
		{name: "the only tenant asking, refused once: held back only",
			active: []string{"a"},
			p:      quotas.PoolThrottleParams{Tenant: "a", Tokens: 1000, RetryAfter: time.Second},
			want:   quotas.PoolThrottle{EffectiveRate: cfg, Backoff: time.Second}, level: 7000},
		{name: "the only tenant asking, refused again: the pool drops",
			seed:   map[string]string{"k:a": "-1000:1:1000", "y": "-1000:a"},
			active: []string{"a"},
			p:      quotas.PoolThrottleParams{Tenant: "a", Tokens: 1000, RetryAfter: time.Second},
			want:   quotas.PoolThrottle{EffectiveRate: 84_000, Backoff: time.Second, PoolWide: true}, level: 0},
		{name: "measured between two pool-wide refusals: 95 % of the upstream's rate",
			// 10 s since the last: 10,000 tokens served, 800 short then (0.4 s at 1,000/s),
			// 4,000 short now (3.6 s): (10000 + 4000 − 800) ÷ (10 + 3.6 − 0.4) s = 1,000/s
			seed:   map[string]string{"y": "-100:b", "s": "-10000:1000:800:400", "g": "11000", "e": "90000"},
			active: []string{"a", "b"},
			p:      quotas.PoolThrottleParams{Tenant: "a", Tokens: 4000, RetryAfter: 3600 * time.Millisecond},
			want:   quotas.PoolThrottle{EffectiveRate: 57_000, Backoff: 3600 * time.Millisecond, PoolWide: true}, level: 580, c: 60_000},
		{name: "a measurement never takes more than half the rate at once",
			seed:   map[string]string{"y": "-100:b", "s": "-10000:1000:800:400", "g": "1000", "e": "90000"},
			active: []string{"a", "b"},
			p:      quotas.PoolThrottleParams{Tenant: "a", Tokens: 800, RetryAfter: 400 * time.Millisecond},
			want:   quotas.PoolThrottle{EffectiveRate: 45_000, Backoff: 400 * time.Millisecond, PoolWide: true}, level: 500}, // nothing served: nothing learned
		{name: "a pool-wide refusal right after the last changes no rate",
			seed:   map[string]string{"y": "-100:b", "s": "-1000:1000:800:400", "g": "3000", "e": "60000"},
			active: []string{"a", "b"},
			p:      quotas.PoolThrottleParams{Tenant: "a", Tokens: 800, RetryAfter: 400 * time.Millisecond},
			want:   quotas.PoolThrottle{EffectiveRate: 60_000, Backoff: 400 * time.Millisecond, PoolWide: true}, level: 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			q, now := newTokenQuotas(t)
			ctx := context.Background()
			pool := quotas.PoolConfig{Name: "p", TokensPerMinute: cfg, BurstTokens: 8000}
			tc.p.Pool = pool
			seed := []any{"t", now.Load(), "l", 8000}
			for k, v := range tc.seed {
				// times relative to now: "-100:…" is 100 ms ago, "+300" 300 ms on
				if n, err := strconv.ParseInt(v[:max(1, indexColon(v))], 10, 64); err == nil && (v[0] == '-' || v[0] == '+') && k != "l" {
					v = strconv.FormatInt(now.Load()+n, 10) + v[indexColon(v):]
				}
				seed = append(seed, k, v)
			}
			if err := q.Pools.rdb.HSet(ctx, q.Pools.keys.PoolState(pool.Name), seed...).Err(); err != nil {
				t.Fatal(err)
			}
			for _, a := range tc.active {
				q.Pools.rdb.ZAdd(ctx, q.Pools.keys.PoolClaims(pool.Name), redis.Z{Score: float64(now.Load() + 1000), Member: a})
			}
			got, err := q.ThrottlePool(ctx, tc.p)
			if err != nil || got != tc.want {
				t.Fatalf("throttle: %+v %v, want %+v", got, err, tc.want)
			}
			st, err := q.PoolStatus(ctx, pool)
			if err != nil || st.Level != tc.level {
				t.Fatalf("level after %d %v, want %d", st.Level, err, tc.level)
			}
			c, _ := q.Pools.rdb.HGet(ctx, q.Pools.keys.PoolState(pool.Name), "c").Float64()
			if int64(math.Round(c)) != tc.c {
				t.Fatalf("learned rate %v, want %d", c, tc.c)
			}
		})
	}
}

func indexColon(s string) int {
	for i := range len(s) {
		if s[i] == ':' {
			return i
		}
	}
	return len(s)
}

// Near the rate it learned, the pool climbs slowly: 0.2 % of that rate a second from
// 2 s after the last pool-wide refusal, 2 % of the configured rate a second away
// from it.
func TestPoolClimbsSlowlyNearTheLearnedRate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		eff, c, want int64 // after 10 s, 2 s of them quiet
	}{
		{eff: 57_000, c: 60_000, want: 57_960},   // + 8 s × 120
		{eff: 30_000, c: 60_000, want: 49_200},   // + 8 s × 2,400
		{eff: 80_000, c: 60_000, want: 99_200},   // past 1.25 × c: fast again
		{eff: 100_000, c: 0, want: 119_200},      // nothing learned
		{eff: 119_000, c: 60_000, want: 120_000}, // never past the configured rate
	} {
		q, now := newTokenQuotas(t)
		ctx := context.Background()
		pool := quotas.PoolConfig{Name: "p", TokensPerMinute: 120_000, BurstTokens: 8000}
		seed := []any{"t", now.Load(), "x", now.Load(), "e", tc.eff}
		if tc.c > 0 {
			seed = append(seed, "c", tc.c)
		}
		q.Pools.rdb.HSet(ctx, q.Pools.keys.PoolState(pool.Name), seed...)
		now.Add(10_000)
		a, err := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: "a", Weight: 1, Tokens: 1})
		if err != nil || a.EffectiveRate != tc.want {
			t.Fatalf("from %d (learned %d), 10 s on: %+v %v, want %d", tc.eff, tc.c, a, err, tc.want)
		}
	}
}

// The pool learns an upstream that allows half its configured rate when its tenants'
// steps differ in size: simulated workers (virtual time, real Redis) reserve each
// step, call an upstream token bucket of 1,000 tokens a second (burst 8,000) that
// says when a refused step would fit, and wait what they are told. After 50 s at most
// 10 % of the step answers are refusals and the upstream's capacity is used at 0.8 or
// more.
func TestPoolLearnsUpstreamWithMixedSizes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		tenants []upTenant
	}{
		{"800 and 4,000, 8 workers", []upTenant{{"small", 800, 4}, {"large", 4000, 4}}},
		{"800, 2,000 and 4,000, 12 workers", []upTenant{{"small", 800, 4}, {"mid", 2000, 4}, {"large", 4000, 4}}},
		{"four tenants of 500 to 6,000, weights alike, 16 workers", []upTenant{{"a", 500, 4}, {"b", 1500, 4}, {"c", 3000, 4}, {"d", 6000, 4}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ratio, achieved, answers := simulateUpstream(t, tc.tenants)
			t.Logf("after 50 s: %d answers, %.3f refused, %.2f of the upstream used", answers, ratio, achieved)
			if ratio > 0.10 || achieved < 0.8 {
				t.Fatalf("after 50 s: %.3f of %d step answers refused (want <= 0.10), %.2f of the upstream used (want >= 0.8)", ratio, answers, achieved)
			}
		})
	}
}

type upTenant struct {
	name    string
	tokens  int64
	workers int
}

// simulateUpstream runs the tenants' workers for 100 virtual seconds on a pool of
// 2,000 tokens a second (burst 8,000) whose upstream allows 1,000 (burst 8,000), and
// returns, for the last 50 s, the share of step answers that were refusals, the
// upstream's capacity used and the number of answers.
func simulateUpstream(t *testing.T, tenants []upTenant) (ratio, achieved float64, answers int) {
	q, now := newTokenQuotas(t)
	ctx := context.Background()
	pool := quotas.PoolConfig{Name: "learn", TokensPerMinute: 120_000, BurstTokens: 8000}
	type worker struct {
		tenant string
		tokens int64
		next   int64
	}
	var ws []*worker
	for _, tn := range tenants {
		for range tn.workers {
			ws = append(ws, &worker{tenant: tn.name, tokens: tn.tokens, next: now.Load()})
		}
	}
	t0 := now.Load()
	upLevel, upAt := 8000.0, t0
	var ok, refused int
	var used int64
	for {
		sort.SliceStable(ws, func(i, j int) bool { return ws[i].next < ws[j].next })
		w := ws[0]
		if w.next >= t0+100_000 {
			break
		}
		now.Store(w.next)
		a, err := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: pool, Tenant: w.tenant, Weight: 1, Tokens: w.tokens})
		if err != nil {
			t.Fatal(err)
		}
		if !a.Granted {
			w.next += max(a.Wait.Milliseconds(), 50) // a park and its dispatch take that long
			continue
		}
		upLevel, upAt = math.Min(8000, upLevel+float64(w.next-upAt)), w.next
		late := w.next >= t0+50_000
		if upLevel >= float64(w.tokens) {
			upLevel -= float64(w.tokens)
			w.next += 100 // the step runs; its estimate was exact
			if late {
				ok++
				used += w.tokens
			}
			continue
		}
		retry := time.Duration((float64(w.tokens) - upLevel) * float64(time.Millisecond))
		if late {
			refused++
		}
		if _, err := q.GiveBackPool(ctx, nil, quotas.PoolSettleParams{Pool: pool, Tenant: w.tenant, Tokens: w.tokens}); err != nil {
			t.Fatal(err)
		}
		th, err := q.ThrottlePool(ctx, quotas.PoolThrottleParams{Pool: pool, Tenant: w.tenant, Tokens: w.tokens, RetryAfter: retry})
		if err != nil {
			t.Fatal(err)
		}
		if os.Getenv("DEBUG_SIM") != "" {
			t.Logf("%6d %s refused (level %.0f) retry %v: %+v", w.next-t0, w.tenant, upLevel, retry, th)
		}
		w.next += max(retry, th.Backoff).Milliseconds()
	}
	return float64(refused) / float64(max(1, ok+refused)), float64(used) / 50_000, ok + refused
}
