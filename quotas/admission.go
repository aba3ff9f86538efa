package quotas

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"
	"golang.org/x/sync/singleflight"

	"github.com/agentq/agentq/internal/groupcommit"
	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
)

// Limits are the effective admission limits of one request: the tenant's plan with its
// overrides and the key's own limits applied. A value >= 0 is the limit (0 allows
// nothing); Off (-1) disables it. Build them with LimitsOf, or start from NoLimits.
type Limits struct {
	KeyRate, KeyBurst           float64 // per second
	TenantRate, TenantBurst     float64 // per second
	KeyAgentRate, KeyAgentBurst float64 // per second, per (key, agent)
	UserHourly, UserBurst       float64 // per hour, per on-behalf-of user
	Sessions                    int64
	LongRunning                 int64
	Backlog                     int64
	StepsDaily                  int64
	TokensMonthly               int64
	USDMonthlyMicro             int64
	// TokensPerMinute and TokensPerMinuteBurst are the ai_tokens_per_minute bucket,
	// in tokens; reserved by the worker before each step, not by admission. A rate
	// of 0 or below is not enforced (overrides refuse 0: a bucket that never fills
	// could only keep steps waiting for good).
	TokensPerMinute, TokensPerMinuteBurst int64
}

// Off is the value of a disabled limit in Limits and in the scripts.
const Off = -1

// NoLimits returns Limits with every limit off.
func NoLimits() Limits {
	return Limits{
		KeyRate: Off, KeyBurst: 1, TenantRate: Off, TenantBurst: 1, KeyAgentRate: Off, KeyAgentBurst: 1,
		UserHourly: Off, UserBurst: 1, Sessions: Off, LongRunning: Off, Backlog: Off, StepsDaily: Off,
		TokensMonthly: Off, USDMonthlyMicro: Off, TokensPerMinute: Off, TokensPerMinuteBurst: 1,
	}
}

// burstOr returns the "<name>_burst" value, or factor × the rate (at least 1) when
// none is set.
func burstOr(m map[string]Limit, name string, rate, factor float64) float64 {
	if b, ok := m[name+"_burst"]; ok && b >= 1 {
		return float64(b)
	}
	return math.Max(1, rate*factor)
}

// LimitsOf turns an effective limit map (Catalogue.Effective) into Limits. A limit the
// map lacks is off.
func LimitsOf(m map[string]Limit) Limits {
	f := func(name string) float64 {
		if v := lookup(m, name); !v.Off() {
			return float64(v)
		}
		return Off
	}
	n := func(name string) int64 { return int64(f(name)) }
	l := Limits{
		KeyRate:         f(KeyRate),
		TenantRate:      f(TenantRate),
		KeyAgentRate:    f(KeyAgentRate),
		UserHourly:      f(UserTasksHourly),
		Sessions:        n(ConcurrentSessions),
		LongRunning:     n(LongRunningInflight),
		Backlog:         n(QueueBacklog),
		StepsDaily:      n(AgentStepsDaily),
		TokensMonthly:   n(AITokensMonthly),
		USDMonthlyMicro: Off,
		TokensPerMinute: n(AITokensPerMinute),
	}
	if usd := f(USDMonthly); usd >= 0 {
		l.USDMonthlyMicro = int64(math.Round(usd * 1e6))
	}
	l.KeyBurst = burstOr(m, KeyRate, l.KeyRate, 2)
	l.TenantBurst = burstOr(m, TenantRate, l.TenantRate, 2)
	l.KeyAgentBurst = burstOr(m, KeyAgentRate, l.KeyAgentRate, 1)
	l.UserBurst = burstOr(m, UserTasksHourly, l.UserHourly, 1)
	l.TokensPerMinuteBurst = int64(burstOr(m, AITokensPerMinute, float64(l.TokensPerMinute), 1))
	return l
}

// LongRunningThreshold: tasks whose wallclock budget is above it hold a
// long_running_inflight lease.
const LongRunningThreshold = 5 * time.Minute

// MaxUsersPerTenant caps the distinct users tracked in a tenant's user buckets at once;
// users beyond it share one overflow bucket, so rotating user values cannot grow
// state without bound.
const MaxUsersPerTenant = 1000

// leaseTTL bounds a session lease whose task is never released (a crash before the
// release); admission also drops expired leases when a tenant reaches its limit.
const leaseTTL = 6 * time.Hour

// Quotas checks and takes limits in Redis.
type Quotas struct {
	rdb   redis.UniversalClient
	keys  rkeys.Keys
	nowMs func() int64 // nil: scripts read Redis TIME

	// textNums: the server's Lua lacks the struct library (an embedded test Redis),
	// so numbers are passed as text. Detected once.
	structOnce sync.Once
	structErr  error
	textNums   bool

	// admits are the shards' group commits of admissions (batcher.go); nil when
	// Options.Coalesce is off.
	admits          []groupcommit.Group[*admitReq]
	coalesceTimeout time.Duration
	// batch carries step reservations (Options.Batch); nil sends each alone.
	batch *redisx.Batch

	usage   UsageSource // what lost counters are rebuilt from (seed.go); nil: zero
	log     *slog.Logger
	rebuilt metric.Int64Counter // rebuilds (agentq.quotas.counters_rebuilt); nil: not counted
	seeds   singleflight.Group  // rebuilds in progress, by tenant
	seedMu  sync.Mutex
	seeded  map[string]uint64 // rebuilds finished, by tenant (seed.go)
}

// Options configure how a Quotas shares its calls to Redis with other callers. The
// zero value sends every call alone.
type Options struct {
	// Coalesce sends the admissions of one shard that arrive while a script call of
	// that shard is out together in the next one (batcher.go), each call bounded by
	// CoalesceTimeout (0: 5 s) rather than by its callers' deadlines. The App sets it
	// where the API runs, whose admissions come in concurrently.
	Coalesce        bool
	CoalesceTimeout time.Duration
	// Batch carries step and model pool reservations (ReserveStep, ReservePool) in
	// shared pipelines, with concurrent ones; the App gives the Batch the worker and
	// the scheduler use.
	Batch *redisx.Batch
}

// New returns a Quotas on rdb. nowMs, when not nil, replaces Redis TIME (tests). At
// most one Options may be given.
func New(rdb redis.UniversalClient, keys rkeys.Keys, nowMs func() int64, opts ...Options) *Quotas {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	q := &Quotas{rdb: rdb, keys: keys, nowMs: nowMs, batch: o.Batch, coalesceTimeout: o.CoalesceTimeout}
	if q.coalesceTimeout <= 0 {
		q.coalesceTimeout = defaultCoalesceTimeout
	}
	if o.Coalesce {
		q.admits = q.newAdmitGroups()
	}
	return q
}

// Keys returns the key builder.
func (q *Quotas) Keys() rkeys.Keys { return q.keys }

func (q *Quotas) nowArg() string {
	if q.nowMs == nil {
		return ""
	}
	return strconv.FormatInt(q.nowMs(), 10)
}

// Mode says what an admission call does.
type Mode string

// Modes of the admission script.
const (
	ModeAdmit Mode = "admit" // check every scope, take all or nothing
	ModePeek  Mode = "peek"  // report every scope, take nothing (GET /v1/usage)
	ModeKey   Mode = "key"   // take the key bucket only (reads)
)

// Scope is one limit's state in a decision.
type Scope struct {
	Name       string
	Limit      float64 // rate per window, or a count; -1 (off) only in a peek
	Window     time.Duration
	Used       float64
	Remaining  int64
	Reset      time.Duration // until the limit is fully restored / the window resets
	RetryAfter time.Duration // when Violated: until a retry can pass
	Violated   bool
}

// Decision is the outcome of an admission call.
type Decision struct {
	Allowed    bool
	OutOfScope bool // the key bucket was taken, then the scope check failed
	Scopes     []Scope
	Violated   []string
	Degraded   bool // decided in process because Redis was unreachable

	unseeded bool // the script did not decide: the period counters need rebuilding first
}

// AdmitParams describe one request.
type AdmitParams struct {
	Mode        Mode
	TenantID    string
	Kid         string
	Agent       string
	User        string
	TaskID      string // lease member; required for ModeAdmit
	InScope     bool
	LongRunning bool
	Limits      Limits
	Period      Period
}

// admitScript runs one or more admissions, in order, in one atomic call. Each checks
// every scope and, only if all pass, takes them all.
//
// Cost notes, measured (docs/benchmarks.md): in Redis's Lua, creating strings —
// arguments, field names, number-to-text for replies, tonumber on text — costs more
// than the commands. So Go passes field names ready-made and the numbers packed in one
// binary argument (struct.unpack), the script does arithmetic only, and it answers with
// one packed string of the state it read and what it decided; Go derives remaining,
// reset and retry-after with the same formulas (decision.go). A tenant's buckets and
// counters are one hash (one HMGET, one HSET). Concurrent admissions of one shard are
// coalesced into one call (batcher.go); each sees the ones before it. No step costs
// more with the size of the tenant's state: user buckets are fields of the hash,
// counted in "nu"; once MaxUsersPerTenant are tracked, a new user's admission sweeps a
// bounded slice of them (HSCAN with a cursor kept in "uc") for buckets full again, and
// users still beyond the cap share one overflow bucket.
//
// KEYS, 8 per admission, on one shard: state hash, session leases (zset), long-running
// leases (zset), tenant queue (zset), steps per hour (hash), admitted-not-yet-queued
// tasks (zset), refusal counts (hash), the shard's tenants with refusal counts (set)
// ARGV[1] now ms or ""   ARGV[2] lease ttl ms   ARGV[3] max users per tenant
// ARGV[4] state ttl ms   ARGV[5] pending ttl ms   ARGV[6] user field prefix "u:"
// ARGV[7] the shared overflow user field   ARGV[8] lease set keep ms (lease ttl plus
// leaseSlack)   ARGV[9] refusal counts ttl ms, then 8 per admission:
//
//	1 numbers, 17 little-endian doubles: mode (0 admit, 1 peek, 2 key), in scope,
//	  long-running, key rate, key burst, tenant rate, tenant burst, key-agent rate,
//	  key-agent burst (per second), user rate, user burst (per hour), sessions,
//	  long-running, backlog, steps daily, tokens monthly, usd monthly (micro)
//	2 task id   3 key field "k:<kid>"   4 key-agent field "a:<kid>:<agent>" or ""
//	5 user field "u:<user>" or ""   6 tokens field "tok:<period>"   7 usd field "usd:<period>"
//	8 tenant id
//
// A limit >= 0 is on (0 allows nothing), -1 is off. Monthly tokens and money refuse a
// task once a positive quota is used up; a quota of 0 does not refuse tasks, since a
// task may cost nothing: its steps are refused once they would cost (ReserveStep).
// Answers one string per admission: 14 little-endian doubles,
//
//	status (0 ok, 1 denied, 2 out of scope, 3 unseeded), now, violated-scope bitmask, key tat,
//	tenant tat, key-agent tat, user tat (0 if none), sessions, long-running, backlog
//	(queued plus admitted-not-yet-queued), steps in the last 24 h, oldest counted hour,
//	tokens, usd (micro)
//
// "denied" takes nothing but the key's token: the key bucket comes first and counts
// every request; "out of scope" takes the key's token only; "unseeded" (the period
// counters lack their rebuilt-from-the-ledger mark, see seed.go) takes nothing.
//
// A denied admission (mode admit) is counted: one HINCRBY of the field
// "<violated-scope bitmask>:<minute since the epoch>" of the tenant's refusal counts
// (rkeys.RejectionField), ":<period>" added when a monthly quota refused (ai_tokens or
// usd, bits 256 and 512, the highest), so a refusal costs one command however many
// limits refused it. The first count of a field adds the tenant to its shard's set of tenants with
// counts, for the flush to Postgres (rejections.go), and gives the hash its TTL.
var admitScript = redis.NewScript(luaNow + `
local lease_ttl, max_users, state_ttl, pending_ttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local user_match, overflow = ARGV[6] .. '*', ARGV[7]
-- Numbers passed to redis.call are formatted to text on every call; the lease scores
-- and TTLs are the same for every admission of a call, so they go as text made once.
local pending_ms, lease_keep_ms = ARGV[5], ARGV[8]
local lease_keep = tonumber(lease_keep_ms)
local lease_at, pending_at = string.format('%.17g', now + lease_ttl), string.format('%.17g', now + pending_ttl)
local floor, call = math.floor, redis.call
-- Redis has the struct library; an embedded test Redis (miniredis) may not, and then
-- the numbers travel as comma-separated text instead.
local S = rawget(_G, 'struct')
local function unpackn(fmt, s)
  if S then return S.unpack(fmt, s) end
  local t = {}
  for v in string.gmatch(s, '[^,]+') do t[#t+1] = tonumber(v) end
  return unpack(t)
end
local function pack(fmt, ...)
  if S then return S.pack(fmt, ...) end
  local t = {...}
  for i = 1, #t do t[i] = string.format('%.6f', t[i]) end
  return table.concat(t, ',')
end
local hour = floor(now / 3600000)
local reply = {}
local user_sweep = 32 -- user fields a new user's admission at the cap may sweep
local admit_globals = 9
local rej_ttl = ARGV[9]

-- GCRA (as go-redis/redis_rate); tat in ms. Returns the new tat, or nil if refused.
-- A tat beyond what the current rate and burst can produce means the limit changed
-- since: the bucket restarts as nearly empty (one token), so a raised limit takes
-- effect at once instead of after the old, slower refill. A rate of 0 refuses all.
local function gcra(t, rate, burst, period)
  if rate <= 0 then return nil end
  local T = period / rate
  if t < now then t = now end
  if t > now + T * burst then t = now + T * burst - T end
  if t + T - T * burst > now then return nil end
  return t + T
end

for r = 0, (#KEYS / 8) - 1 do
  local b = r * 8
  local H, SL, LL, Q, S, P = KEYS[b + 1], KEYS[b + 2], KEYS[b + 3], KEYS[b + 4], KEYS[b + 5], KEYS[b + 6]
  local a = r * 8 + admit_globals
  local mode, in_scope, is_long, key_rate, key_burst, t_rate, t_burst, ka_rate, ka_burst,
        u_rate, u_burst, sessions, long, backlog_max, steps_max, tokens_max, usd_max =
        unpackn('<ddddddddddddddddd', ARGV[a + 1])
  local task, kf, af, uf = ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5]
  local peek, admit = mode == 1, mode == 0
  local status, mask = 0, 0
  local w = {}
  local kt, tt, at, ut, x, ot, nu, uc, lx = 0, 0, 0, nil, 0, nil, 0, '0', 0
  local s, l, backlog, steps, oldest, tok, usd = 0, 0, 0, 0, hour, 0, 0
  if mode == 2 then
    kt = tonumber(call('HGET', H, kf)) or 0
  else
    local v = call('HMGET', H, kf, 't', af == '' and 't' or af, uf == '' and 't' or uf, 'nu', 'x',
      ARGV[a + 6], ARGV[a + 7], overflow, 'uc', 'sd', 'lx')
    kt, tt, x = tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[6]) or 0
    if af ~= '' then at = tonumber(v[3]) or 0 end
    if uf ~= '' then ut = tonumber(v[4]) end
    nu, tok, usd, ot, uc = tonumber(v[5]) or 0, tonumber(v[7]) or 0, tonumber(v[8]) or 0, tonumber(v[9]), v[10] or '0'
    lx = tonumber(v[12]) or 0
    -- Period counters without the "sd" mark were not rebuilt from the ledger since
    -- Redis lost them (or never held them): deciding on them would hand a tenant its
    -- used-up quotas back. Answer "unseeded", take nothing; the caller rebuilds them.
    if not v[11] and (peek or (admit and in_scope == 1 and (steps_max >= 0 or tokens_max >= 0 or usd_max >= 0))) then
      status = 3
    end
  end
  -- 1. the key bucket: every authenticated request spends it
  if status == 0 and key_rate >= 0 and not peek then
    local new = gcra(kt, key_rate, key_burst, 1000)
    if new then w[#w+1] = kf; w[#w+1] = new else mask = 1; status = 1 end
  end
  if mode ~= 2 and status == 0 and not (admit and in_scope == 0) then
    local nw = #w
    -- 2. everything else: check all, then take all or nothing
    if t_rate >= 0 and not peek then
      local new = gcra(tt, t_rate, t_burst, 1000)
      if new then w[#w+1] = 't'; w[#w+1] = new else mask = mask + 2 end
    end
    if ka_rate >= 0 and af ~= '' and not peek then
      local new = gcra(at, ka_rate, ka_burst, 1000)
      if new then w[#w+1] = af; w[#w+1] = new else mask = mask + 4 end
    end
    if u_rate >= 0 and uf ~= '' then
      if not ut and nu >= max_users and admit then
        -- At the cap. Users whose buckets are full again are the same as absent: a
        -- bounded slice of the hash is swept per such admission (a cursor carries on
        -- from the last one), so its cost never grows with the users tracked.
        local res = call('HSCAN', H, uc, 'MATCH', user_match, 'COUNT', user_sweep)
        local fields = res[2]
        for i = 1, #fields, 2 do
          if fields[i] ~= overflow and (tonumber(fields[i + 1]) or 0) <= now then
            call('HDEL', H, fields[i])
            nu = nu - 1
          end
        end
        nu = math.max(nu, 0)
        call('HSET', H, 'nu', nu, 'uc', res[1])
      end
      if not ut and nu >= max_users then
        uf, ut = overflow, ot -- users beyond the cap share one bucket
      end
      if not peek then
        local new = gcra(ut or 0, u_rate, u_burst, 3600000)
        if new then
          w[#w+1] = uf; w[#w+1] = new
          if not ut then w[#w+1] = 'nu'; w[#w+1] = nu + 1 end
        else
          mask = mask + 8
        end
      end
      ut = ut or 0
    end
    -- A lease is in one set: a long-running task's in LL, any other's in SL. So
    -- sessions count both sets and long-running ones LL alone, and a long-running
    -- admission writes one set, not two.
    local long_on = long >= 0 and is_long == 1
    local sess_on = sessions >= 0 or peek
    if sess_on or long_on or peek then
      l = call('ZCARD', LL)
      local short = sess_on and call('ZCARD', SL) or 0
      s = short + l
      -- count live leases only: near a limit, drop expired ones first
      if peek or (sess_on and s >= sessions) or (long_on and l >= long) then
        call('ZREMRANGEBYSCORE', LL, '-inf', now)
        l = call('ZCARD', LL)
        if sess_on then
          call('ZREMRANGEBYSCORE', SL, '-inf', now)
          short = call('ZCARD', SL)
        end
        s = short + l
      end
      if admit and sessions >= 0 and s >= sessions then mask = mask + 16 end
      if admit and long_on and l >= long then mask = mask + 32 end
    end
    if backlog_max >= 0 or peek then
      -- admitted tasks are counted from admission on, before the push to the queue
      backlog = call('ZCARD', Q)
      local pend = call('ZCARD', P)
      if pend > 0 and (peek or backlog + pend >= backlog_max) then
        call('ZREMRANGEBYSCORE', P, '-inf', now)
        pend = call('ZCARD', P)
      end
      backlog = backlog + pend
      if admit and backlog >= backlog_max then mask = mask + 64 end
    end
    if steps_max >= 0 or peek then
      local all = call('HGETALL', S)
      for i = 1, #all, 2 do
        local h = tonumber(all[i])
        if h > hour - 24 then
          steps = steps + tonumber(all[i+1])
          if h < oldest then oldest = h end
        end
      end
      if admit and steps >= steps_max then mask = mask + 128 end
    end
    if admit and tokens_max > 0 and tok >= tokens_max then mask = mask + 256 end
    if admit and usd_max > 0 and usd >= usd_max then mask = mask + 512 end

    if mask > 0 then
      status = 1
      for i = #w, nw + 1, -1 do w[i] = nil end -- keep only the key's token
    elseif admit then
      -- The lease sets must outlive their newest lease. Both are given lease_keep (a
      -- lease TTL plus slack) at once and "lx" notes until when, so while lx is a lease
      -- TTL or more away an existing set needs no PEXPIRE; a set this admission
      -- creates (it counted 0) always gets one. Every writer that creates or extends a
      -- set gives it at least that long (AddLease, touch), so lx never overstates.
      local keep = lx >= now + lease_ttl
      local leased = sessions >= 0 or long_on
      if leased and is_long == 1 then
        call('ZADD', LL, lease_at, task)
        if keep and l == 0 then call('PEXPIRE', LL, lease_keep_ms) end
      elseif leased then
        call('ZADD', SL, lease_at, task)
        if keep and s - l == 0 then call('PEXPIRE', SL, lease_keep_ms) end
      end
      if not keep and leased then
        call('PEXPIRE', SL, lease_keep_ms)
        call('PEXPIRE', LL, lease_keep_ms)
        w[#w+1] = 'lx'; w[#w+1] = now + lease_keep
      end
      if backlog_max >= 0 then
        call('ZADD', P, pending_at, task)
        call('PEXPIRE', P, pending_ms)
      end
    end
  elseif mode ~= 2 and status == 0 then
    status = 2
  end
  if admit and status == 1 then
    local RJ = KEYS[b + 7]
    local rf = mask .. ':' .. floor(now / 60000)
    -- a monthly quota's refusal names the period it was decided in (the tokens
    -- field's, "tok:<period>"), not the one this clock's minute falls in
    if mask >= 256 then rf = rf .. ':' .. string.match(ARGV[a + 6], '[^:]*$') end
    if call('HINCRBY', RJ, rf, 1) == 1 then
      call('SADD', KEYS[b + 8], ARGV[a + 8])
      call('PEXPIRE', RJ, rej_ttl)
    end
  end
  if #w > 0 then
    call('HSET', H, unpack(w))
    -- the state hash lives state_ttl after its last refresh (at most daily); x says when
    if mode ~= 2 and x < now + state_ttl - 86400000 then
      call('HSET', H, 'x', now + state_ttl)
      call('PEXPIRE', H, state_ttl)
    elseif mode == 2 and call('PTTL', H) < 0 then
      call('PEXPIRE', H, state_ttl)
    end
  end
  reply[#reply+1] = pack('<dddddddddddddd', status, now, mask, kt, tt, at, ut or 0, s, l, backlog, steps, oldest, tok, usd)
end
return reply
`)

// luaNow starts every script that needs the time: ARGV[1] is "now" in ms (tests pass
// a fake clock), or "" to read Redis TIME, one clock for every replica.
const luaNow = `
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
`

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// statusUnseeded is the admission script's answer for counters that lack their mark.
const statusUnseeded = 3

// admitKeysPerCall and admitArgsPerCall are the script's strides; admitGlobalArgs
// its leading ARGV shared by every admission of a call.
const admitKeysPerCall, admitArgsPerCall, admitGlobalArgs = 8, 8, 9

// leaseSlack is how much longer than a lease TTL the lease sets are kept alive, so
// that admissions need to push their expiry forward only once per slack, not each time.
const leaseSlack = time.Hour

// PendingTTL bounds how long an admitted task counts against queue_backlog before it
// is in its queue: the scheduler's enqueue clears its mark; a process that dies
// in between frees the count within PendingTTL.
const PendingTTL = time.Minute

// stateTTL bounds the life of an idle tenant's admission state: past a billing period,
// so monthly counters survive until the period ends.
const stateTTL = 35 * 24 * time.Hour

var modeCode = map[Mode]float64{ModeAdmit: 0, ModePeek: 1, ModeKey: 2}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (q *Quotas) appendAdmit(keys []string, args []any, p AdmitParams) ([]string, []any) {
	k := q.keys
	keys = append(keys, k.AdmissionState(p.TenantID), k.Sessions(p.TenantID), k.LongRunning(p.TenantID),
		k.TenantQueue(p.TenantID), k.StepsDaily(p.TenantID), k.PendingQueue(p.TenantID),
		k.Rejections(p.TenantID), k.RejectingTenants(k.Shard(p.TenantID)))
	l := p.Limits
	nums := [17]float64{
		modeCode[p.Mode], b2f(p.InScope), b2f(p.LongRunning), l.KeyRate, l.KeyBurst, l.TenantRate, l.TenantBurst,
		l.KeyAgentRate, l.KeyAgentBurst, l.UserHourly, l.UserBurst, float64(l.Sessions), float64(l.LongRunning),
		float64(l.Backlog), float64(l.StepsDaily), float64(l.TokensMonthly), float64(l.USDMonthlyMicro),
	}
	packed := q.encodeNums(nums[:])
	af, uf := "", ""
	if p.Agent != "" {
		af = rkeys.KeyAgentField(p.Kid, p.Agent)
	}
	if p.User != "" {
		uf = rkeys.UserField(p.User)
	}
	args = append(args, packed, p.TaskID, rkeys.KeyBucketField(p.Kid), af, uf,
		rkeys.TokensField(p.Period.ID), rkeys.USDField(p.Period.ID), p.TenantID)
	return keys, args
}

func boolArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// Admit runs the admission script: in ModeAdmit it checks and takes every scope in one
// atomic call; ModePeek reports without taking; ModeKey spends the key bucket only.
// With Options.Coalesce, concurrent calls are coalesced into one script call per shard.
// Counters Redis lost are rebuilt from the ledger before anything is decided on them.
func (q *Quotas) Admit(ctx context.Context, p AdmitParams) (Decision, error) {
	var d Decision
	err := q.untilSeeded(ctx, p.TenantID, p.Period, func() (bool, error) {
		var err error
		d, err = q.admitRaw(ctx, p)
		return d.unseeded, err
	})
	if err != nil {
		return Decision{}, err
	}
	return d, nil
}

// admitRaw is one admission call, which may answer unseeded.
func (q *Quotas) admitRaw(ctx context.Context, p AdmitParams) (Decision, error) {
	if q.admits != nil {
		return q.admitCoalesced(ctx, p)
	}
	ds, err := q.admitBatch(ctx, []AdmitParams{p})
	if err != nil {
		return Decision{}, err
	}
	return ds[0], nil
}

// admitBatch runs admissions of one shard in one script call, in order.
func (q *Quotas) admitBatch(ctx context.Context, ps []AdmitParams) ([]Decision, error) {
	if err := q.detectStruct(ctx); err != nil {
		return nil, err
	}
	keys := make([]string, 0, admitKeysPerCall*len(ps))
	args := make([]any, 0, admitGlobalArgs+admitArgsPerCall*len(ps))
	args = append(args, q.nowArg(), leaseTTL.Milliseconds(), MaxUsersPerTenant, stateTTL.Milliseconds(), PendingTTL.Milliseconds(),
		rkeys.UserPrefix, rkeys.UserOverflowField, (leaseTTL + leaseSlack).Milliseconds(), RejectionsTTL.Milliseconds())
	for i := range ps {
		if ps[i].Mode == "" {
			ps[i].Mode = ModeAdmit
		}
		keys, args = q.appendAdmit(keys, args, ps[i])
	}
	res, err := admitScript.Run(ctx, q.rdb, keys, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("quotas: admit: %w", err)
	}
	if len(res) != len(ps) {
		return nil, fmt.Errorf("quotas: admit: %d replies for %d admissions", len(res), len(ps))
	}
	ds := make([]Decision, len(ps))
	for i, p := range ps {
		st, err := q.parseState(res[i])
		if err != nil {
			return nil, err
		}
		if st.status == statusUnseeded {
			ds[i] = Decision{unseeded: true}
			continue
		}
		ds[i] = decide(p, st)
	}
	return ds, nil
}

var windows = map[string]time.Duration{
	KeyRate: time.Second, TenantRate: time.Second, KeyAgentRate: time.Second,
	UserTasksHourly: time.Hour, AgentStepsDaily: 24 * time.Hour,
}

// Release frees a task's lease (session or long-running), and its place in the
// admitted-not-yet-queued count. Releasing twice is harmless. Alone (pipe nil) it
// returns the number of leases removed. On pipe (a redisx.Batch's) it goes in the
// round trip of the pipe's other calls and returns 0: its outcome is the pipe's.
func (q *Quotas) Release(ctx context.Context, pipe redis.Pipeliner, tenantID, taskID string) (int, error) {
	if pipe != nil {
		q.queueRelease(ctx, pipe, tenantID, taskID)
		return 0, nil
	}
	pipe = q.rdb.TxPipeline()
	a, b := q.queueRelease(ctx, pipe, tenantID, taskID)
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("quotas: release: %w", err)
	}
	return int(a.Val() + b.Val()), nil
}

// queueRelease queues Release on pipe; the two answers count the session and
// long-running leases it freed.
func (q *Quotas) queueRelease(ctx context.Context, pipe redis.Pipeliner, tenantID, taskID string) (sessions, longRunning *redis.IntCmd) {
	sessions = pipe.ZRem(ctx, q.keys.Sessions(tenantID), taskID)
	longRunning = pipe.ZRem(ctx, q.keys.LongRunning(tenantID), taskID)
	pipe.ZRem(ctx, q.keys.PendingQueue(tenantID), taskID)
	return sessions, longRunning
}

// reserveStepScript checks a tenant's step-time quotas before a step and, if they
// allow it, reserves the step: one step against the sliding day, and an estimate of its
// tokens and cost against the month. SettleStep later books the difference between
// the estimate and what the step reported.
//
// A limit >= 0 is on, -1 off. A monthly quota refuses a step whose estimate does not
// fit, and a step of unknown cost (estimate 0) once a positive quota is used up. Each
// step reserves what the task's previous step cost, so under a $0 quota steps that
// cost nothing run, and the step after one that cost money is refused.
//
// Billing periods: "per" holds the newest period seen. A request of a newer period
// starts it (the previous one's counters go); a request of an older one (a step that
// began before the boundary, a worker's clock behind) books into the newest period,
// so tasks on both sides of the boundary never wipe each other's counters. Period ids
// are start dates, yyyymmdd, so they compare as numbers. A period set by a change of
// the tenant's billing anchor ("pe" holds its end) is not left before it ends, whatever
// the request's period (anchor.go).
//
// KEYS[1] state hash   KEYS[2] steps hash
// ARGV[1] now ms or ""   ARGV[2] steps daily limit   ARGV[3] tokens monthly limit
// ARGV[4] usd monthly limit (micro)   ARGV[5] estimated tokens   ARGV[6] estimated usd
// ARGV[7] period id   ARGV[8] state ttl ms   ARGV[9] tokens field prefix "tok:"
// ARGV[10] usd field prefix "usd:" (a field is prefix .. period id)
// KEYS[3] the tenant's ai_tokens_per_minute bucket   ARGV[11] its tokens a minute (<= 0:
// off)   ARGV[12] its burst
// Returns {0} when reserved, {1, limit type, used, limit} when a quota refuses, {3, ms}
// when the step must wait that long for ai_tokens_per_minute, or {2} when the counters
// lack their "sd" mark (unseeded, see seed.go): nothing is taken.
// That holds even when every quota is off: a reservation writes the counters, and one
// written before the seed would be wiped by it.
var reserveStepScript = redisx.NewScript(luaNow + luaTenantTokens + `
local H, S = KEYS[1], KEYS[2]
local m = redis.call('HMGET', H, 'per', 'sd', 'pe')
if not m[2] then return {2} end -- unseeded: the caller rebuilds the counters first
local hour = math.floor(now / 3600000)
local steps_max, tok_max, usd_max = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local est_tok, est_usd = tonumber(ARGV[5]), tonumber(ARGV[6])
if steps_max >= 0 then
  local used = 0
  local all = redis.call('HGETALL', S)
  for i = 1, #all, 2 do
    if tonumber(all[i]) > hour - 24 then used = used + tonumber(all[i+1]) end
  end
  if used >= steps_max then return {1, 'agent_steps_daily', used, steps_max} end
end
local per = m[1]
-- a period set by an anchor change ("pe", its end) holds until it ends (anchor.go)
local held = m[3] and now < tonumber(m[3])
local newer = not per or (not held and (tonumber(ARGV[7]) or 0) > tonumber(per))
if newer then per = ARGV[7] end
local tp, up = ARGV[9], ARGV[10]
local tf, uf = tp .. per, up .. per
local v = redis.call('HMGET', H, tf, uf, 'x')
local tok, usd = tonumber(v[1]) or 0, tonumber(v[2]) or 0
-- A step whose estimate does not fit is refused; so is one of unknown cost (estimate
-- 0) once a positive quota is used up. Under a quota of 0 a step estimated at 0 runs.
local function refuses(used, est, limit)
  if limit < 0 then return false end
  if est > 0 then return used + est > limit end
  return limit > 0 and used >= limit
end
if refuses(tok, est_tok, tok_max) then return {1, 'ai_tokens_monthly', tok, tok_max} end
if refuses(usd, est_usd, usd_max) then return {1, 'usd_monthly', usd, usd_max} end
local tpm, tpm_burst = tonumber(ARGV[11]), tonumber(ARGV[12])
local tl, trate
if tpm > 0 then
  -- ai_tokens_per_minute: the step waits (nothing taken) until the bucket holds its
  -- estimate, or a full bucket for an estimate above the burst; in debt, even an
  -- estimate of 0 waits
  tl, trate = tpm_load(3, tpm, tpm_burst)
  local need = math.min(math.max(est_tok, 0), tpm_burst)
  if tl < need or tl < 0 then return {3, math.max(1, math.ceil((math.max(need, 0) - tl) / trate))} end
end
if redis.call('HINCRBY', S, hour, 1) == 1 then
  -- a new hour: drop the ones that left the 24 h window
  for _, f in ipairs(redis.call('HKEYS', S)) do
    if tonumber(f) <= hour - 24 then redis.call('HDEL', S, f) end
  end
  redis.call('PEXPIRE', S, 25 * 3600000)
end
if newer then
  -- a new billing period: the previous ones' counters go
  for _, f in ipairs(redis.call('HKEYS', H)) do
    local p
    if f:sub(1, #tp) == tp then p = f:sub(#tp + 1) elseif f:sub(1, #up) == up then p = f:sub(#up + 1) end
    if p and p ~= per then redis.call('HDEL', H, f) end
  end
  redis.call('HSET', H, 'per', per)
  if m[3] then redis.call('HDEL', H, 'pe') end
end
if est_tok ~= 0 then redis.call('HINCRBY', H, tf, est_tok) end
if est_usd ~= 0 then redis.call('HINCRBY', H, uf, est_usd) end
if tl then tpm_save(3, tl - math.max(est_tok, 0), trate, tpm_burst) end
if (tonumber(v[3]) or 0) < now + tonumber(ARGV[8]) - 86400000 then
  redis.call('HSET', H, 'x', now + tonumber(ARGV[8]))
  redis.call('PEXPIRE', H, ARGV[8])
end
return {0}
`)

// StepParams describe a step's quota reservation or settlement.
type StepParams struct {
	TenantID string
	Period   Period
	Limits   Limits
	// Reserve: the estimate. Settle: what the step used minus what was reserved.
	Tokens, CostMicro int64
	// Settle only: -1 gives the reserved step back (the step did not complete).
	Steps int64
}

// QuotaExceeded names the quota that refused a step.
type QuotaExceeded struct {
	LimitType   string
	Used, Limit float64
	// Period is the billing period the refused reservation was decided in: the one
	// whose counters refused it, whatever the time when its refusal is reported.
	Period Period
	// At is when it was refused (the daily steps quota's events dedupe per UTC day).
	At time.Time
}

// Stop is e as the limit that ended a task.
func (e *QuotaExceeded) Stop() Stop {
	return Stop{LimitType: e.LimitType, Limit: int64(math.Round(e.Limit)), Used: int64(math.Round(e.Used)), Period: e.Period, At: e.At}
}

// Stop is the limit that ended a task budget_exceeded: its type, its value and the
// usage that met it, in the limit's unit (micro-dollars for money, whole seconds for
// wall clock). The worker hands it to the task's end, so what reports the stop (the
// usage.limit_hit event) never has to read it back out of the task's error text.
type Stop struct {
	LimitType   string
	Limit, Used int64
	// Period is the billing period a tenant's quota stopped the task in, and At when
	// (both zero for a task's own budget): its limit_hit is that period's (that UTC
	// day's for the daily steps), even when the task's end is written after it ended.
	Period Period
	At     time.Time
}

// The limit types of a task's own budget, as a Stop names them.
const (
	TaskMaxSteps     = "task_max_steps"
	TaskMaxCostUSD   = "task_max_cost_usd"
	TaskMaxWallclock = "task_max_wallclock_s"
)

func (e *QuotaExceeded) Error() string {
	if e.LimitType == USDMonthly { // micro-dollars inside, dollars outside
		return fmt.Sprintf("%s limit of $%.2f reached (used $%.6f)", e.LimitType, e.Limit/1e6, e.Used/1e6)
	}
	return fmt.Sprintf("%s limit of %.0f reached (used %.0f)", e.LimitType, e.Limit, e.Used)
}

// ReserveStep checks agent_steps_daily, ai_tokens_monthly and usd_monthly before a
// step and reserves one step and the estimated tokens and cost. A refusal is a
// *QuotaExceeded. The admission check reads the same counters; counters Redis lost
// are rebuilt from the ledger first.
//
// The first try goes through Options.Batch, when set, with concurrent reservations;
// along are calls that ride in its round trip, on its pipe (a task's "running"
// message), sent once whatever the reservation's answer. Their outcome is not the
// reservation's. A try after a rebuild goes alone.
func (q *Quotas) ReserveStep(ctx context.Context, p StepParams, along ...func(pipe redis.Pipeliner)) error {
	var refused error
	first := true
	err := q.untilSeeded(ctx, p.TenantID, p.Period, func() (bool, error) {
		var cmd *redis.Cmd
		queue := func(pipe redis.Pipeliner) {
			cmd = q.reserveStep(ctx, pipe, p)
			for _, a := range along {
				a(pipe)
			}
		}
		switch {
		case first && q.batch != nil:
			_ = q.batch.Do(ctx, queue) // the reservation's error is cmd's
		case first && len(along) > 0:
			pipe := q.rdb.Pipeline()
			queue(pipe)
			_, _ = pipe.Exec(ctx)
			if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
				cmd = q.reserveStep(ctx, q.rdb, p) // a client's Run loads the script
			}
		default:
			cmd = q.reserveStep(ctx, q.rdb, p)
		}
		first = false
		res, err := cmd.Slice()
		if err != nil {
			return false, fmt.Errorf("quotas: reserve step: %w", err)
		}
		switch n, _ := res[0].(int64); {
		case n == 2:
			return true, nil
		case n == 1 && len(res) == 4:
			used, _ := res[2].(int64)
			limit, _ := res[3].(int64)
			refused = &QuotaExceeded{LimitType: str(res[1]), Used: float64(used), Limit: float64(limit), Period: p.Period, At: q.now()}
		case n == 3 && len(res) == 2:
			ms, _ := res[1].(int64)
			refused = &CapacityWait{Reason: WaitTokensPerMinute, Wait: time.Duration(ms) * time.Millisecond}
		}
		return false, nil
	})
	if err != nil {
		return err
	}
	return refused
}

func (q *Quotas) reserveStep(ctx context.Context, c redis.Scripter, p StepParams) *redis.Cmd {
	l := p.Limits
	tpm, burst := l.tokensPerMinute()
	return reserveStepScript.Run(ctx, c,
		[]string{q.keys.AdmissionState(p.TenantID), q.keys.StepsDaily(p.TenantID), q.keys.TenantTokens(p.TenantID)},
		q.nowArg(), l.StepsDaily, l.TokensMonthly, l.USDMonthlyMicro, p.Tokens, p.CostMicro,
		p.Period.ID, stateTTL.Milliseconds(), rkeys.TokensPrefix, rkeys.USDPrefix, tpm, burst)
}

// tokensPerMinute is the ai_tokens_per_minute bucket's rate and burst as the step
// scripts take them: rate 0 when the limit is off.
func (l Limits) tokensPerMinute() (rate, burst int64) {
	if l.TokensPerMinute <= 0 {
		return 0, 1
	}
	burst = l.TokensPerMinuteBurst
	if burst <= 0 {
		burst = l.TokensPerMinute
	}
	return l.TokensPerMinute, burst
}

// WaitTokensPerMinute is the wait_reason of a step waiting for its tenant's
// ai_tokens_per_minute; a step waiting for a model pool waits for "pool:<name>".
const WaitTokensPerMinute = "tokens_per_minute"

// WaitThrottled is the wait_reason of a step waiting after its agent's upstream
// refused it ("throttled"), or, for an agent bound to a model pool,
// "throttled:<pool>" (PoolConfig.ThrottleReason). Such a wait counts toward the
// task's wall clock: the agent ran, its upstream answered.
const WaitThrottled = "throttled"

// CapacityWait says a step cannot get its token capacity now: it waits Wait, without
// holding a worker, for Reason (WaitTokensPerMinute or "pool:<name>"). Nothing was
// taken.
type CapacityWait struct {
	Reason string
	Wait   time.Duration
}

func (e *CapacityWait) Error() string {
	return fmt.Sprintf("waiting %v for %s", e.Wait.Round(time.Millisecond), e.Reason)
}

func str(v any) string { s, _ := v.(string); return s }

// settleScript books the difference between a step's reservation and its actual use,
// into the period the reservation went to: the newest one seen, unless the step's own
// period is newer (and the newest one seen was not set by an anchor change that still
// holds: anchor.go). A counter never goes below zero (a refund of a reservation made
// before the period rolled over). Counters without their "sd" mark are left alone: Redis
// lost them, the step is in the ledger already, and the seed that rebuilds them reads it
// there (a settle must not create counters a seed would then overwrite or add to).
//
// The tokens delta also settles the ai_tokens_per_minute bucket (when the limit is
// on): a refund below the estimate (never past the burst), debt above it. The bucket
// is Redis's alone (no ledger rebuilds it), so it is settled even when the counters
// are unseeded.
//
// KEYS[1] state hash   KEYS[2] steps hash   KEYS[3] ai_tokens_per_minute bucket
// ARGV[1] now ms or ""   ARGV[2] tokens delta   ARGV[3] usd delta   ARGV[4] steps delta
// ARGV[5] period id   ARGV[6] tokens field prefix   ARGV[7] usd field prefix
// ARGV[8] tokens a minute (<= 0: off)   ARGV[9] burst
var settleScript = redisx.NewScript(luaNow + luaTenantTokens + `
local H = KEYS[1]
local tpm, tpm_burst = tonumber(ARGV[8]), tonumber(ARGV[9])
if tpm > 0 and tonumber(ARGV[2]) ~= 0 then
  local tl, trate = tpm_load(3, tpm, tpm_burst)
  tpm_save(3, math.min(tpm_burst, tl - tonumber(ARGV[2])), trate, tpm_burst)
end
local m = redis.call('HMGET', H, 'per', 'sd', 'pe')
if not m[2] then return 0 end -- unseeded: the ledger has the step, the seed will read it
local per, p = m[1], ARGV[5]
local held = m[3] and now < tonumber(m[3]) -- a period set by an anchor change (anchor.go)
if per and (held or (tonumber(p) or 0) < tonumber(per)) then p = per end
local function add(f, d)
  if tonumber(d) ~= 0 and redis.call('HINCRBY', H, f, d) < 0 then redis.call('HSET', H, f, 0) end
end
add(ARGV[6] .. p, ARGV[2])
add(ARGV[7] .. p, ARGV[3])
if tonumber(ARGV[4]) ~= 0 then
  local hour = math.floor(now / 3600000)
  if redis.call('HINCRBY', KEYS[2], hour, ARGV[4]) <= 0 then redis.call('HDEL', KEYS[2], hour) end
end
return 1
`)

// SettleStep books what a step really used against its reservation: positive deltas
// overdraw, negative ones refund. Steps -1 gives back the reserved step. On pipe (a
// redisx.Batch's) it goes in the round trip of the pipe's other calls and its outcome
// is the pipe's; nil sends it alone.
func (q *Quotas) SettleStep(ctx context.Context, pipe redis.Pipeliner, p StepParams) error {
	if pipe != nil {
		_ = q.settle(ctx, pipe, p)
		return nil
	}
	if err := q.settle(ctx, q.rdb, p); err != nil {
		return fmt.Errorf("quotas: settle step: %w", err)
	}
	return nil
}

func (q *Quotas) settle(ctx context.Context, c redis.Scripter, p StepParams) error {
	if p.Tokens == 0 && p.CostMicro == 0 && p.Steps == 0 {
		return nil
	}
	tpm, burst := p.Limits.tokensPerMinute()
	return settleScript.Run(ctx, c,
		[]string{q.keys.AdmissionState(p.TenantID), q.keys.StepsDaily(p.TenantID), q.keys.TenantTokens(p.TenantID)},
		q.nowArg(), p.Tokens, p.CostMicro, p.Steps, p.Period.ID, rkeys.TokensPrefix, rkeys.USDPrefix, tpm, burst).Err()
}

// DropKey deletes the live limit state of a removed (revoked) key: its key bucket and
// its (key, agent) buckets.
func (q *Quotas) DropKey(ctx context.Context, tenantID, kid string) error {
	h := q.keys.AdmissionState(tenantID)
	fields := []string{rkeys.KeyBucketField(kid)}
	iter := q.rdb.HScan(ctx, h, 0, rkeys.KeyAgentFieldsPattern(kid), 100).Iterator()
	for iter.Next(ctx) {
		if f := iter.Val(); strings.HasPrefix(f, rkeys.KeyAgentPrefix) {
			fields = append(fields, f)
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	return q.rdb.HDel(ctx, h, fields...).Err()
}

// touchScript pushes live leases' expiry forward: a running task's (heartbeats), a
// queued task's (the janitor, for tasks that wait longer than a lease lives) or a
// stream's. Members that are not there are not added, and neither set's life is
// shortened (it also holds other leases).
//
// KEYS[1] session leases   KEYS[2] long-running leases   ARGV[1] now ms or ""
// ARGV[2] lease ttl ms   ARGV[3...] members
// Returns the number of leases pushed forward.
var touchScript = redis.NewScript(luaNow + `
local ttl = tonumber(ARGV[2])
local n = 0
for i = 3, #ARGV do
  local a = redis.call('ZADD', KEYS[1], 'XX', 'CH', now + ttl, ARGV[i])
  local b = redis.call('ZADD', KEYS[2], 'XX', 'CH', now + ttl, ARGV[i])
  n = n + a + b
end
if n > 0 then
  for k = 1, 2 do
    local pttl = redis.call('PTTL', KEYS[k])
    if pttl ~= -2 and pttl < ttl then redis.call('PEXPIRE', KEYS[k], ttl) end
  end
end
return n
`)

// TouchLease keeps a running task's leases alive for another lease TTL.
func (q *Quotas) TouchLease(ctx context.Context, tenantID, taskID string) error {
	_, err := q.TouchLeases(ctx, tenantID, []string{taskID})
	return err
}

// TouchLeases keeps the leases of live tasks (queued or running) alive for another
// lease TTL; tasks without a lease are left alone. It returns how many leases it
// pushed forward.
func (q *Quotas) TouchLeases(ctx context.Context, tenantID string, taskIDs []string) (int, error) {
	total := 0
	for ids := range slices.Chunk(taskIDs, touchChunk) { // bounded script calls
		args := make([]any, 0, 2+len(ids))
		args = append(args, q.nowArg(), leaseTTL.Milliseconds())
		for _, id := range ids {
			args = append(args, id)
		}
		n, err := touchScript.Run(ctx, q.rdb, []string{q.keys.Sessions(tenantID), q.keys.LongRunning(tenantID)}, args...).Int()
		if err != nil {
			return total, fmt.Errorf("quotas: touch leases: %w", err)
		}
		total += n
	}
	return total, nil
}

// touchChunk bounds the members of one touch script call.
const touchChunk = 500

// Leases returns a tenant's leases: every session (long-running ones included) and
// the long-running ones.
func (q *Quotas) Leases(ctx context.Context, tenantID string) (sessions, long []string, err error) {
	s, l, err := q.LeaseAges(ctx, tenantID)
	for m := range s {
		sessions = append(sessions, m)
	}
	for m := range l {
		long = append(long, m)
	}
	return sessions, long, err
}

// LeaseMembers lists the sessions (long-running ones included) and the long-running
// leases of a page of tenants, in
// the page's order, in one round trip.
func (q *Quotas) LeaseMembers(ctx context.Context, tenants []string) (sessions, long [][]string, err error) {
	pipe := q.rdb.Pipeline()
	sc := make([]*redis.StringSliceCmd, len(tenants))
	lc := make([]*redis.StringSliceCmd, len(tenants))
	for i, t := range tenants {
		sc[i] = pipe.ZRange(ctx, q.keys.Sessions(t), 0, -1)
		lc[i] = pipe.ZRange(ctx, q.keys.LongRunning(t), 0, -1)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, nil, fmt.Errorf("quotas: leases: %w", err)
	}
	sessions, long = make([][]string, len(tenants)), make([][]string, len(tenants))
	for i := range tenants {
		// a long-running lease is a session too (it is kept in the long-running set only)
		sessions[i], long[i] = append(sc[i].Val(), lc[i].Val()...), lc[i].Val()
	}
	return sessions, long, nil
}

// LeaseAges returns a tenant's leases with the time since each was taken or last
// refreshed, on the clock the leases expire by (Redis TIME, or the test clock).
func (q *Quotas) LeaseAges(ctx context.Context, tenantID string) (sessions, long map[string]time.Duration, err error) {
	pipe := q.rdb.Pipeline()
	a := pipe.ZRangeWithScores(ctx, q.keys.Sessions(tenantID), 0, -1)
	b := pipe.ZRangeWithScores(ctx, q.keys.LongRunning(tenantID), 0, -1)
	var tm *redis.TimeCmd
	if q.nowMs == nil {
		tm = pipe.Time(ctx)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, nil, fmt.Errorf("quotas: leases: %w", err)
	}
	var now int64
	if tm != nil {
		now = tm.Val().UnixMilli()
	} else {
		now = q.nowMs()
	}
	age := func(z redis.Z) time.Duration {
		return time.Duration(now-int64(z.Score)+leaseTTL.Milliseconds()) * time.Millisecond
	}
	sessions, long = make(map[string]time.Duration), make(map[string]time.Duration)
	for _, z := range a.Val() {
		sessions[z.Member.(string)] = age(z)
	}
	for _, z := range b.Val() { // a long-running lease is a session too
		sessions[z.Member.(string)], long[z.Member.(string)] = age(z), age(z)
	}
	return sessions, long, nil
}

// addLeaseScript re-adds a live task's lease, expiring a lease TTL from now on the
// Redis clock, to the long-running set if the task is long-running, else to the
// session set (a lease is in one of them, see admitScript).
//
// KEYS[1] session leases   KEYS[2] long-running leases   ARGV[1] now ms or ""
// ARGV[2] task id   ARGV[3] lease ttl ms   ARGV[4] "1" if long-running
// ARGV[5] lease set keep ms: a set it extends lives as long as admission keeps them
var addLeaseScript = redis.NewScript(luaNow + `
local ttl = tonumber(ARGV[3])
local k = ARGV[4] == '1' and 2 or 1
redis.call('ZADD', KEYS[k], now + ttl, ARGV[2])
if redis.call('PTTL', KEYS[k]) < ttl then redis.call('PEXPIRE', KEYS[k], ARGV[5]) end
return 1
`)

// AddLease re-adds the lease of a live task that Redis lost: it counts as a session,
// and as a long-running one if long.
func (q *Quotas) AddLease(ctx context.Context, tenantID, taskID string, long bool) error {
	err := addLeaseScript.Run(ctx, q.rdb, []string{q.keys.Sessions(tenantID), q.keys.LongRunning(tenantID)},
		q.nowArg(), taskID, leaseTTL.Milliseconds(), boolArg(long), (leaseTTL + leaseSlack).Milliseconds()).Err()
	if err != nil {
		return fmt.Errorf("quotas: add lease: %w", err)
	}
	return nil
}

var hasStructScript = redis.NewScript(`if rawget(_G, 'struct') then return 1 end return 0`)

func (q *Quotas) detectStruct(ctx context.Context) error {
	q.structOnce.Do(func() {
		n, err := hasStructScript.Run(ctx, q.rdb, nil).Int()
		q.structErr, q.textNums = err, err == nil && n == 0
	})
	if q.structErr != nil {
		err := q.structErr
		q.structOnce = sync.Once{} // try again next time
		return fmt.Errorf("quotas: %w", err)
	}
	return nil
}

// encodeNums packs numbers for the admission script: little-endian doubles, or text.
func (q *Quotas) encodeNums(nums []float64) []byte {
	if q.textNums {
		var b []byte
		for i, f := range nums {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendFloat(b, f, 'f', -1, 64) // plain digits: some Lua tonumber lacks exponents
		}
		return b
	}
	packed := make([]byte, 8*len(nums))
	for i, f := range nums {
		binary.LittleEndian.PutUint64(packed[8*i:], math.Float64bits(f))
	}
	return packed
}
