package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/capacity"
)

// TokensResult is the result of `agentq bench tokens`: the model pool's algorithm
// (quotas.ReservePool, SettlePool, ThrottlePool) driven on real Redis by simulated
// workers that reserve, wait what a refusal tells them, run and settle, as the worker
// does around each agent step.
type TokensResult struct {
	PoolTokensPerMinute int64   `json:"pool_tokens_per_minute"`
	PoolBurstTokens     int64   `json:"pool_burst_tokens"`
	StepSizes           []int64 `json:"step_sizes"`
	WorkersPerTenant    int     `json:"workers_per_tenant"`
	StepMs              float64 `json:"step_ms"`
	FloodS              float64 `json:"flood_s"`
	// PoolShares are the flooding tenants' shares (by weight, "w1", "w2", "w4") of the
	// actual tokens granted after the warm-up; PoolShareMaxError is the largest
	// distance of one from its entitlement w/Σw.
	PoolShares        map[string]float64 `json:"pool_shares"`
	PoolShareMaxError float64            `json:"pool_share_max_error"`
	FloodSteps        int                `json:"flood_steps"`
	FloodRefunds      int                `json:"flood_refunds"`
	FloodDebts        int                `json:"flood_debts"`
	// PoolWindowMaxRatio is the most actual tokens granted in any 60 s window over the
	// burst plus a minute's rate; PoolWindowAllowedExcessRatio is the largest single
	// step's excess over its estimate over the same, the bound's slack.
	PoolWindowMaxRatio           float64 `json:"pool_window_max_ratio"`
	PoolWindowAllowedExcessRatio float64 `json:"pool_window_allowed_excess_ratio"`
	// The light tenant's waits from its first ask to its grant, beside the flood and
	// alone on an idle pool.
	LightPoolWaitP50Ms            float64 `json:"light_pool_wait_p50_ms"`
	LightPoolWaitP99Ms            float64 `json:"light_pool_wait_p99_ms"`
	LightPoolWaitMaxMs            float64 `json:"light_pool_wait_max_ms"`
	LightPoolWaitP99UncontendedMs float64 `json:"light_pool_wait_p99_uncontended_ms"`
	LightSteps                    int     `json:"light_steps"`
	LightStepsUncontended         int     `json:"light_steps_uncontended"`
	// ShortEstimateShares are the flooding tenants' shares of the actual tokens when
	// every estimate falls 30 to 50 % short (an agent whose context grows: a step uses
	// 1/0.7 to 1/0.5 of what it reserved), after the warm-up; ShortEstimateShareMaxError
	// is the largest distance of one from its entitlement.
	ShortEstimateShares        map[string]float64 `json:"short_estimate_shares"`
	ShortEstimateShareMaxError float64            `json:"short_estimate_share_max_error"`
	ShortEstimateS             float64            `json:"short_estimate_s"`
	ShortEstimateSteps         int                `json:"short_estimate_steps"`
	// The pool configured for twice what its upstream allows: throttled steps over all
	// tried, and tokens that succeeded a second over the upstream's rate, in the window
	// after the warm-up.
	AIMDUpstreamTokensPerMinute int64   `json:"aimd_upstream_tokens_per_minute"`
	AIMDUpstreamBurstTokens     int64   `json:"aimd_upstream_burst_tokens"`
	AIMDThrottledRatio          float64 `json:"aimd_throttled_ratio"`
	AIMDAchievedRatio           float64 `json:"aimd_achieved_ratio"`
	AIMDSteps                   int     `json:"aimd_steps"`
	AIMDThrottled               int     `json:"aimd_throttled"`
	AIMDEffectiveRateMean       float64 `json:"aimd_effective_rate_mean"`
	AIMDWarmupS                 float64 `json:"aimd_warmup_s"`
	AIMDWindowS                 float64 `json:"aimd_window_s"`
	// The same with mixed step sizes: two tenants of 800- and 4,000-token steps on a
	// pool of 120,000 tokens a minute (burst 8,000) whose upstream allows half
	// (burst 8,000).
	AIMDMixedStepSizes      []int64 `json:"aimd_mixed_step_sizes"`
	AIMDMixedThrottledRatio float64 `json:"aimd_mixed_throttled_ratio"`
	AIMDMixedAchievedRatio  float64 `json:"aimd_mixed_achieved_ratio"`
	AIMDMixedSteps          int     `json:"aimd_mixed_steps"`
	AIMDMixedThrottled      int     `json:"aimd_mixed_throttled"`
	AIMDMixedWarmupS        float64 `json:"aimd_mixed_warmup_s"`
	AIMDMixedWindowS        float64 `json:"aimd_mixed_window_s"`
	// RetryAfterMs is the least retry time a simulated upstream's refusal says; it
	// says the time until the refused step fits when that is longer.
	RetryAfterMs float64 `json:"retry_after_ms"`
}

// TokensConfig configures `agentq bench tokens`; zero fields take the defaults.
type TokensConfig struct {
	Redis  redis.UniversalClient
	Prefix string // the benchmark's keys, deleted at the end; a fresh one when empty

	PoolTokensPerMinute int64         // 6,000,000 (100,000 a second)
	PoolBurstTokens     int64         // 500,000
	Workers             int           // simulated workers per flooding tenant, 8
	Step                time.Duration // how long a step runs, 100 ms
	Flood               time.Duration // the flood of the shares and window, 75 s
	Warmup              time.Duration // the flood's first seconds, left out of the shares: 5 s
	LightEvery          time.Duration // between the light tenant's asks, 200 ms
	Uncontended         time.Duration // the light tenant alone, 10 s
	ShortFlood          time.Duration // the flood whose estimates fall short, 40 s
	AIMDWarmup          time.Duration // before the throttling window, 60 s
	AIMDWindow          time.Duration // the throttling window, 30 s
	RetryAfter          time.Duration // the least retry time a refusal says, 100 ms
	MixedWarmup         time.Duration // before the mixed sizes' throttling window, 50 s
	MixedWindow         time.Duration // the mixed sizes' throttling window, 50 s
	// UpstreamBurst is the simulated upstream's burst in tokens; one second of its
	// rate (half the pool's) by default.
	UpstreamBurst int64
	// Only runs one scenario alone: "flood", "alone", "aimd" or "aimd-mixed".
	Only     string
	Seed     uint64
	Progress io.Writer
}

// tokenStepSizes are the flooding tenants' step estimates: each tenant draws every
// step from all three, so the pool shares tokens, not steps.
var tokenStepSizes = []int64{500, 2000, 8000}

// floodTenants are the tenants flooding the pool: weights 1, 2 and 4.
var floodTenants = []tokTenant{{name: "w1", weight: 1}, {name: "w2", weight: 2}, {name: "w4", weight: 4}}

const (
	lightStepTokens = 500
	tokenWindow     = time.Minute
	estimateSpread  = 0.2 // actual use is the estimate ±20 %
)

func (c *TokensConfig) defaults() {
	c.PoolTokensPerMinute = orInt64(c.PoolTokensPerMinute, 6_000_000)
	c.PoolBurstTokens = orInt64(c.PoolBurstTokens, 500_000)
	c.Workers = orInt(c.Workers, 8)
	c.Step = orDur(c.Step, 100*time.Millisecond)
	c.Flood = orDur(c.Flood, 75*time.Second)
	c.Warmup = orDur(c.Warmup, 5*time.Second)
	c.LightEvery = orDur(c.LightEvery, 200*time.Millisecond)
	c.Uncontended = orDur(c.Uncontended, 10*time.Second)
	c.ShortFlood = orDur(c.ShortFlood, 40*time.Second)
	c.AIMDWarmup = orDur(c.AIMDWarmup, time.Minute)
	c.AIMDWindow = orDur(c.AIMDWindow, 30*time.Second)
	c.RetryAfter = orDur(c.RetryAfter, 100*time.Millisecond)
	c.MixedWarmup = orDur(c.MixedWarmup, 50*time.Second)
	c.MixedWindow = orDur(c.MixedWindow, 50*time.Second)
	if c.Seed == 0 {
		c.Seed = 1
	}
}

// Tokens runs every scenario of `agentq bench tokens`, one after the other, each on a
// pool of its own under the benchmark's prefix.
func Tokens(ctx context.Context, cfg TokensConfig) (TokensResult, error) {
	if cfg.Redis == nil {
		return TokensResult{}, errors.New("bench: tokens: no Redis client")
	}
	cfg.defaults()
	if cfg.Prefix == "" {
		cfg.Prefix = fmt.Sprintf("benchtok%d:", time.Now().UnixNano())
	}
	defer redisx.DeletePrefix(context.WithoutCancel(ctx), cfg.Redis, cfg.Prefix)
	b := &tokBench{cfg: cfg, q: capacity.NewPools(cfg.Redis, rkeys.New(cfg.Prefix, 1), nil)}
	out := TokensResult{
		PoolTokensPerMinute: cfg.PoolTokensPerMinute, PoolBurstTokens: cfg.PoolBurstTokens,
		StepSizes: tokenStepSizes, WorkersPerTenant: cfg.Workers, StepMs: ms(cfg.Step),
		FloodS: cfg.Flood.Seconds(), RetryAfterMs: ms(cfg.RetryAfter),
	}
	scenarios := []struct {
		name, what string
		run        func(context.Context, *TokensResult) error
	}{
		{"flood", fmt.Sprintf("tenants of weights 1, 2, 4 flood a pool of %d tokens a minute (%d workers each), a light tenant beside, %v…",
			cfg.PoolTokensPerMinute, cfg.Workers, cfg.Flood), b.flood},
		{"alone", fmt.Sprintf("the light tenant alone on an idle pool, %v…", cfg.Uncontended), b.lightAlone},
		{"short", fmt.Sprintf("tenants of weights 1, 2, 4 flood the pool with estimates 30-50 %% short, %v…", cfg.ShortFlood), b.shortEstimates},
		{"aimd", fmt.Sprintf("the same flood on a pool whose upstream allows half its rate, %v then %v measured…",
			cfg.AIMDWarmup, cfg.AIMDWindow), b.aimd},
		{"aimd-mixed", fmt.Sprintf("tenants of 800- and 4,000-token steps on a pool whose upstream allows half its rate, %v then %v measured…",
			cfg.MixedWarmup, cfg.MixedWindow), b.aimdMixed},
	}
	for _, s := range scenarios {
		if cfg.Only != "" && cfg.Only != s.name {
			continue
		}
		b.log("%s", s.what)
		if err := s.run(ctx, &out); err != nil {
			return out, err
		}
	}
	return out, nil
}

type tokBench struct {
	cfg TokensConfig
	q   *capacity.Pools
}

func (b *tokBench) log(f string, a ...any) {
	if b.cfg.Progress != nil {
		fmt.Fprintf(b.cfg.Progress, f+"\n", a...)
	}
}

func (b *tokBench) pool(name string) quotas.PoolConfig {
	return quotas.PoolConfig{Name: name, TokensPerMinute: b.cfg.PoolTokensPerMinute, BurstTokens: b.cfg.PoolBurstTokens}
}

// poolMinute is what a pool's bucket lets through in a minute: its burst and a
// minute's rate.
func poolMinute(p quotas.PoolConfig) float64 {
	return float64(p.Burst()) + float64(p.TokensPerMinute)*tokenWindow.Minutes()
}

// flood runs the three flooding tenants and the light tenant on one pool: the shares,
// the 60 s window and the light tenant's contended waits.
func (b *tokBench) flood(ctx context.Context, out *TokensResult) error {
	s := b.newSim(b.pool("flood"), nil)
	start := time.Now()
	until := start.Add(b.cfg.Flood)
	var wg sync.WaitGroup
	s.floodAll(ctx, &wg, until)
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.light(ctx, until)
	}()
	wg.Wait()
	if s.err != nil {
		return fmt.Errorf("flood: %w", s.err)
	}
	tokens := map[string]float64{}
	var excess int64
	var waits []float64
	for _, st := range s.steps {
		excess = max(excess, st.actual-st.est)
		if st.tenant == lightTenant.name {
			waits = append(waits, ms(st.wait))
			continue
		}
		out.FloodSteps++
		if st.actual < st.est {
			out.FloodRefunds++
		} else if st.actual > st.est {
			out.FloodDebts++
		}
		if st.at.Sub(start) >= b.cfg.Warmup {
			tokens[st.tenant] += float64(st.actual)
		}
	}
	out.PoolShares, out.PoolShareMaxError = floodShares(tokens)
	minute := poolMinute(s.pool)
	out.PoolWindowMaxRatio = round4(float64(maxWindow(s.steps, tokenWindow)) / minute)
	out.PoolWindowAllowedExcessRatio = math.Round(float64(excess)/minute*1e6) / 1e6
	out.LightSteps = len(waits)
	out.LightPoolWaitP50Ms = round1(percentile(waits, 0.50))
	out.LightPoolWaitP99Ms = round1(percentile(waits, 0.99))
	out.LightPoolWaitMaxMs = round1(percentile(waits, 1))
	return nil
}

// shortEstimates floods a pool with the three weighted tenants whose every step uses
// more than it reserved, by 1/0.7 to 1/0.5 (estimates 30 to 50 % short): the shares of
// the tokens really used, which the settlements' weighted passes keep.
func (b *tokBench) shortEstimates(ctx context.Context, out *TokensResult) error {
	s := b.newSim(b.pool("short"), nil)
	s.actual = shortOf
	start := time.Now()
	var wg sync.WaitGroup
	s.floodAll(ctx, &wg, start.Add(b.cfg.ShortFlood))
	wg.Wait()
	if s.err != nil {
		return fmt.Errorf("short estimates: %w", s.err)
	}
	tokens := map[string]float64{}
	for _, st := range s.steps {
		if st.at.Sub(start) >= b.cfg.Warmup {
			tokens[st.tenant] += float64(st.actual)
			out.ShortEstimateSteps++
		}
	}
	out.ShortEstimateS = b.cfg.ShortFlood.Seconds()
	out.ShortEstimateShares, out.ShortEstimateShareMaxError = floodShares(tokens)
	return nil
}

// floodShares are the flooding tenants' shares of tokens (by tenant), and the largest
// distance of one from its entitlement w/Σw.
func floodShares(tokens map[string]float64) (map[string]float64, float64) {
	var total float64
	sumW := 0
	for _, t := range floodTenants {
		total += tokens[t.name]
		sumW += t.weight
	}
	shares, maxErr := map[string]float64{}, 0.0
	if total == 0 {
		return shares, 0
	}
	for _, t := range floodTenants {
		share := tokens[t.name] / total
		shares[t.name] = round4(share)
		maxErr = max(maxErr, round4(math.Abs(share-float64(t.weight)/float64(sumW))))
	}
	return shares, maxErr
}

// shortOf is a step's actual use when its estimate falls 30 to 50 % short.
func shortOf(rng *rand.Rand, est int64) int64 {
	return int64(math.Round(float64(est) / (0.5 + 0.2*rng.Float64())))
}

// lightAlone runs the light tenant alone on an idle pool: the uncontended waits.
func (b *tokBench) lightAlone(ctx context.Context, out *TokensResult) error {
	s := b.newSim(b.pool("idle"), nil)
	s.light(ctx, time.Now().Add(b.cfg.Uncontended))
	if s.err != nil {
		return fmt.Errorf("uncontended: %w", s.err)
	}
	waits := make([]float64, 0, len(s.steps))
	for _, st := range s.steps {
		waits = append(waits, ms(st.wait))
	}
	out.LightStepsUncontended = len(waits)
	out.LightPoolWaitP99UncontendedMs = round1(percentile(waits, 0.99))
	return nil
}

// aimd floods a pool whose upstream really allows half its configured rate: a step
// the upstream refuses is throttled (refunded, ThrottlePool, retried after the
// retry-after), and after the warm-up the window's throttled steps and achieved rate
// show how well the effective rate follows the upstream.
func (b *tokBench) aimd(ctx context.Context, out *TokensResult) error {
	pool := b.pool("aimd")
	upRate := pool.TokensPerMinute / 2
	upBurst := orInt64(b.cfg.UpstreamBurst, upRate/60)
	up := newUpstream(upRate, upBurst)
	s := b.newSim(pool, up)
	start := time.Now()
	from, until := start.Add(b.cfg.AIMDWarmup), start.Add(b.cfg.AIMDWarmup+b.cfg.AIMDWindow)
	var wg sync.WaitGroup
	s.floodAll(ctx, &wg, until)
	wg.Wait()
	if s.err != nil {
		return fmt.Errorf("aimd: %w", s.err)
	}
	w := s.window(from, until)
	out.AIMDSteps, out.AIMDThrottled = w.steps, w.throttled
	out.AIMDUpstreamTokensPerMinute, out.AIMDUpstreamBurstTokens = upRate, upBurst
	out.AIMDWarmupS, out.AIMDWindowS = b.cfg.AIMDWarmup.Seconds(), b.cfg.AIMDWindow.Seconds()
	out.AIMDThrottledRatio = w.throttledRatio()
	out.AIMDEffectiveRateMean = w.effMean()
	out.AIMDAchievedRatio = round4(w.tokens / b.cfg.AIMDWindow.Seconds() / (float64(upRate) / 60))
	return nil
}

// mixedTenants are the tenants of the mixed sizes' scenario, with their step sizes.
var mixedTenants = []struct {
	tokTenant
	tokens int64
}{{tokTenant{name: "small", weight: 1}, 800}, {tokTenant{name: "large", weight: 1}, 4000}}

// aimdMixed floods a pool of 120,000 tokens a minute whose upstream allows 60,000
// (both with a burst of 8,000) with steps of two sizes, one tenant each, each step
// using exactly its estimate: the window after the warm-up shows whether the pool
// learned the upstream's rate.
func (b *tokBench) aimdMixed(ctx context.Context, out *TokensResult) error {
	pool := quotas.PoolConfig{Name: "aimd-mixed", TokensPerMinute: 120_000, BurstTokens: 8000}
	up := newUpstream(60_000, 8000)
	s := b.newSim(pool, up)
	from := time.Now().Add(b.cfg.MixedWarmup)
	until := from.Add(b.cfg.MixedWindow)
	var wg sync.WaitGroup
	for _, t := range mixedTenants {
		out.AIMDMixedStepSizes = append(out.AIMDMixedStepSizes, t.tokens)
		for range b.cfg.Workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(until) && !s.failed() && ctx.Err() == nil {
					if err := s.step(ctx, t.tokTenant, t.tokens, t.tokens, until); err != nil {
						s.record(tokStep{}, err)
					}
				}
			}()
		}
	}
	wg.Wait()
	if s.err != nil {
		return fmt.Errorf("aimd mixed: %w", s.err)
	}
	w := s.window(from, until)
	out.AIMDMixedSteps, out.AIMDMixedThrottled = w.steps, w.throttled
	out.AIMDMixedWarmupS, out.AIMDMixedWindowS = b.cfg.MixedWarmup.Seconds(), b.cfg.MixedWindow.Seconds()
	out.AIMDMixedThrottledRatio = w.throttledRatio()
	out.AIMDMixedAchievedRatio = round4(w.tokens / b.cfg.MixedWindow.Seconds() / 1000)
	return nil
}

// simWindow sums the steps of a window: tried, throttled, the tokens of those that
// ran, and the effective rates their grants carried.
type simWindow struct {
	steps, throttled int
	tokens, effSum   float64
}

func (w simWindow) throttledRatio() float64 {
	if w.steps == 0 {
		return 0
	}
	return round4(float64(w.throttled) / float64(w.steps))
}

func (w simWindow) effMean() float64 {
	if w.steps == 0 {
		return 0
	}
	return math.Round(w.effSum / float64(w.steps))
}

// window sums the steps granted in [from, until).
func (s *tokSim) window(from, until time.Time) simWindow {
	var w simWindow
	for _, st := range s.steps {
		if st.at.Before(from) || !st.at.Before(until) {
			continue
		}
		w.steps++
		w.effSum += float64(st.eff)
		if st.throttled {
			w.throttled++
			continue
		}
		w.tokens += float64(st.actual)
	}
	return w
}

// tokTenant is a simulated tenant of a pool.
type tokTenant struct {
	name   string
	weight int
}

var lightTenant = tokTenant{name: "light", weight: 1}

// tokStep is one step a simulated worker tried: when its reservation was granted,
// its estimate and actual use, its wait from first ask to grant, the effective rate
// the grant carried, and whether the upstream throttled it.
type tokStep struct {
	tenant      string
	at          time.Time
	est, actual int64
	wait        time.Duration
	eff         int64
	throttled   bool
}

// tokSim is the simulated workers of one pool.
type tokSim struct {
	q    *capacity.Pools
	pool quotas.PoolConfig
	cfg  TokensConfig
	up   *upstream // nil: the upstream takes whatever the pool grants
	// actual is a step's actual use given its estimate; actualOf unless set.
	actual func(*rand.Rand, int64) int64

	mu    sync.Mutex
	steps []tokStep
	err   error
}

func (b *tokBench) newSim(pool quotas.PoolConfig, up *upstream) *tokSim {
	return &tokSim{q: b.q, pool: pool, cfg: b.cfg, up: up, actual: actualOf}
}

func (s *tokSim) record(st tokStep, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.err == nil {
			s.err = err
		}
		return
	}
	s.steps = append(s.steps, st)
}

func (s *tokSim) failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err != nil
}

// floodAll starts the flooding tenants' workers; each runs steps until until.
func (s *tokSim) floodAll(ctx context.Context, wg *sync.WaitGroup, until time.Time) {
	for ti, t := range floodTenants {
		for w := range s.cfg.Workers {
			rng := rand.New(rand.NewPCG(s.cfg.Seed, uint64(ti*1000+w)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(until) && !s.failed() && ctx.Err() == nil {
					est := tokenStepSizes[rng.IntN(len(tokenStepSizes))]
					if err := s.step(ctx, t, est, s.actual(rng, est), until); err != nil {
						s.record(tokStep{}, err)
					}
				}
			}()
		}
	}
}

// light asks for a small step every LightEvery until until; each step runs on its
// own, so the asks keep their pace.
func (s *tokSim) light(ctx context.Context, until time.Time) {
	rng := rand.New(rand.NewPCG(s.cfg.Seed, 1<<32))
	var wg sync.WaitGroup
	defer wg.Wait()
	for next := time.Now(); next.Before(until) && !s.failed(); next = next.Add(s.cfg.LightEvery) {
		if !sleepCtx(ctx, time.Until(next)) {
			return
		}
		wg.Add(1)
		go func(actual int64) {
			defer wg.Done()
			if err := s.step(ctx, lightTenant, lightStepTokens, actual, until); err != nil {
				s.record(tokStep{}, err)
			}
		}(actualOf(rng, lightStepTokens))
	}
}

// actualOf is a step's actual use: its estimate ±20 %, so settlements both refund
// and carry debt.
func actualOf(rng *rand.Rand, est int64) int64 {
	return int64(math.Round(float64(est) * (1 + estimateSpread*(2*rng.Float64()-1))))
}

// step is one step as the worker runs it: reserve the estimate (sleeping each
// refusal's Wait and asking again), call the upstream, run, settle actual − estimate.
// A step the upstream throttles used nothing: it is refunded, reported with
// ThrottlePool, and reserved again after the retry time (or the tenant's back-off,
// when longer). A step still waiting at until gives up unrecorded.
func (s *tokSim) step(ctx context.Context, t tokTenant, est, actual int64, until time.Time) error {
	asked := time.Now()
	for {
		a, err := s.reserve(ctx, t, est, until)
		if err != nil || !a.Granted {
			return err
		}
		st := tokStep{tenant: t.name, at: time.Now(), est: est, actual: actual, wait: time.Since(asked), eff: a.EffectiveRate}
		if ok, wait := s.take(actual); !ok {
			retry := max(wait, s.cfg.RetryAfter)
			st.throttled = true
			if err := s.settle(ctx, t, -est); err != nil {
				return err
			}
			th, err := s.q.ThrottlePool(ctx, quotas.PoolThrottleParams{Pool: s.pool, Tenant: t.name, Tokens: est, RetryAfter: retry})
			if err != nil {
				return err
			}
			s.record(st, nil)
			if !sleepCtx(ctx, max(retry, th.Backoff)) {
				return nil
			}
			asked = time.Now()
			continue
		}
		time.Sleep(s.cfg.Step) // the step runs; it settles even when the run is over
		if err := s.settle(context.WithoutCancel(ctx), t, actual-est); err != nil {
			return err
		}
		s.record(st, nil)
		return nil
	}
}

func (s *tokSim) reserve(ctx context.Context, t tokTenant, est int64, until time.Time) (quotas.TokenAnswer, error) {
	for {
		a, err := s.q.ReservePool(ctx, quotas.PoolReserveParams{Pool: s.pool, Tenant: t.name, Weight: t.weight, Tokens: est})
		if err != nil || a.Granted {
			return a, err
		}
		if time.Now().Add(a.Wait).After(until) || !sleepCtx(ctx, a.Wait) {
			return quotas.TokenAnswer{}, nil
		}
	}
}

func (s *tokSim) settle(ctx context.Context, t tokTenant, delta int64) error {
	_, err := s.q.SettlePool(ctx, nil, quotas.PoolSettleParams{Pool: s.pool, Tenant: t.name, Tokens: delta})
	return err
}

// upstream is the model provider behind a pool, simulated: a token bucket of its own
// that a step's actual tokens come out of when its call starts.
type upstream struct {
	mu           sync.Mutex
	perMs, burst float64
	level        float64
	t            time.Time
}

func newUpstream(perMinute, burst int64) *upstream {
	return &upstream{perMs: float64(perMinute) / 60_000, burst: float64(burst), level: float64(burst), t: time.Now()}
}

// take takes n tokens from the simulation's upstream, if any; ok = false is its
// 429, with the time until n tokens fit.
func (s *tokSim) take(n int64) (ok bool, wait time.Duration) {
	if s.up == nil {
		return true, 0
	}
	return s.up.take(n)
}

// take takes n tokens when the upstream has them; false is its 429, with the time
// until they are there.
func (u *upstream) take(n int64) (bool, time.Duration) {
	u.mu.Lock()
	defer u.mu.Unlock()
	now := time.Now()
	u.level = math.Min(u.burst, u.level+float64(now.Sub(u.t).Microseconds())/1000*u.perMs)
	u.t = now
	if u.level < float64(n) {
		return false, time.Duration((float64(n) - u.level) / u.perMs * float64(time.Millisecond))
	}
	u.level -= float64(n)
	return true, 0
}

// maxWindow is the most actual tokens of the steps granted (and not throttled) in
// any window of length d.
func maxWindow(steps []tokStep, d time.Duration) int64 {
	s := slices.Clone(steps)
	slices.SortFunc(s, func(a, b tokStep) int { return a.at.Compare(b.at) })
	var best, sum int64
	lo := 0
	for _, st := range s {
		if st.throttled {
			continue
		}
		sum += st.actual
		for ; st.at.Sub(s[lo].at) >= d; lo++ {
			if !s[lo].throttled {
				sum -= s[lo].actual
			}
		}
		best = max(best, sum)
	}
	return best
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func orInt64(v, d int64) int64 {
	if v <= 0 {
		return d
	}
	return v
}

func orDur(v, d time.Duration) time.Duration {
	if v <= 0 {
		return d
	}
	return v
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func round4(f float64) float64 { return math.Round(f*1e4) / 1e4 }
