package capacity

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/internal/script"
)

// Pools are the shared model pools in Redis: a step of an agent bound to one reserves
// its estimated tokens from it before it runs, in weighted fair order among the
// tenants waiting on it, and settles after; the pool's effective rate follows what
// its upstream serves (throttle.go).
type Pools struct {
	conn
	batch *redisx.Batch // carries reservations (PoolsOptions.Batch); nil sends each alone
}

// PoolsOptions tune Pools.
type PoolsOptions struct {
	// Batch carries reservations (ReservePool) in shared pipelines, with concurrent
	// ones; the App gives the Batch the worker and the scheduler use.
	Batch *redisx.Batch
}

// NewPools returns the pools on rdb. nowMs, when not nil, replaces Redis TIME
// (tests).
func NewPools(rdb redis.UniversalClient, keys rkeys.Keys, nowMs func() int64, opts ...PoolsOptions) *Pools {
	pl := &Pools{conn: conn{rdb: rdb, keys: keys, clock: script.Clock{NowMs: nowMs}}}
	for _, o := range opts {
		pl.batch = o.Batch
	}
	return pl
}

// Pool throttling's constants: the factor of a decrease, the least effective rate as
// a fraction of the configured one, and the waits a refused step is told at most.
const (
	poolDecrease     = 0.7
	poolFloor        = 0.01
	poolMaxWait      = time.Minute
	poolClaimGrace   = 2 * time.Second
	poolIdleTTL      = 10 * time.Minute
	tokensMinuteMs   = 60_000
	tenantTokensName = "ai_tokens_per_minute"
)

// poolMinIneligible is the least wait of an ask that is not next in line while the
// head of the line is overdue.
const poolMinIneligible = 50 * time.Millisecond

func (pl *Pools) poolKeys(name string) []string {
	return []string{pl.keys.PoolState(name), pl.keys.PoolPasses(name), pl.keys.PoolWaiters(name), pl.keys.PoolClaims(name)}
}

// luaPoolLoad reads a pool's bucket and refills it to now at its effective rate,
// raising the effective rate from 2 s after the last throttled answer that lowered the
// pool: by 2 % of the configured rate a second, or, near the rate the pool last
// learned its upstream allows (c: from 0.9 to 1.25 times it), by 0.2 % of that rate a
// second, so the pool probes past what it learned slowly. save writes it back; use
// adds tokens to the last minute's use and to the running total of tokens used (g).
// In the same read it takes backoff, until when the tenant ARGV[6] is held back
// (field "b:<tenant>"): every script that loads the pool names the tenant there.
const luaPoolLoad = `
local cfg, burst, rpm, idle = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
-- the last minute's use: 12 slots of 5 s, field "u<slot mod 12>" = "<slot>:<tokens>"
local us = math.floor(now / 5000)
local uk = 'u' .. (us % 12)
local st = redis.call('HMGET', KEYS[1], 'l', 'r', 't', 'e', 'x', 'v', uk, 'c', 'g', 'b:' .. ARGV[6])
local l, r, t = tonumber(st[1]) or burst, tonumber(st[2]) or rpm, tonumber(st[3]) or now
local eff, x, v = tonumber(st[4]) or cfg, tonumber(st[5]) or 0, tonumber(st[6]) or 0
local c, g = tonumber(st[8]), tonumber(st[9]) or 0
local backoff = tonumber(st[10]) -- until when ARGV[6], the tenant, is held back
local un, used = 0, false
if st[7] then
  local i = string.find(st[7], ':')
  if tonumber(string.sub(st[7], 1, i - 1)) == us then un = tonumber(string.sub(st[7], i + 1)) end
end
if now > t then
  local from = math.max(t, x + 2000)
  local inc = cfg * 0.02
  if c and eff >= c * 0.9 and eff < c * 1.25 then inc = c * 0.002 end
  if now > from and eff < cfg then eff = eff + inc * (now - from) / 1000 end
  if eff > cfg then eff = cfg end
  l = math.min(burst, l + (now - t) * eff / 60000)
  if rpm > 0 then r = math.min(rpm, r + (now - t) * rpm / 60000) end
  t = now
end
if eff > cfg then eff = cfg end
local function f(n) return string.format('%.17g', n) end
local function save()
  if used then
    redis.call('HSET', KEYS[1], 'l', f(l), 'r', f(r), 't', t, 'e', f(eff), 'v', f(v), uk, us .. ':' .. f(un), 'g', f(g))
  else
    redis.call('HSET', KEYS[1], 'l', f(l), 'r', f(r), 't', t, 'e', f(eff), 'v', f(v))
  end
  redis.call('PEXPIRE', KEYS[1], idle)
end
-- use adds tokens to the current slot's use; save writes it
local function use(n) un, used, g = un + n, true, g + n end
`

// reservePoolScript reserves a step's estimate from a model pool in weighted fair
// order: granted when the tenant is next in line (its pass at or before every other
// waiting tenant's) and the bucket holds the estimate, plus one step's worth left for
// others when the tenant has been drawing at or past the line while other tenants
// draw too (they asked within the grace).
// Otherwise the tenant takes (or keeps) its place in line until the wait it is told
// plus a grace, and the wait counts the tokens the tenants ahead of it take first.
// An ask that is not next in line also waits at least until the head of the line is
// due back (the tokens in the bucket are the head's until it has asked); once the
// head is overdue, at least as long as it has been (at least poolMinIneligible), so
// that a head that never comes back costs a few asks before its place lapses, not
// one every millisecond.
// A grant takes the tenant out of line unless another of its asks is still due back
// (the latest of its places lapses more than a grace from now): then it keeps its
// place, at its new pass. A grant that moves the virtual time notes the time before
// it (field "g:<tenant>"), for a give-back to undo.
// While no tenant waits, the bucket keeps half its burst after the grant and the pool
// runs at its configured rate with no throttled answer in the last 10 s, a grant is
// not paced: it takes the tokens and the request and counts the tenant among the
// recent askers, but moves no pass and no virtual time (fair order only matters once
// someone waits, and then every grant is paced), and answers with a fourth element, 2,
// so that its give-back or settlement moves no pass either.
// A try (ARGV[11] = 1) takes a grant as an ask does, and otherwise answers the wait
// without taking a place in line (or leaving the one the tenant has).
// A tenant whose place lapses at or behind the virtual time leaves the passes (such a
// pass is the same as none), and while the passes hold many more tenants than have
// asked lately, each call sweeps a few more of those left at or behind it.
//
// KEYS[1] pool state (hash)   KEYS[2] passes (hash)   KEYS[3] waiters by pass (zset)
// KEYS[4] tenants that asked lately, by the latest time their place (or their
// standing as a contender) lapses (zset)
// ARGV[1] now ms or ""   ARGV[2] configured tokens a minute   ARGV[3] burst tokens
// ARGV[4] requests a minute (0: none)   ARGV[5] idle ttl ms   ARGV[6] tenant
// ARGV[7] weight (> 0)   ARGV[8] tokens asked   ARGV[9] place grace ms   ARGV[10] max wait ms
// ARGV[11] 1: a try   ARGV[12] least wait ms of an ask that is not next in line
// A tenant its upstream refused lately (ThrottlePool) is held back until its back-off
// ends, before anything else: it neither draws nor keeps a place in line (a place it
// could not use would hold the others up).
// Returns {1, level after, effective rate} when granted ({…, 2} when not paced), {0, ms until expected,
// effective rate} when not, {0, ms until the tenant's back-off ends, effective rate,
// 1} when the tenant is held back.
var reservePoolScript = redisx.NewScript(script.Now + luaPoolLoad + `
local poolSettled = 10000 -- ms after the last throttled answer: the pool still learning
local tenant, w, ask = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
local grace, try = tonumber(ARGV[9]), ARGV[11] == '1'
local held = backoff
if held and held > now then
  if not try then redis.call('ZREM', KEYS[3], tenant) end
  return {0, math.min(math.ceil(held - now), tonumber(ARGV[10])), math.floor(eff), 1}
end
if eff >= cfg and now > x + poolSettled and (rpm <= 0 or r >= 1) and l - ask >= burst / 2 and redis.call('ZCARD', KEYS[3]) == 0 then
  l = l - ask
  if rpm > 0 then r = r - 1 end
  redis.call('ZADD', KEYS[4], 'GT', now + grace, tenant)
  redis.call('PEXPIRE', KEYS[4], idle)
  use(ask)
  save()
  return {1, math.floor(l), math.floor(eff), 2}
end
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
for _, m in ipairs(lapsed) do redis.call('ZREM', KEYS[3], m) end
if #lapsed > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now) end
for _, m in ipairs(lapsed) do
  if m ~= tenant and (tonumber(redis.call('HGET', KEYS[2], 'p:' .. m)) or v) <= v then
    redis.call('HDEL', KEYS[2], 'p:' .. m, 'w:' .. m, 'g:' .. m)
  end
end
local others = redis.call('ZCARD', KEYS[4])
if redis.call('HLEN', KEYS[2]) > 3 * others + 48 then
  local sc = redis.call('HSCAN', KEYS[2], redis.call('HGET', KEYS[1], 'pc') or '0', 'MATCH', 'p:*', 'COUNT', 16)
  for i = 1, #sc[2], 2 do
    local t = string.sub(sc[2][i], 3)
    if t ~= tenant and tonumber(sc[2][i + 1]) <= v and not redis.call('ZSCORE', KEYS[4], t) then
      redis.call('HDEL', KEYS[2], 'p:' .. t, 'w:' .. t, 'g:' .. t)
    end
  end
  redis.call('HSET', KEYS[1], 'pc', sc[1])
end
local hp, hd
local head = redis.call('ZRANGE', KEYS[3], 0, 1, 'WITHSCORES')
for i = 1, #head, 2 do
  if head[i] ~= tenant then
    hp, hd = tonumber(head[i + 1]), tonumber(redis.call('ZSCORE', KEYS[4], head[i]))
    break
  end
end
local back = tonumber(redis.call('ZSCORE', KEYS[4], tenant))
if back then others = others - 1 end
local p0 = tonumber(redis.call('HGET', KEYS[2], 'p:' .. tenant))
local p = math.max(p0 or v, v)
local need = math.min(ask, burst)
local reserve = 0
if (hp or others > 0) and p0 and p0 >= v then reserve = math.min(need, burst - need) end
local eligible = (not hp) or p <= hp
local rok = rpm <= 0 or r >= 1
if eligible and rok and l - need >= reserve then
  l = l - ask
  if rpm > 0 then r = r - 1 end
  if p > v then
    redis.call('HSET', KEYS[2], 'g:' .. tenant, f(v) .. ':' .. f(p), 'p:' .. tenant, f(p + ask / w), 'w:' .. tenant, w)
    v = p
  else
    redis.call('HDEL', KEYS[2], 'g:' .. tenant)
    redis.call('HSET', KEYS[2], 'p:' .. tenant, f(p + ask / w), 'w:' .. tenant, w)
  end
  redis.call('PEXPIRE', KEYS[2], idle)
  if back and back - grace > now then
    redis.call('ZADD', KEYS[3], f(p + ask / w), tenant)
  elseif #head > 0 then -- an empty line has no place to leave
    redis.call('ZREM', KEYS[3], tenant)
  end
  redis.call('ZADD', KEYS[4], 'GT', now + grace, tenant)
  redis.call('PEXPIRE', KEYS[4], idle)
  use(ask)
  save()
  return {1, math.floor(l), math.floor(eff)}
end
local short = need + reserve - l
if not eligible then
  local ahead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. f(p), 'WITHSCORES', 'LIMIT', 0, 64)
  for i = 1, #ahead, 2 do
    if ahead[i] ~= tenant then
      local ow = tonumber(redis.call('HGET', KEYS[2], 'w:' .. ahead[i])) or 1
      short = short + (p - tonumber(ahead[i + 1])) * ow
    end
  end
end
local wait = math.max(short, 0) * 60000 / eff
if not rok then wait = math.max(wait, (1 - r) * 60000 / rpm) end
if not eligible and hd then
  local due = hd - grace
  if due > now then
    wait = math.max(wait, due - now)
  else
    wait = math.max(wait, math.min(hd - now, math.max(now - due, tonumber(ARGV[12]))))
  end
end
wait = math.min(math.max(1, math.ceil(wait)), tonumber(ARGV[10]))
if try then return {0, wait, math.floor(eff)} end
redis.call('ZADD', KEYS[3], f(p), tenant)
redis.call('ZADD', KEYS[4], 'GT', now + wait + grace, tenant)
redis.call('HSET', KEYS[2], 'p:' .. tenant, f(p), 'w:' .. tenant, w)
redis.call('PEXPIRE', KEYS[2], idle)
redis.call('PEXPIRE', KEYS[3], idle)
redis.call('PEXPIRE', KEYS[4], idle)
save()
return {0, wait, math.floor(eff)}
`)

// ReservePool reserves p.Tokens from the pool for the tenant, in weighted fair order.
// It goes through PoolsOptions.Batch, when set, with concurrent reservations.
func (pl *Pools) ReservePool(ctx context.Context, p quotas.PoolReserveParams) (quotas.TokenAnswer, error) {
	if pl.batch == nil {
		return pl.reservePool(ctx, pl.rdb, p).answer()
	}
	var r *poolReservation
	_ = pl.batch.Do(ctx, func(pipe redis.Pipeliner) { r = pl.reservePool(ctx, pipe, p) }) // its error is the answer's
	return r.answer()
}

// poolReservation is a pool reservation sent on a client or queued on a pipeline: its
// answer is there once the pipeline has run.
type poolReservation struct {
	name string
	cmd  *redis.Cmd
	err  error
}

// TryPool queues on pipe a reservation that is granted as ReservePool's would be, and
// otherwise takes no place in the pool's line: the answer then is the wait an ask
// would be told. It rides in the round trip of a step's own reservation, which may
// yet refuse the step: a grant is then given back (GiveBackPool); a step that may
// run and was not granted asks again with ReservePool, taking its place. The answer
// is there once the pipe has run.
func (pl *Pools) TryPool(ctx context.Context, pipe redis.Pipeliner, p quotas.PoolReserveParams) func() (quotas.TokenAnswer, error) {
	r := &poolReservation{name: p.Pool.Name}
	if r.err = p.Pool.Check(); r.err == nil {
		r.cmd = pl.runReservePool(ctx, pipe, p, poolTry)
	}
	return r.answer
}

func (pl *Pools) reservePool(ctx context.Context, c redis.Scripter, p quotas.PoolReserveParams) *poolReservation {
	r := &poolReservation{name: p.Pool.Name}
	if r.err = p.Pool.Check(); r.err != nil {
		return r
	}
	r.cmd = pl.runReservePool(ctx, c, p, poolAsk)
	return r
}

// The modes of reservePoolScript (ARGV[11]).
const (
	poolAsk = 0
	poolTry = 1
)

func (pl *Pools) runReservePool(ctx context.Context, c redis.Scripter, p quotas.PoolReserveParams, mode int) *redis.Cmd {
	return reservePoolScript.Run(ctx, c, pl.poolKeys(p.Pool.Name), pl.nowArg(),
		p.Pool.TokensPerMinute, p.Pool.Burst(), p.Pool.RequestsPerMinute, poolIdleTTL.Milliseconds(),
		p.Tenant, max(p.Weight, 1), max(p.Tokens, 0), poolClaimGrace.Milliseconds(), poolMaxWait.Milliseconds(),
		mode, poolMinIneligible.Milliseconds())
}

// answer is the reservation's answer; an error when it could not be asked (or was
// never sent: a nil reservation).
func (r *poolReservation) answer() (quotas.TokenAnswer, error) {
	if r == nil {
		return quotas.TokenAnswer{}, errors.New("quotas: a pool reservation that was never sent")
	}
	if r.err != nil {
		return quotas.TokenAnswer{}, r.err
	}
	res, err := r.cmd.Int64Slice()
	if err != nil {
		return quotas.TokenAnswer{}, fmt.Errorf("quotas: reserve pool %s: %w", r.name, err)
	}
	return tokenAnswer(res, "pool "+r.name)
}
