package capacity

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/internal/script"
)

// settlePoolScript settles a step against its pool: the actual tokens minus the
// estimate come off the level (refund or debt) and move the tenant's pass (and its
// place in line, when it has one) at the weight its reservation wrote, so the fair
// order is in the tokens really used: a step's pass moves by what it used ÷ the
// tenant's weight, whatever its estimate.
//
// KEYS[1] pool state (hash)   KEYS[2] passes (hash)   KEYS[3] waiters by pass (zset)
// ARGV[1] now ms or ""
// ARGV[2] configured tokens a minute   ARGV[3] burst tokens   ARGV[4] requests a minute
// ARGV[5] idle ttl ms   ARGV[6] tenant   ARGV[7] actual minus estimate
// ARGV[8] 1: the grant was not paced (its pass stays)
// Returns the level after, in tokens.
var settlePoolScript = redisx.NewScript(script.Now + luaPoolLoad + `
local d = tonumber(ARGV[7])
l = math.min(burst, l - d)
local p, w
if ARGV[8] ~= '1' then
  local pw = redis.call('HMGET', KEYS[2], 'p:' .. ARGV[6], 'w:' .. ARGV[6])
  p, w = tonumber(pw[1]), tonumber(pw[2]) or 1
end
if p then
  redis.call('HSET', KEYS[2], 'p:' .. ARGV[6], f(p + d / w))
  redis.call('PEXPIRE', KEYS[2], idle)
  redis.call('ZADD', KEYS[3], 'XX', f(p + d / w), ARGV[6])
end
use(d)
save()
return math.floor(l)
`)

// SettlePool settles one step against its pool and returns the level after. On pipe
// (a redisx.Batch's) it goes in the round trip of the pipe's other calls and returns
// 0: its outcome is the pipe's; nil sends it alone.
func (pl *Pools) SettlePool(ctx context.Context, pipe redis.Pipeliner, p quotas.PoolSettleParams) (level int64, err error) {
	if err := p.Pool.Check(); err != nil {
		return 0, err
	}
	keys := pl.poolKeys(p.Pool.Name)[:3]
	cmd := settlePoolScript.Run(ctx, pl.on(pipe), keys, pl.nowArg(), p.Pool.TokensPerMinute, p.Pool.Burst(),
		p.Pool.RequestsPerMinute, poolIdleTTL.Milliseconds(), p.Tenant, p.Tokens, script.Bool(p.Unpaced))
	if pipe != nil {
		return 0, nil
	}
	if level, err = cmd.Int64(); err != nil {
		return 0, fmt.Errorf("quotas: settle pool %s: %w", p.Pool.Name, err)
	}
	return level, nil
}

// on is where a call that may share a round trip goes: pipe, or alone on the client.
func (pl *Pools) on(pipe redis.Pipeliner) redis.Scripter {
	if pipe != nil {
		return pipe
	}
	return pl.rdb
}

// giveBackPoolScript gives a granted step's reservation back, for a step that did
// not run: its tokens and its request go back to the buckets (never past their
// bursts), its pass moves back by what the reservation moved it (tokens ÷ the weight
// the reservation wrote), and the virtual time goes back to what it was before the
// grant when the grant moved it and no later one did ("g:<tenant>").
//
// KEYS[1] pool state (hash)   KEYS[2] passes (hash)   KEYS[3] waiters by pass (zset)
// ARGV[1] now ms or ""
// ARGV[2] configured tokens a minute   ARGV[3] burst tokens   ARGV[4] requests a minute
// ARGV[5] idle ttl ms   ARGV[6] tenant   ARGV[7] tokens reserved
// ARGV[8] 1: the grant was not paced (no pass or virtual time to move back)
// Returns the level after, in tokens.
var giveBackPoolScript = redisx.NewScript(script.Now + luaPoolLoad + `
local t, n = ARGV[6], tonumber(ARGV[7])
l = math.min(burst, l + n)
if rpm > 0 then r = math.min(rpm, r + 1) end
local p, w, pw
if ARGV[8] ~= '1' then
  pw = redis.call('HMGET', KEYS[2], 'p:' .. t, 'w:' .. t, 'g:' .. t)
  p, w = tonumber(pw[1]), tonumber(pw[2]) or 1
end
if p then
  p = p - n / w
  redis.call('HSET', KEYS[2], 'p:' .. t, f(p))
  redis.call('ZADD', KEYS[3], 'XX', f(p), t)
  if pw[3] then
    local i = string.find(pw[3], ':')
    if tonumber(string.sub(pw[3], i + 1)) == v then v = tonumber(string.sub(pw[3], 1, i - 1)) end
    redis.call('HDEL', KEYS[2], 'g:' .. t)
  end
  redis.call('PEXPIRE', KEYS[2], idle)
end
use(-n)
save()
return math.floor(l)
`)

// GiveBackPool gives a granted reservation of p.Tokens back: the step did not run. On
// pipe it goes as SettlePool does.
func (pl *Pools) GiveBackPool(ctx context.Context, pipe redis.Pipeliner, p quotas.PoolSettleParams) (level int64, err error) {
	if err := p.Pool.Check(); err != nil {
		return 0, err
	}
	cmd := giveBackPoolScript.Run(ctx, pl.on(pipe), pl.poolKeys(p.Pool.Name)[:3], pl.nowArg(), p.Pool.TokensPerMinute,
		p.Pool.Burst(), p.Pool.RequestsPerMinute, poolIdleTTL.Milliseconds(), p.Tenant, max(p.Tokens, 0), script.Bool(p.Unpaced))
	if pipe != nil {
		return 0, nil
	}
	if level, err = cmd.Int64(); err != nil {
		return 0, fmt.Errorf("quotas: give back to pool %s: %w", p.Pool.Name, err)
	}
	return level, nil
}
