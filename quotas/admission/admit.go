package admission

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/groupcommit"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/internal/script"
)

// MaxUsersPerTenant caps the distinct users tracked in a tenant's user buckets at once;
// users beyond it share one overflow bucket, so rotating user values cannot grow
// state without bound.
const MaxUsersPerTenant = 1000

// Admitter checks and takes a request's limits: every scope of one admission in one
// atomic script call (admitScript), concurrent admissions of a shard coalesced into
// one call (batcher.go), lost period counters rebuilt first (Seeder).
type Admitter struct {
	conn
	seeder *Seeder

	// textNums: the server's Lua lacks the struct library (an embedded test Redis),
	// so numbers are passed as text. Detected once.
	structOnce sync.Once
	structErr  error
	textNums   bool

	// admits are the shards' group commits of admissions (batcher.go); nil when
	// Options.Coalesce is off.
	admits          []groupcommit.Group[*admitReq]
	coalesceTimeout time.Duration
}

func newAdmitter(c conn, seeder *Seeder, o Options) *Admitter {
	a := &Admitter{conn: c, seeder: seeder, coalesceTimeout: o.CoalesceTimeout}
	if a.coalesceTimeout <= 0 {
		a.coalesceTimeout = defaultCoalesceTimeout
	}
	if o.Coalesce {
		a.admits = a.newAdmitGroups()
	}
	return a
}

// answer is one admission's outcome: its decision, or that the script did not decide
// because the period counters need rebuilding first.
type answer struct {
	d        quotas.Decision
	unseeded bool
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
var admitScript = redis.NewScript(script.Now + `
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

// statusUnseeded is the admission script's answer for counters that lack their mark.
const statusUnseeded = 3

// admitKeysPerCall and admitArgsPerCall are the script's strides; admitGlobalArgs
// its leading ARGV shared by every admission of a call.
const admitKeysPerCall, admitArgsPerCall, admitGlobalArgs = 8, 8, 9

var modeCode = map[quotas.Mode]float64{quotas.ModeAdmit: 0, quotas.ModePeek: 1, quotas.ModeKey: 2}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (a *Admitter) appendAdmit(keys []string, args []any, p quotas.AdmitParams) ([]string, []any) {
	k := a.keys
	keys = append(keys, k.AdmissionState(p.TenantID), k.Sessions(p.TenantID), k.LongRunning(p.TenantID),
		k.TenantQueue(p.TenantID), k.StepsDaily(p.TenantID), k.PendingQueue(p.TenantID),
		k.Rejections(p.TenantID), k.RejectingTenants(k.Shard(p.TenantID)))
	l := p.Limits
	nums := [17]float64{
		modeCode[p.Mode], b2f(p.InScope), b2f(p.LongRunning), l.KeyRate, l.KeyBurst, l.TenantRate, l.TenantBurst,
		l.KeyAgentRate, l.KeyAgentBurst, l.UserHourly, l.UserBurst, float64(l.Sessions), float64(l.LongRunning),
		float64(l.Backlog), float64(l.StepsDaily), float64(l.TokensMonthly), float64(l.USDMonthlyMicro),
	}
	packed := a.encodeNums(nums[:])
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

// Admit runs the admission script: in ModeAdmit it checks and takes every scope in one
// atomic call; ModePeek reports without taking; ModeKey spends the key bucket only.
// With Options.Coalesce, concurrent calls are coalesced into one script call per shard.
// Counters Redis lost are rebuilt from the ledger before anything is decided on them.
func (a *Admitter) Admit(ctx context.Context, p quotas.AdmitParams) (quotas.Decision, error) {
	var ans answer
	err := a.seeder.untilSeeded(ctx, p.TenantID, p.Period, func() (bool, error) {
		var err error
		ans, err = a.admitRaw(ctx, p)
		return ans.unseeded, err
	})
	if err != nil {
		return quotas.Decision{}, err
	}
	return ans.d, nil
}

// admitRaw is one admission call, which may answer unseeded.
func (a *Admitter) admitRaw(ctx context.Context, p quotas.AdmitParams) (answer, error) {
	if a.admits != nil {
		return a.admitCoalesced(ctx, p)
	}
	ds, err := a.admitBatch(ctx, []quotas.AdmitParams{p})
	if err != nil {
		return answer{}, err
	}
	return ds[0], nil
}

// admitBatch runs admissions of one shard in one script call, in order.
func (a *Admitter) admitBatch(ctx context.Context, ps []quotas.AdmitParams) ([]answer, error) {
	if err := a.detectStruct(ctx); err != nil {
		return nil, err
	}
	keys := make([]string, 0, admitKeysPerCall*len(ps))
	args := make([]any, 0, admitGlobalArgs+admitArgsPerCall*len(ps))
	args = append(args, a.nowArg(), leaseTTL.Milliseconds(), MaxUsersPerTenant, stateTTL.Milliseconds(), PendingTTL.Milliseconds(),
		rkeys.UserPrefix, rkeys.UserOverflowField, (leaseTTL + leaseSlack).Milliseconds(), quotas.RejectionsTTL.Milliseconds())
	for i := range ps {
		if ps[i].Mode == "" {
			ps[i].Mode = quotas.ModeAdmit
		}
		keys, args = a.appendAdmit(keys, args, ps[i])
	}
	res, err := admitScript.Run(ctx, a.rdb, keys, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("quotas: admit: %w", err)
	}
	if len(res) != len(ps) {
		return nil, fmt.Errorf("quotas: admit: %d replies for %d admissions", len(res), len(ps))
	}
	ds := make([]answer, len(ps))
	for i, p := range ps {
		st, err := a.parseState(res[i])
		if err != nil {
			return nil, err
		}
		if st.status == statusUnseeded {
			ds[i] = answer{unseeded: true}
			continue
		}
		ds[i] = answer{d: decide(p, st)}
	}
	return ds, nil
}

// DropKey deletes the live limit state of a removed (revoked) key: its key bucket and
// its (key, agent) buckets.
func (a *Admitter) DropKey(ctx context.Context, tenantID, kid string) error {
	h := a.keys.AdmissionState(tenantID)
	fields := []string{rkeys.KeyBucketField(kid)}
	iter := a.rdb.HScan(ctx, h, 0, rkeys.KeyAgentFieldsPattern(kid), 100).Iterator()
	for iter.Next(ctx) {
		if f := iter.Val(); strings.HasPrefix(f, rkeys.KeyAgentPrefix) {
			fields = append(fields, f)
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	return a.rdb.HDel(ctx, h, fields...).Err()
}

// hasStructScript tells whether the server's Lua has the struct library the admission
// script packs its numbers with (an embedded test Redis may lack it).
//
// No KEYS, no ARGV. Returns 1 when it has it, else 0.
var hasStructScript = redis.NewScript(`if rawget(_G, 'struct') then return 1 end return 0`)

// detectStruct asks the server once whether its Lua has the struct library; without
// it the admission script's numbers travel as text (encodeNums, parseState).

func (a *Admitter) detectStruct(ctx context.Context) error {
	a.structOnce.Do(func() {
		n, err := hasStructScript.Run(ctx, a.rdb, nil).Int()
		a.structErr, a.textNums = err, err == nil && n == 0
	})
	if a.structErr != nil {
		err := a.structErr
		a.structOnce = sync.Once{} // try again next time
		return fmt.Errorf("quotas: %w", err)
	}
	return nil
}

// encodeNums packs numbers for the admission script: little-endian doubles, or text.
func (a *Admitter) encodeNums(nums []float64) []byte {
	if a.textNums {
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
