package quotas

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/redisx"
)

// Token capacity: the two buckets a step's tokens are reserved from before it runs,
// its tenant's ai_tokens_per_minute and, when its agent is bound to one, a model pool
// shared by every tenant. A reservation takes the step's estimate; settling after the
// step refunds what it did not use or carries its excess as debt (the bucket's level
// goes below zero), so a bucket never lets through more than its burst and rate by
// more than the largest single step's excess.
//
// A pool shares its capacity in weighted fair order when tenants wait on it: stride
// scheduling in tokens, the scheduler's idea applied to the pool. Each tenant has a
// pass (tokens used ÷ weight: a grant moves it by the estimate, the settlement by
// the rest, both at the weight the grant recorded) in the pool's virtual time; only a
// tenant whose pass is at or before every other waiting tenant's is served, and a
// tenant coming back from idleness starts at the virtual time, so it banks no credit. A tenant with
// several steps waiting (several workers) keeps its place in line when one of them is
// granted, at its new pass, until the last of the others is due back: otherwise a
// tenant further back is served between its asks, the virtual time passes it, and it
// loses what it was owed. A tenant that has been drawing at or past the line (its
// pass has caught up with the virtual time) also leaves one step's worth in the
// bucket while others wait: that reserve is what lets a light tenant, whose pass lags
// behind, be served at once in a saturated pool. An uncontended pool gives everything
// it has to whoever asks.
//
// The pool's effective rate adapts to its upstream (ThrottlePool): an upstream's
// refusal of one tenant's step holds that tenant back; the pool is lowered only on
// evidence across tenants, to the rate the upstream was measured to serve, and its
// bucket to what the retry time says is left upstream. It climbs back once nothing
// has been throttled for 2 s, slowly near the rate it learned, never above the
// configured rate.

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

// ErrNoCapacity is a reservation's configuration error: a bucket with no rate or
// burst can never grant anything, so the caller must not wait on it.
var ErrNoCapacity = errors.New("quotas: a token bucket needs a positive rate and burst")

// TokenAnswer is the answer to a reservation. When not Granted, Wait is how long until
// the capacity is expected (the step waits that long without holding a worker).
// Level is the bucket's level after a grant, in tokens (negative: in debt).
type TokenAnswer struct {
	Granted bool
	Wait    time.Duration
	Level   int64
	// EffectiveRate is a pool's effective rate at the answer, in tokens a minute (0
	// for a tenant's bucket).
	EffectiveRate int64
	// Throttled says a pool refused because the tenant is held back after its
	// upstream refused it (ThrottlePool): the step waits with ThrottleReason.
	Throttled bool
}

// TenantTokensParams names a tenant's ai_tokens_per_minute bucket and one step's
// tokens: the estimate to reserve, or in a settlement the actual use minus the
// estimate (negative refunds).
type TenantTokensParams struct {
	Tenant    string
	PerMinute int64 // the plan's ai_tokens_per_minute (> 0)
	Burst     int64 // tokens; 0: one minute's worth
	Tokens    int64
}

func (p TenantTokensParams) args() (rate, burst int64, err error) {
	burst = p.Burst
	if burst <= 0 {
		burst = p.PerMinute
	}
	if p.PerMinute <= 0 || burst <= 0 {
		return 0, 0, ErrNoCapacity
	}
	return p.PerMinute, burst, nil
}

// luaTenantTokens defines the functions of a tenant's ai_tokens_per_minute bucket
// (a hash: level "l", last refill "t", at KEYS[ki]): tpm_load refills it to now and returns its
// level and its rate a millisecond; tpm_save writes a level back, with a ttl of the
// time it takes to fill up again (a full bucket is the same as none).
const luaTenantTokens = `
local function tpm_load(ki, per_minute, burst)
  local key = KEYS[ki]
  local rate = per_minute / 60000
  local st = redis.call('HMGET', key, 'l', 't')
  local l, t = tonumber(st[1]), tonumber(st[2])
  if not l or not t then return burst, rate end
  if now > t then l = math.min(burst, l + (now - t) * rate) end
  return l, rate
end
local function tpm_save(ki, l, rate, burst)
  local key = KEYS[ki]
  local t = tonumber(redis.call('HGET', key, 't') or '0')
  redis.call('HSET', key, 'l', string.format('%.17g', l), 't', math.max(t, now))
  redis.call('PEXPIRE', key, math.max(1, math.ceil((burst - l) / rate)))
end
`

// reserveTenantTokensScript takes a step's estimate from a tenant's tokens-per-minute
// bucket when the bucket holds it (an estimate larger than the burst needs a full
// bucket and leaves it in debt).
//
// KEYS[1] tenant token bucket (hash)   ARGV[1] now ms or ""   ARGV[2] tokens a minute
// ARGV[3] burst tokens   ARGV[4] tokens asked
// Returns {1, level after} when granted, {0, ms until the ask fits} when not.
var reserveTenantTokensScript = redisx.NewScript(luaNow + luaTenantTokens + `
local burst = tonumber(ARGV[3])
local l, rate = tpm_load(1, tonumber(ARGV[2]), burst)
local ask = tonumber(ARGV[4])
local need = math.min(ask, burst)
if l < need then return {0, math.ceil((need - l) / rate)} end
l = l - ask
tpm_save(1, l, rate, burst)
return {1, math.floor(l)}
`)

// ReserveTenantTokens reserves p.Tokens from the tenant's ai_tokens_per_minute bucket.
func (q *Quotas) ReserveTenantTokens(ctx context.Context, p TenantTokensParams) (TokenAnswer, error) {
	rate, burst, err := p.args()
	if err != nil {
		return TokenAnswer{}, err
	}
	res, err := reserveTenantTokensScript.Run(ctx, q.rdb, []string{q.keys.TenantTokens(p.Tenant)},
		q.nowArg(), rate, burst, max(p.Tokens, 0)).Int64Slice()
	if err != nil {
		return TokenAnswer{}, fmt.Errorf("quotas: reserve %s: %w", tenantTokensName, err)
	}
	return tokenAnswer(res, tenantTokensName)
}

// settleTenantTokensScript settles a step against its tenant's bucket: the actual
// tokens minus the estimate come off the level (a refund when negative, never past
// the burst; debt when positive).
//
// KEYS[1] tenant token bucket (hash)   ARGV[1] now ms or ""   ARGV[2] tokens a minute
// ARGV[3] burst tokens   ARGV[4] actual minus estimate
// Returns the level after, in tokens.
var settleTenantTokensScript = redisx.NewScript(luaNow + luaTenantTokens + `
local burst = tonumber(ARGV[3])
local l, rate = tpm_load(1, tonumber(ARGV[2]), burst)
l = math.min(burst, l - tonumber(ARGV[4]))
tpm_save(1, l, rate, burst)
return math.floor(l)
`)

// SettleTenantTokens settles one step: p.Tokens is its actual use minus its estimate.
func (q *Quotas) SettleTenantTokens(ctx context.Context, p TenantTokensParams) (level int64, err error) {
	rate, burst, err := p.args()
	if err != nil {
		return 0, err
	}
	level, err = settleTenantTokensScript.Run(ctx, q.rdb, []string{q.keys.TenantTokens(p.Tenant)},
		q.nowArg(), rate, burst, p.Tokens).Int64()
	if err != nil {
		return 0, fmt.Errorf("quotas: settle %s: %w", tenantTokensName, err)
	}
	return level, nil
}

// TenantTokensState is a tenant's ai_tokens_per_minute bucket as the usage report
// shows it: Level is the tokens in it now (negative: in debt), Used what has been
// reserved from it and not yet refilled (burst − level, never below 0), FullIn how
// long until it is full again.
type TenantTokensState struct {
	Level  int64
	Used   int64
	FullIn time.Duration
}

// TenantTokensLevel reads a tenant's ai_tokens_per_minute bucket without changing it,
// refilled to now. A bucket never reserved from (or expired, being full) is full.
// p.Tokens is not used.
func (q *Quotas) TenantTokensLevel(ctx context.Context, p TenantTokensParams) (TenantTokensState, error) {
	rate, burst, err := p.args()
	if err != nil {
		return TenantTokensState{}, err
	}
	pipe := q.rdb.Pipeline()
	stCmd := pipe.HMGet(ctx, q.keys.TenantTokens(p.Tenant), "l", "t")
	tCmd := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return TenantTokensState{}, fmt.Errorf("quotas: read %s: %w", tenantTokensName, err)
	}
	nowMs := tCmd.Val().UnixMilli()
	if q.nowMs != nil {
		nowMs = q.nowMs()
	}
	return tenantTokensState(stCmd.Val(), rate, burst, nowMs), nil
}

// tenantTokensState refills a bucket's stored level (l) from its time (t) to nowMs,
// as luaTenantTokensLoad does.
func tenantTokensState(vals []any, rate, burst, nowMs int64) TenantTokensState {
	num := func(i int) (float64, bool) {
		if i >= len(vals) {
			return 0, false
		}
		s, ok := vals[i].(string)
		if !ok {
			return 0, false
		}
		f, err := strconv.ParseFloat(s, 64)
		return f, err == nil
	}
	level := float64(burst)
	l, okL := num(0)
	t, okT := num(1)
	perMs := float64(rate) / tokensMinuteMs
	if okL && okT {
		level = l
		if float64(nowMs) > t {
			level = math.Min(float64(burst), l+(float64(nowMs)-t)*perMs)
		}
	}
	st := TenantTokensState{Level: int64(math.Floor(level)), Used: max(0, int64(math.Ceil(float64(burst)-level)))}
	if st.Used > 0 {
		st.FullIn = time.Duration(math.Ceil((float64(burst)-level)/perMs)) * time.Millisecond
	}
	return st
}

// PoolConfig is a model pool's declared capacity.
type PoolConfig struct {
	Name              string
	TokensPerMinute   int64 // > 0
	BurstTokens       int64 // 0: one minute's worth; never more than that
	RequestsPerMinute int64 // 0: not limited
}

// Burst is the pool bucket's burst in tokens.
func (c PoolConfig) Burst() int64 {
	if c.BurstTokens <= 0 || c.BurstTokens > c.TokensPerMinute {
		return c.TokensPerMinute
	}
	return c.BurstTokens
}

func (c PoolConfig) check() error {
	if c.Name == "" || strings.ContainsAny(c.Name, "{}") {
		return fmt.Errorf("quotas: pool name %q", c.Name)
	}
	if c.TokensPerMinute <= 0 || c.RequestsPerMinute < 0 {
		return ErrNoCapacity
	}
	return nil
}

func (q *Quotas) poolKeys(name string) []string {
	return []string{q.keys.PoolState(name), q.keys.PoolPasses(name), q.keys.PoolWaiters(name), q.keys.PoolClaims(name)}
}

// luaPoolLoad reads a pool's bucket and refills it to now at its effective rate,
// raising the effective rate from 2 s after the last throttled answer that lowered the
// pool: by 2 % of the configured rate a second, or, near the rate the pool last
// learned its upstream allows (c: from 0.9 to 1.25 times it), by 0.2 % of that rate a
// second, so the pool probes past what it learned slowly. save writes it back; use
// adds tokens to the last minute's use and to the running total of tokens used (g).
const luaPoolLoad = `
local cfg, burst, rpm, idle = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
-- the last minute's use: 12 slots of 5 s, field "u<slot mod 12>" = "<slot>:<tokens>"
local us = math.floor(now / 5000)
local uk = 'u' .. (us % 12)
local st = redis.call('HMGET', KEYS[1], 'l', 'r', 't', 'e', 'x', 'v', uk, 'c', 'g')
local l, r, t = tonumber(st[1]) or burst, tonumber(st[2]) or rpm, tonumber(st[3]) or now
local eff, x, v = tonumber(st[4]) or cfg, tonumber(st[5]) or 0, tonumber(st[6]) or 0
local c, g = tonumber(st[8]), tonumber(st[9]) or 0
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
// A peek (ARGV[11] = 1) answers the same without taking anything or any place.
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
// ARGV[11] 1: peek   ARGV[12] least wait ms of an ask that is not next in line
// A tenant its upstream refused lately (ThrottlePool) is held back until its back-off
// ends, before anything else: it neither draws nor keeps a place in line (a place it
// could not use would hold the others up).
// Returns {1, level after, effective rate} when granted, {0, ms until expected,
// effective rate} when not, {0, ms until the tenant's back-off ends, effective rate,
// 1} when the tenant is held back.
var reservePoolScript = redisx.NewScript(luaNow + luaPoolLoad + `
local tenant, w, ask = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
local grace, peek = tonumber(ARGV[9]), ARGV[11] == '1'
local held = tonumber(redis.call('HGET', KEYS[1], 'b:' .. tenant))
if held and held > now then
  if not peek then redis.call('ZREM', KEYS[3], tenant) end
  return {0, math.min(math.ceil(held - now), tonumber(ARGV[10])), math.floor(eff), 1}
end
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
for _, m in ipairs(lapsed) do redis.call('ZREM', KEYS[3], m) end
if #lapsed > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now) end
for _, m in ipairs(lapsed) do
  if m ~= tenant and (tonumber(redis.call('HGET', KEYS[2], 'p:' .. m)) or v) <= v then
    redis.call('HDEL', KEYS[2], 'p:' .. m, 'w:' .. m, 'g:' .. m)
  end
end
if not peek and redis.call('HLEN', KEYS[2]) > 3 * redis.call('ZCARD', KEYS[4]) + 48 then
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
local others = redis.call('ZCARD', KEYS[4])
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
  if peek then return {1, math.floor(l - ask), math.floor(eff)} end
  l = l - ask
  if rpm > 0 then r = r - 1 end
  if p > v then
    redis.call('HSET', KEYS[2], 'g:' .. tenant, f(v) .. ':' .. f(p))
    v = p
  else
    redis.call('HDEL', KEYS[2], 'g:' .. tenant)
  end
  redis.call('HSET', KEYS[2], 'p:' .. tenant, f(p + ask / w), 'w:' .. tenant, w)
  redis.call('PEXPIRE', KEYS[2], idle)
  if back and back - grace > now then
    redis.call('ZADD', KEYS[3], f(p + ask / w), tenant)
  else
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
if peek then return {0, wait, math.floor(eff)} end
redis.call('ZADD', KEYS[3], f(p), tenant)
redis.call('ZADD', KEYS[4], 'GT', now + wait + grace, tenant)
redis.call('HSET', KEYS[2], 'p:' .. tenant, f(p), 'w:' .. tenant, w)
redis.call('PEXPIRE', KEYS[2], idle)
redis.call('PEXPIRE', KEYS[3], idle)
redis.call('PEXPIRE', KEYS[4], idle)
save()
return {0, wait, math.floor(eff)}
`)

// PoolBinding is the model pool an agent's steps draw on, with the tokens a step is
// estimated at before anything better is known.
type PoolBinding struct {
	Pool          PoolConfig
	TokensPerStep int64
}

// WaitReason is the wait_reason of a step waiting for the pool.
func (c PoolConfig) WaitReason() string { return "pool:" + c.Name }

// ThrottleReason is the wait_reason of a step waiting after the pool's upstream
// refused it, or while its tenant is held back for such a refusal.
func (c PoolConfig) ThrottleReason() string { return WaitThrottled + ":" + c.Name }

// PoolReserveParams is one step's reservation from a pool.
type PoolReserveParams struct {
	Pool   PoolConfig
	Tenant string
	Weight int   // the tenant's weight, as in the scheduler (>= 1)
	Tokens int64 // the step's estimate
}

// ReservePool reserves p.Tokens from the pool for the tenant, in weighted fair order.
// It goes through Options.Batch, when set, with concurrent reservations.
func (q *Quotas) ReservePool(ctx context.Context, p PoolReserveParams) (TokenAnswer, error) {
	if q.batch == nil {
		return q.reservePool(ctx, q.rdb, p).answer()
	}
	var r *poolReservation
	_ = q.batch.Do(ctx, func(pipe redis.Pipeliner) { r = q.reservePool(ctx, pipe, p) }) // its error is the answer's
	return r.answer()
}

// poolReservation is a pool reservation sent on a client or queued on a pipeline: its
// answer is there once the pipeline has run.
type poolReservation struct {
	name string
	cmd  *redis.Cmd
	err  error
}

// PoolWait is the wait ReservePool would answer now, without taking anything or any
// place in the pool's line (0 when it would grant): what a step its own limits hold
// back would wait for the pool besides.
func (q *Quotas) PoolWait(ctx context.Context, p PoolReserveParams) (time.Duration, error) {
	r := &poolReservation{name: p.Pool.Name}
	if r.err = p.Pool.check(); r.err == nil {
		r.cmd = q.runReservePool(ctx, q.rdb, p, true)
	}
	a, err := r.answer()
	if err != nil || a.Granted {
		return 0, err
	}
	return a.Wait, nil
}

func (q *Quotas) reservePool(ctx context.Context, c redis.Scripter, p PoolReserveParams) *poolReservation {
	r := &poolReservation{name: p.Pool.Name}
	if r.err = p.Pool.check(); r.err != nil {
		return r
	}
	r.cmd = q.runReservePool(ctx, c, p, false)
	return r
}

func (q *Quotas) runReservePool(ctx context.Context, c redis.Scripter, p PoolReserveParams, peek bool) *redis.Cmd {
	peekArg := 0
	if peek {
		peekArg = 1
	}
	return reservePoolScript.Run(ctx, c, q.poolKeys(p.Pool.Name), q.nowArg(),
		p.Pool.TokensPerMinute, p.Pool.Burst(), p.Pool.RequestsPerMinute, poolIdleTTL.Milliseconds(),
		p.Tenant, max(p.Weight, 1), max(p.Tokens, 0), poolClaimGrace.Milliseconds(), poolMaxWait.Milliseconds(),
		peekArg, poolMinIneligible.Milliseconds())
}

// answer is the reservation's answer; an error when it could not be asked (or was
// never sent: a nil reservation).
func (r *poolReservation) answer() (TokenAnswer, error) {
	if r == nil {
		return TokenAnswer{}, errors.New("quotas: a pool reservation that was never sent")
	}
	if r.err != nil {
		return TokenAnswer{}, r.err
	}
	res, err := r.cmd.Int64Slice()
	if err != nil {
		return TokenAnswer{}, fmt.Errorf("quotas: reserve pool %s: %w", r.name, err)
	}
	return tokenAnswer(res, "pool "+r.name)
}

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
// Returns the level after, in tokens.
var settlePoolScript = redisx.NewScript(luaNow + luaPoolLoad + `
local d = tonumber(ARGV[7])
l = math.min(burst, l - d)
local pw = redis.call('HMGET', KEYS[2], 'p:' .. ARGV[6], 'w:' .. ARGV[6])
local p, w = tonumber(pw[1]), tonumber(pw[2]) or 1
if p then
  redis.call('HSET', KEYS[2], 'p:' .. ARGV[6], f(p + d / w))
  redis.call('PEXPIRE', KEYS[2], idle)
  redis.call('ZADD', KEYS[3], 'XX', f(p + d / w), ARGV[6])
end
use(d)
save()
return math.floor(l)
`)

// PoolSettleParams settles one step against its pool: Tokens is its actual use minus
// its estimate (negative refunds). It names no weight: the settlement moves the
// tenant's pass at the weight its reservation wrote.
type PoolSettleParams struct {
	Pool   PoolConfig
	Tenant string
	Tokens int64
}

// SettlePool settles one step against its pool and returns the level after. On pipe
// (a redisx.Batch's) it goes in the round trip of the pipe's other calls and returns
// 0: its outcome is the pipe's; nil sends it alone.
func (q *Quotas) SettlePool(ctx context.Context, pipe redis.Pipeliner, p PoolSettleParams) (level int64, err error) {
	if err := p.Pool.check(); err != nil {
		return 0, err
	}
	keys := q.poolKeys(p.Pool.Name)[:3]
	cmd := settlePoolScript.Run(ctx, q.on(pipe), keys, q.nowArg(), p.Pool.TokensPerMinute, p.Pool.Burst(),
		p.Pool.RequestsPerMinute, poolIdleTTL.Milliseconds(), p.Tenant, p.Tokens)
	if pipe != nil {
		return 0, nil
	}
	if level, err = cmd.Int64(); err != nil {
		return 0, fmt.Errorf("quotas: settle pool %s: %w", p.Pool.Name, err)
	}
	return level, nil
}

// on is where a call that may share a round trip goes: pipe, or alone on the client.
func (q *Quotas) on(pipe redis.Pipeliner) redis.Scripter {
	if pipe != nil {
		return pipe
	}
	return q.rdb
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
// Returns the level after, in tokens.
var giveBackPoolScript = redisx.NewScript(luaNow + luaPoolLoad + `
local t, n = ARGV[6], tonumber(ARGV[7])
l = math.min(burst, l + n)
if rpm > 0 then r = math.min(rpm, r + 1) end
local pw = redis.call('HMGET', KEYS[2], 'p:' .. t, 'w:' .. t, 'g:' .. t)
local p, w = tonumber(pw[1]), tonumber(pw[2]) or 1
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
func (q *Quotas) GiveBackPool(ctx context.Context, pipe redis.Pipeliner, p PoolSettleParams) (level int64, err error) {
	if err := p.Pool.check(); err != nil {
		return 0, err
	}
	cmd := giveBackPoolScript.Run(ctx, q.on(pipe), q.poolKeys(p.Pool.Name)[:3], q.nowArg(), p.Pool.TokensPerMinute,
		p.Pool.Burst(), p.Pool.RequestsPerMinute, poolIdleTTL.Milliseconds(), p.Tenant, max(p.Tokens, 0))
	if pipe != nil {
		return 0, nil
	}
	if level, err = cmd.Int64(); err != nil {
		return 0, fmt.Errorf("quotas: give back to pool %s: %w", p.Pool.Name, err)
	}
	return level, nil
}

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
var throttlePoolScript = redisx.NewScript(luaNow + luaPoolLoad + `
local tenant, S, X = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
local function parts(s)
  local out = {}
  for p in string.gmatch(s or '', '[^:]+') do out[#out + 1] = p end
  return out
end
local k = parts(redis.call('HGET', KEYS[1], 'k:' .. tenant))
local held = tonumber(redis.call('HGET', KEYS[1], 'b:' .. tenant))
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

// PoolThrottleParams is an upstream's refusal of one tenant's step.
type PoolThrottleParams struct {
	Pool       PoolConfig
	Tenant     string
	Tokens     int64         // the refused step's estimate
	RetryAfter time.Duration // the upstream's retry time
}

// PoolThrottle is what a refusal did: the pool's effective rate after it, how long the
// tenant is held back from the pool (at least the retry time), and whether the pool
// itself was lowered (the refusal was evidence across tenants).
type PoolThrottle struct {
	EffectiveRate int64 // tokens a minute
	Backoff       time.Duration
	PoolWide      bool
}

// ThrottlePool records that the pool's upstream refused one of p.Tenant's steps: the
// tenant is held back, and the pool lowered only on evidence across tenants.
func (q *Quotas) ThrottlePool(ctx context.Context, p PoolThrottleParams) (PoolThrottle, error) {
	pool := p.Pool
	if err := pool.check(); err != nil {
		return PoolThrottle{}, err
	}
	keys := q.poolKeys(pool.Name)
	floor := max(1, int64(math.Ceil(float64(pool.TokensPerMinute)*poolFloor)))
	res, err := throttlePoolScript.Run(ctx, q.rdb, []string{keys[0], keys[3], keys[2]}, q.nowArg(), pool.TokensPerMinute,
		pool.Burst(), pool.RequestsPerMinute, poolIdleTTL.Milliseconds(), p.Tenant, max(p.Tokens, 0),
		max(p.RetryAfter.Milliseconds(), 0), poolDecrease, floor, poolEvidenceWindow.Milliseconds(),
		poolStreakQuiet.Milliseconds(), poolMaxWait.Milliseconds(), poolMeasureMin.Milliseconds(),
		poolMeasureMax.Milliseconds()).Int64Slice()
	if err != nil {
		return PoolThrottle{}, fmt.Errorf("quotas: throttle pool %s: %w", pool.Name, err)
	}
	if len(res) < 3 {
		return PoolThrottle{}, fmt.Errorf("quotas: throttle pool %s: unexpected reply %v", pool.Name, res)
	}
	return PoolThrottle{EffectiveRate: res[0], Backoff: time.Duration(res[1]) * time.Millisecond, PoolWide: res[2] == 1}, nil
}

// PoolWaiter is a tenant waiting on a pool, with its share of the pool among the
// waiting tenants (its weight over theirs).
type PoolWaiter struct {
	Tenant string
	Weight int
	Share  float64
}

// PoolStatus is a pool's state as the operator view shows it.
type PoolStatus struct {
	Level            int64 // tokens in the bucket now (negative: in debt)
	EffectiveRate    int64 // tokens a minute
	UsedLastMinute   int64 // tokens granted (and settled) in the last 60 s
	LastThrottledAgo time.Duration
	Throttled        bool // throttled answers lowered the pool in the last minute
	Waiting          []PoolWaiter
}

// PoolStatus reads a pool's state without changing it. The level and effective rate
// are as of the pool's last reservation, refilled to now.
func (q *Quotas) PoolStatus(ctx context.Context, pool PoolConfig) (PoolStatus, error) {
	if err := pool.check(); err != nil {
		return PoolStatus{}, err
	}
	keys := q.poolKeys(pool.Name)
	pipe := q.rdb.Pipeline()
	stCmd := pipe.HGetAll(ctx, keys[0])
	wCmd := pipe.ZRangeWithScores(ctx, keys[2], 0, 99)
	clCmd := pipe.ZRangeWithScores(ctx, keys[3], 0, 99)
	tCmd := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return PoolStatus{}, fmt.Errorf("quotas: pool %s status: %w", pool.Name, err)
	}
	nowMs := tCmd.Val().UnixMilli()
	if q.nowMs != nil {
		nowMs = q.nowMs()
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
			s.Waiting = append(s.Waiting, PoolWaiter{Tenant: t})
		}
	}
	if err := q.poolWaiterWeights(ctx, keys[1], &s); err != nil {
		return PoolStatus{}, err
	}
	return s, nil
}

func (q *Quotas) poolWaiterWeights(ctx context.Context, passes string, s *PoolStatus) error {
	if len(s.Waiting) == 0 {
		return nil
	}
	fields := make([]string, len(s.Waiting))
	for i, w := range s.Waiting {
		fields[i] = "w:" + w.Tenant
	}
	vals, err := q.rdb.HMGet(ctx, passes, fields...).Result()
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

func poolStatusFrom(h map[string]string, pool PoolConfig, nowMs int64) PoolStatus {
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
	s := PoolStatus{Level: int64(math.Floor(level)), EffectiveRate: int64(math.Floor(eff))}
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

func tokenAnswer(res []int64, what string) (TokenAnswer, error) {
	if len(res) < 2 {
		return TokenAnswer{}, fmt.Errorf("quotas: %s: unexpected reply %v", what, res)
	}
	var a TokenAnswer
	if len(res) > 2 {
		a.EffectiveRate = res[2]
	}
	if res[0] == 1 {
		a.Granted, a.Level = true, res[1]
	} else {
		a.Wait = time.Duration(res[1]) * time.Millisecond
		a.Throttled = len(res) > 3 && res[3] == 1
	}
	return a, nil
}
