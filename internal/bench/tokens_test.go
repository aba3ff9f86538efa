package bench

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/agentq/agentq/internal/testenv"
)

// A short run of the tokens benchmark: every scenario produces its fields, and they
// are sane (the shares sum to one, the ratios are positive); the targets are the
// benchmark's, not this test's.
func TestTokensBenchProducesEveryField(t *testing.T) {
	t.Parallel()
	rdb, keys := testenv.Redis(t, 1)
	res, err := Tokens(context.Background(), TokensConfig{
		Redis: rdb, Prefix: keys.Prefix(), Workers: 3, Flood: 3 * time.Second, Warmup: 500 * time.Millisecond,
		Uncontended: time.Second, ShortFlood: 3 * time.Second, AIMDWarmup: 2 * time.Second, AIMDWindow: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, name := range []string{"w1", "w2", "w4"} {
		if res.PoolShares[name] <= 0 {
			t.Errorf("tenant %s's share %v", name, res.PoolShares[name])
		}
		sum += res.PoolShares[name]
	}
	if math.Abs(sum-1) > 0.001 || len(res.PoolShares) != 3 {
		t.Errorf("shares %v sum to %v", res.PoolShares, sum)
	}
	if res.PoolShareMaxError < 0 || res.PoolShareMaxError > 1 {
		t.Errorf("share error %v", res.PoolShareMaxError)
	}
	if len(res.ShortEstimateShares) != 3 || res.ShortEstimateSteps == 0 || res.ShortEstimateShareMaxError > 1 {
		t.Errorf("short estimates: shares %v (max error %v), %d steps", res.ShortEstimateShares, res.ShortEstimateShareMaxError, res.ShortEstimateSteps)
	}
	if res.FloodSteps == 0 || res.FloodRefunds == 0 || res.FloodDebts == 0 {
		t.Errorf("flood steps %d, refunds %d, debts %d", res.FloodSteps, res.FloodRefunds, res.FloodDebts)
	}
	// a 3 s flood lets through the burst and 3 s of rate, well under a minute's worth
	if res.PoolWindowMaxRatio <= 0 || res.PoolWindowMaxRatio > 0.5 || res.PoolWindowAllowedExcessRatio <= 0 {
		t.Errorf("window ratio %v, allowed excess %v", res.PoolWindowMaxRatio, res.PoolWindowAllowedExcessRatio)
	}
	if res.LightSteps == 0 || res.LightStepsUncontended == 0 || res.LightPoolWaitP99Ms < res.LightPoolWaitP50Ms ||
		res.LightPoolWaitMaxMs < res.LightPoolWaitP99Ms || res.LightPoolWaitP99UncontendedMs <= 0 {
		t.Errorf("light steps %d / %d, waits p50 %v p99 %v max %v, alone p99 %v", res.LightSteps, res.LightStepsUncontended,
			res.LightPoolWaitP50Ms, res.LightPoolWaitP99Ms, res.LightPoolWaitMaxMs, res.LightPoolWaitP99UncontendedMs)
	}
	if res.AIMDSteps == 0 || res.AIMDAchievedRatio <= 0 || res.AIMDThrottledRatio < 0 || res.AIMDThrottledRatio > 1 ||
		res.AIMDEffectiveRateMean <= 0 || res.AIMDUpstreamTokensPerMinute != res.PoolTokensPerMinute/2 {
		t.Errorf("aimd %+v", res)
	}
	if res.PoolTokensPerMinute != 6_000_000 || res.PoolBurstTokens != 500_000 || res.WorkersPerTenant != 3 {
		t.Errorf("configuration %+v", res)
	}
	if n, err := rdb.Keys(context.Background(), keys.Prefix()+"*").Result(); err != nil || len(n) != 0 {
		t.Errorf("keys left behind: %v %v", n, err)
	}
}
