package capacity

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/quotas"
)

// PoolStatus reads a pool's state without changing it. The level and effective rate
// are as of the pool's last reservation, refilled to now.
func (pl *Pools) PoolStatus(ctx context.Context, pool quotas.PoolConfig) (quotas.PoolStatus, error) {
	if err := pool.Check(); err != nil {
		return quotas.PoolStatus{}, err
	}
	keys := pl.poolKeys(pool.Name)
	pipe := pl.rdb.Pipeline()
	stCmd := pipe.HGetAll(ctx, keys[0])
	wCmd := pipe.ZRangeWithScores(ctx, keys[2], 0, 99)
	clCmd := pipe.ZRangeWithScores(ctx, keys[3], 0, 99)
	tCmd := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return quotas.PoolStatus{}, fmt.Errorf("quotas: pool %s status: %w", pool.Name, err)
	}
	nowMs := tCmd.Val().UnixMilli()
	if pl.clock.Fake() {
		nowMs = pl.clock.NowMs()
	}
	s := poolStatusFrom(stCmd.Val(), pool, nowMs)
	live := map[string]bool{}
	for _, z := range clCmd.Val() {
		if int64(z.Score) > nowMs {
			live[z.Member.(string)] = true
		}
	}
	for _, z := range wCmd.Val() {
		if t := z.Member.(string); live[t] {
			s.Waiting = append(s.Waiting, quotas.PoolWaiter{Tenant: t})
		}
	}
	if err := pl.poolWaiterWeights(ctx, keys[1], &s); err != nil {
		return quotas.PoolStatus{}, err
	}
	return s, nil
}

func (pl *Pools) poolWaiterWeights(ctx context.Context, passes string, s *quotas.PoolStatus) error {
	if len(s.Waiting) == 0 {
		return nil
	}
	fields := make([]string, len(s.Waiting))
	for i, w := range s.Waiting {
		fields[i] = "w:" + w.Tenant
	}
	vals, err := pl.rdb.HMGet(ctx, passes, fields...).Result()
	total := 0
	if err != nil {
		return fmt.Errorf("quotas: pool weights: %w", err)
	}
	for i, v := range vals {
		w := 1
		if str, ok := v.(string); ok {
			if n, err := strconv.Atoi(str); err == nil && n > 0 {
				w = n
			}
		}
		s.Waiting[i].Weight = w
		total += w
	}
	for i := range s.Waiting {
		s.Waiting[i].Share = float64(s.Waiting[i].Weight) / float64(total)
	}
	return nil
}

func poolStatusFrom(h map[string]string, pool quotas.PoolConfig, nowMs int64) quotas.PoolStatus {
	num := func(k string, def float64) float64 {
		if v, err := strconv.ParseFloat(h[k], 64); err == nil {
			return v
		}
		return def
	}
	cfg, burst := float64(pool.TokensPerMinute), float64(pool.Burst())
	eff := math.Min(num("e", cfg), cfg)
	level := num("l", burst)
	if t := num("t", float64(nowMs)); float64(nowMs) > t {
		level = math.Min(burst, level+(float64(nowMs)-t)*eff/tokensMinuteMs)
	}
	s := quotas.PoolStatus{Level: int64(math.Floor(level)), EffectiveRate: int64(math.Floor(eff))}
	if x := num("x", 0); x > 0 {
		s.LastThrottledAgo = time.Duration(float64(nowMs)-x) * time.Millisecond
		s.Throttled = s.LastThrottledAgo < time.Minute
	}
	slot := nowMs / 5000
	for i := range 12 {
		cur := h["u"+strconv.Itoa(i)]
		ss, n, ok := strings.Cut(cur, ":")
		if !ok {
			continue
		}
		sv, err1 := strconv.ParseInt(ss, 10, 64)
		nv, err2 := strconv.ParseFloat(n, 64)
		if err1 == nil && err2 == nil && sv > slot-12 && sv <= slot {
			s.UsedLastMinute += int64(nv)
		}
	}
	return s
}
