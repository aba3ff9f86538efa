package capacity

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/internal/script"
)

// throttlePoolScript records an upstream refusal of a tenant's step. The refusal is
// evidence about that tenant's traffic first: the tenant is held back from the pool
// (field "b:<tenant>": until when) for the retry time, or longer when its refusals
// keep coming (100 ms doubling with each refusal of a streak, "k:<tenant>" =
// "last:count:back-off"; a streak ends after a quiet of the longer of the quiet and
// twice its back-off). A refusal while the tenant is held back is of a step granted
// before: it adds nothing to the streak, and the back-off only lasts until its retry
// time if that is later. Its first refusal of a streak also lowers the bucket to what
// the retry time says is left upstream, by no more than the refused step: the bucket
// is never emptied for one tenant. A pool probing past the rate it learned (c, see
// below) goes back to 95 % of it on any refusal: the probe failed; it never goes
// lower for one tenant.
// The pool itself is lowered only on evidence across tenants ("y": the last refusal,
// "ms:tenant"): another tenant was refused within the window, or the tenant is the
// only one that asked lately (KEYS[2]) and was refused before. Then the upstream's
// rate is measured between two such refusals ("s": "ms:g:tokens:retry ms" of the
// last): it served the tokens used between them (g) plus what the retry times say it
// was short at each, so rate = (g2 − g1 + S2 − S1) ÷ (T + X2 − X1). The effective
// rate goes to 95 % of that (never above where it was, never below half of where it
// was, nor the floor) and the pool remembers it (c) to climb slowly near it, when at
// least a step's worth was served between the two (else it forgets what it learned);
// without a measurement (no earlier refusal within two minutes) it drops by the decrease
// factor, at most once a second; a refusal closer than the least span to the last
// changes no rate. And the bucket goes to what the retry time says is left
// upstream for the refused step (S − X × rate, never below zero): retry_after
// holds for the whole pool.
//
// The tenant leaves the line of waiters while it is held back.
//
// KEYS[1] pool state (hash)   KEYS[2] tenants that asked lately (zset, read)
// KEYS[3] waiters by pass (zset)
// ARGV[1] now ms or ""   ARGV[2] configured tokens a minute   ARGV[3] burst tokens
// ARGV[4] requests a minute   ARGV[5] idle ttl ms   ARGV[6] tenant
// ARGV[7] the refused step's tokens   ARGV[8] its retry time ms
// ARGV[9] decrease factor   ARGV[10] floor in tokens a minute   ARGV[11] evidence window ms
// ARGV[12] streak quiet ms   ARGV[13] most back-off ms   ARGV[14] least span ms of a measurement
// ARGV[15] longest span ms of a measurement
// Returns {effective rate after (tokens a minute), the tenant's back-off ms, 1 when the
// pool was lowered on the evidence (0 otherwise)}.
var throttlePoolScript = redisx.NewScript(script.Now + luaPoolLoad + `
local tenant, S, X = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
local function parts(s)
  local out = {}
  for p in string.gmatch(s or '', '[^:]+') do out[#out + 1] = p end
  return out
end
local k = parts(redis.call('HGET', KEYS[1], 'k:' .. tenant))
local held = backoff
local inflight = held and held > now and #k == 3
local n, back = 1, 0
if inflight then
  -- granted before the back-off began: the same refusal again, not a new one
  n, back = tonumber(k[2]), math.max(X, held - now)
  redis.call('HSET', KEYS[1], 'b:' .. tenant, f(now + back))
else
  if #k == 3 and now - tonumber(k[1]) <= math.max(tonumber(ARGV[12]), 2 * tonumber(k[3])) then n = tonumber(k[2]) + 1 end
  back = math.min(tonumber(ARGV[13]), math.max(X, 100 * 2 ^ math.min(n - 1, 30)))
  redis.call('HSET', KEYS[1], 'k:' .. tenant, now .. ':' .. n .. ':' .. f(back), 'b:' .. tenant, f(now + back))
end
redis.call('ZREM', KEYS[3], tenant)
local wide = false
local y = redis.call('HGET', KEYS[1], 'y')
if y then
  local i = string.find(y, ':')
  wide = string.sub(y, i + 1) ~= tenant and now - tonumber(string.sub(y, 1, i - 1)) <= tonumber(ARGV[11])
end
redis.call('HSET', KEYS[1], 'y', now .. ':' .. tenant)
if not wide and n >= 2 then
  local active = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
  local own = tonumber(redis.call('ZSCORE', KEYS[2], tenant))
  if own and own > now then active = active - 1 end
  wide = active <= 0
end
if not wide then
  if n == 1 and not inflight then l = math.min(l, math.max(S - X * eff / 60000, l - S)) end
  if c and eff > c * 0.95 then
    eff = c * 0.95
    redis.call('HSET', KEYS[1], 'x', now)
  end
  save()
  return {math.floor(eff), back, 0}
end
local sp = parts(redis.call('HGET', KEYS[1], 's'))
local span = #sp == 4 and now - tonumber(sp[1])
if not span or span >= tonumber(ARGV[14]) then
  local est
  if span and span <= tonumber(ARGV[15]) and span + X - tonumber(sp[4]) > 0 then
    est = (g - tonumber(sp[2]) + S - tonumber(sp[3])) * 60000 / (span + X - tonumber(sp[4]))
  end
  local floor = tonumber(ARGV[10])
  if est then
    eff = math.max(floor, eff * 0.5, math.min(eff, est * 0.95))
    if g - tonumber(sp[2]) >= S then
      redis.call('HSET', KEYS[1], 'c', f(math.max(floor, math.min(cfg, est))))
    else
      redis.call('HDEL', KEYS[1], 'c')
    end
  elseif now - (tonumber(redis.call('HGET', KEYS[1], 'd')) or 0) >= 1000 then
    eff = math.max(floor, eff * tonumber(ARGV[9]))
  end
  redis.call('HSET', KEYS[1], 'd', now, 's', now .. ':' .. f(g) .. ':' .. S .. ':' .. X)
end
l = math.min(l, math.max(0, S - X * eff / 60000))
redis.call('HSET', KEYS[1], 'x', now)
save()
return {math.floor(eff), back, 1}
`)

// Pool throttling's constants: the window within which refusals of two tenants are
// evidence about the pool, the quiet that ends a tenant's streak of refusals, and the
// span between two such refusals within which the upstream's rate is measured.
const (
	poolEvidenceWindow = 5 * time.Second
	poolStreakQuiet    = 10 * time.Second
	poolMeasureMin     = 3 * time.Second
	poolMeasureMax     = 2 * time.Minute
)

// ThrottlePool records that the pool's upstream refused one of p.Tenant's steps: the
// tenant is held back, and the pool lowered only on evidence across tenants.
func (pl *Pools) ThrottlePool(ctx context.Context, p quotas.PoolThrottleParams) (quotas.PoolThrottle, error) {
	pool := p.Pool
	if err := pool.Check(); err != nil {
		return quotas.PoolThrottle{}, err
	}
	keys := pl.poolKeys(pool.Name)
	floor := max(1, int64(math.Ceil(float64(pool.TokensPerMinute)*poolFloor)))
	res, err := throttlePoolScript.Run(ctx, pl.rdb, []string{keys[0], keys[3], keys[2]}, pl.nowArg(), pool.TokensPerMinute,
		pool.Burst(), pool.RequestsPerMinute, poolIdleTTL.Milliseconds(), p.Tenant, max(p.Tokens, 0),
		max(p.RetryAfter.Milliseconds(), 0), poolDecrease, floor, poolEvidenceWindow.Milliseconds(),
		poolStreakQuiet.Milliseconds(), poolMaxWait.Milliseconds(), poolMeasureMin.Milliseconds(),
		poolMeasureMax.Milliseconds()).Int64Slice()
	if err != nil {
		return quotas.PoolThrottle{}, fmt.Errorf("quotas: throttle pool %s: %w", pool.Name, err)
	}
	if len(res) < 3 {
		return quotas.PoolThrottle{}, fmt.Errorf("quotas: throttle pool %s: unexpected reply %v", pool.Name, res)
	}
	return quotas.PoolThrottle{EffectiveRate: res[0], Backoff: time.Duration(res[1]) * time.Millisecond, PoolWide: res[2] == 1}, nil
}
