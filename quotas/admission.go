package quotas

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/rkeys"
)

// Limits are the effective admission limits of one request: the tenant's plan with its
// overrides and the key's own limits applied. Zero disables a limit.
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
}

// burstOr returns the "<name>_burst" value, defaulting to 2× the rate for tenant_rate
// (DESIGN.md section 3) and to the rate itself elsewhere.
func burstOr(m map[string]float64, name string, rate, factor float64) float64 {
	if b, ok := m[name+"_burst"]; ok && b > 0 {
		return b
	}
	return math.Max(1, rate*factor)
}

// LimitsOf turns an effective limit map (Catalogue.Effective) into Limits.
func LimitsOf(m map[string]float64) Limits {
	l := Limits{
		KeyRate:         m[KeyRate],
		TenantRate:      m[TenantRate],
		KeyAgentRate:    m[KeyAgentRate],
		UserHourly:      m[UserTasksHourly],
		Sessions:        int64(m[ConcurrentSessions]),
		LongRunning:     int64(m[LongRunningInflight]),
		Backlog:         int64(m[QueueBacklog]),
		StepsDaily:      int64(m[AgentStepsDaily]),
		TokensMonthly:   int64(m[AITokensMonthly]),
		USDMonthlyMicro: int64(math.Round(m[USDMonthly] * 1e6)),
	}
	l.KeyBurst = burstOr(m, KeyRate, l.KeyRate, 2)
	l.TenantBurst = burstOr(m, TenantRate, l.TenantRate, 2)
	l.KeyAgentBurst = burstOr(m, KeyAgentRate, l.KeyAgentRate, 1)
	l.UserBurst = burstOr(m, UserTasksHourly, l.UserHourly, 1)
	return l
}

// LongRunningThreshold: tasks whose wallclock budget is above it hold a
// long_running_inflight lease.
const LongRunningThreshold = 5 * time.Minute

// MaxUsersPerTenant caps the distinct users tracked in a tenant's user buckets at once;
// users beyond it share one overflow bucket, so rotating user values cannot grow
// state without bound.
const MaxUsersPerTenant = 1000

// leaseTTL bounds a session lease whose task is never released (a crash); the janitor
// releases leases of ended tasks long before.
const leaseTTL = 6 * time.Hour

// Quotas checks and takes limits in Redis.
type Quotas struct {
	rdb   redis.UniversalClient
	keys  rkeys.Keys
	nowMs func() int64 // nil: scripts read Redis TIME
}

// New returns a Quotas on rdb. nowMs, when not nil, replaces Redis TIME (tests).
func New(rdb redis.UniversalClient, keys rkeys.Keys, nowMs func() int64) *Quotas {
	return &Quotas{rdb: rdb, keys: keys, nowMs: nowMs}
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
	Limit      float64 // rate per window, or a count
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

// admitScript checks every admission scope and, only if all pass, takes them all.
//
// KEYS[1] key bucket       KEYS[2] tenant bucket    KEYS[3] key-agent buckets (hash)
// KEYS[4] user buckets     KEYS[5] sessions (zset)  KEYS[6] long-running (zset)
// KEYS[7] tenant queue     KEYS[8] steps per hour   KEYS[9] tokens in period
// KEYS[10] usd in period
// ARGV[1] now ms or ""     ARGV[2] mode: admit | peek | key
// ARGV[3] in scope 1|0     ARGV[4] task id   ARGV[5] agent   ARGV[6] user
// ARGV[7] long-running 1|0 ARGV[8] lease ttl ms
// ARGV[9..16] key rate, key burst, tenant rate, tenant burst, key-agent rate,
//             key-agent burst, user per hour, user burst
// ARGV[17..22] sessions, long-running, backlog, steps daily, tokens, usd micro
// ARGV[23] period end ms   ARGV[24] max users per tenant
// Rates: tokens per second except the user bucket (per hour). 0 disables a scope.
// Returns {status, n, name1, limit1, used1, remaining1, reset_ms1, retry_ms1, violated1, ...}
// with status "ok", "denied" (nothing taken but, as the key bucket comes first, the
// key's token) or "scope" (key token taken, request out of the key's scope).
var admitScript = redis.NewScript(`
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local mode = ARGV[2]
local out = {}
local n = 0
local denied = false
local function add(name, limit, used, remaining, reset, retry, violated)
  n = n + 1
  out[#out+1] = name; out[#out+1] = tostring(limit); out[#out+1] = tostring(used)
  out[#out+1] = remaining; out[#out+1] = math.ceil(reset); out[#out+1] = math.ceil(retry)
  out[#out+1] = violated and 1 or 0
  if violated then denied = true end
end
-- GCRA (as go-redis/redis_rate): tat is the theoretical arrival time in ms.
local function gcra(name, tat, rate, burst, period)
  local T = period / rate
  local tau = T * burst
  local t = tonumber(tat) or now
  if t < now then t = now end
  local used = math.max(0, (t - now) / T)
  if mode == 'peek' then
    add(name, rate, used, math.max(0, math.floor((tau - (t - now)) / T)), t - now, 0, false)
    return nil
  end
  local new = t + T
  local allow_at = new - tau
  if allow_at > now then
    add(name, rate, used, 0, t - now, allow_at - now, true)
    return nil
  end
  add(name, rate, used + 1, math.max(0, math.floor((tau - (new - now)) / T)), new - now, 0, false)
  return new
end
local function px(v) return math.max(1, math.ceil(v - now)) end

-- 1. key bucket: every authenticated request spends it, even when later scopes fail.
local key_rate, key_burst = tonumber(ARGV[9]), tonumber(ARGV[10])
if key_rate > 0 then
  local new = gcra('key_rate', redis.call('GET', KEYS[1]), key_rate, key_burst, 1000)
  if new then redis.call('SET', KEYS[1], new, 'PX', px(new)) end
  if denied then return {'denied', n, unpack(out)} end
end
if mode == 'key' then return {'ok', n, unpack(out)} end
if mode == 'admit' and ARGV[3] ~= '1' then return {'scope', n, unpack(out)} end

-- 2. everything else: check all, then take all or nothing.
local writes = {}
local tr, tb = tonumber(ARGV[11]), tonumber(ARGV[12])
if tr > 0 then
  local new = gcra('tenant_rate', redis.call('GET', KEYS[2]), tr, tb, 1000)
  if new then writes[#writes+1] = {'SET', KEYS[2], new, 'PX', px(new)} end
end
local kar, kab = tonumber(ARGV[13]), tonumber(ARGV[14])
if kar > 0 and ARGV[5] ~= '' then
  local new = gcra('key_agent_rate', redis.call('HGET', KEYS[3], ARGV[5]), kar, kab, 1000)
  if new then
    writes[#writes+1] = {'HSET', KEYS[3], ARGV[5], new}
    writes[#writes+1] = {'PEXPIRE', KEYS[3], px(new)}
  end
end
local ur, ub = tonumber(ARGV[15]), tonumber(ARGV[16])
if ur > 0 then
  local field = ARGV[6]
  if redis.call('HEXISTS', KEYS[4], field) == 0 and redis.call('HLEN', KEYS[4]) >= tonumber(ARGV[24]) then
    if mode == 'admit' then
      -- drop users whose buckets are full again (absent and full are the same)
      local all = redis.call('HGETALL', KEYS[4])
      for i = 1, #all, 2 do
        if tonumber(all[i+1]) <= now then redis.call('HDEL', KEYS[4], all[i]) end
      end
    end
    if redis.call('HLEN', KEYS[4]) >= tonumber(ARGV[24]) then field = '\0overflow' end
  end
  local new = gcra('user_tasks_hourly', redis.call('HGET', KEYS[4], field), ur, ub, 3600000)
  if new then
    writes[#writes+1] = {'HSET', KEYS[4], field, new}
    writes[#writes+1] = {'PEXPIRE', KEYS[4], 3600000 * math.max(1, ub / ur) + 60000}
  end
end
-- count reports a counted limit; take is what an admission adds to it (a lease, a
-- queued task), so remaining is what is left after this request.
local function count(name, limit, used, reset_ms, take)
  if mode ~= 'admit' then take = 0 end
  add(name, limit, used + take, math.max(0, limit - used - take), reset_ms, reset_ms, mode == 'admit' and used >= limit)
end
local sessions = tonumber(ARGV[17])
if sessions > 0 or mode == 'peek' then
  if mode == 'admit' then redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now) end
  count('concurrent_sessions', sessions, redis.call('ZCOUNT', KEYS[5], now, '+inf'), 1000, 1)
end
local long = tonumber(ARGV[18])
if (long > 0 and ARGV[7] == '1') or mode == 'peek' then
  if mode == 'admit' then redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now) end
  count('long_running_inflight', long, redis.call('ZCOUNT', KEYS[6], now, '+inf'), 1000, 1)
end
local backlog = tonumber(ARGV[19])
if backlog > 0 or mode == 'peek' then
  count('queue_backlog', backlog, redis.call('ZCARD', KEYS[7]), 1000, 1)
end
local steps = tonumber(ARGV[20])
if steps > 0 or mode == 'peek' then
  local hour = math.floor(now / 3600000)
  local used, oldest = 0, hour
  local all = redis.call('HGETALL', KEYS[8])
  for i = 1, #all, 2 do
    local h = tonumber(all[i])
    if h and h > hour - 24 then
      used = used + tonumber(all[i+1])
      if h < oldest then oldest = h end
    end
  end
  count('agent_steps_daily', steps, used, (oldest + 24) * 3600000 - now, 0)
end
local period_end = tonumber(ARGV[23])
local tokens = tonumber(ARGV[21])
if tokens > 0 or mode == 'peek' then
  count('ai_tokens_monthly', tokens, tonumber(redis.call('GET', KEYS[9]) or '0'), period_end - now, 0)
end
local usd = tonumber(ARGV[22])
if usd > 0 or mode == 'peek' then
  count('usd_monthly', usd, tonumber(redis.call('GET', KEYS[10]) or '0'), period_end - now, 0)
end
if denied then return {'denied', n, unpack(out)} end
if mode ~= 'admit' then return {'ok', n, unpack(out)} end
for _, w in ipairs(writes) do redis.call(unpack(w)) end
local lease_until = now + tonumber(ARGV[8])
if sessions > 0 then
  redis.call('ZADD', KEYS[5], lease_until, ARGV[4])
  redis.call('PEXPIRE', KEYS[5], tonumber(ARGV[8]))
end
if long > 0 and ARGV[7] == '1' then
  redis.call('ZADD', KEYS[6], lease_until, ARGV[4])
  redis.call('PEXPIRE', KEYS[6], tonumber(ARGV[8]))
end
return {'ok', n, unpack(out)}
`)

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func ftoa(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

func (q *Quotas) admitKeys(p AdmitParams) []string {
	k := q.keys
	return []string{
		k.KeyBucket(p.TenantID, p.Kid), k.TenantBucket(p.TenantID), k.KeyAgentBuckets(p.TenantID, p.Kid),
		k.UserBuckets(p.TenantID), k.Sessions(p.TenantID), k.LongRunning(p.TenantID), k.TenantQueue(p.TenantID),
		k.StepsDaily(p.TenantID), k.TokensPeriod(p.TenantID, p.Period.ID), k.USDPeriod(p.TenantID, p.Period.ID),
	}
}

func boolArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// Admit runs the admission script: in ModeAdmit it checks and takes every scope in one
// atomic call; ModePeek reports without taking; ModeKey spends the key bucket only.
func (q *Quotas) Admit(ctx context.Context, p AdmitParams) (Decision, error) {
	if p.Mode == "" {
		p.Mode = ModeAdmit
	}
	l := p.Limits
	args := []any{
		q.nowArg(), string(p.Mode), boolArg(p.InScope), p.TaskID, p.Agent, p.User, boolArg(p.LongRunning),
		leaseTTL.Milliseconds(),
		ftoa(l.KeyRate), ftoa(l.KeyBurst), ftoa(l.TenantRate), ftoa(l.TenantBurst),
		ftoa(l.KeyAgentRate), ftoa(l.KeyAgentBurst), ftoa(l.UserHourly), ftoa(l.UserBurst),
		l.Sessions, l.LongRunning, l.Backlog, l.StepsDaily, l.TokensMonthly, l.USDMonthlyMicro,
		p.Period.End.UnixMilli(), MaxUsersPerTenant,
	}
	res, err := admitScript.Run(ctx, q.rdb, q.admitKeys(p), args...).Slice()
	if err != nil {
		return Decision{}, fmt.Errorf("quotas: admit: %w", err)
	}
	return parseDecision(res)
}

var windows = map[string]time.Duration{
	KeyRate: time.Second, TenantRate: time.Second, KeyAgentRate: time.Second,
	UserTasksHourly: time.Hour, AgentStepsDaily: 24 * time.Hour,
}

func parseDecision(res []any) (Decision, error) {
	if len(res) < 2 {
		return Decision{}, fmt.Errorf("quotas: short reply %v", res)
	}
	status, _ := res[0].(string)
	n, _ := res[1].(int64)
	if int64(len(res)) != 2+7*n {
		return Decision{}, fmt.Errorf("quotas: reply has %d fields for %d scopes", len(res), n)
	}
	d := Decision{Allowed: status == "ok", OutOfScope: status == "scope"}
	for i := range int(n) {
		f := res[2+7*i : 2+7*i+7]
		s := Scope{Name: str(f[0])}
		s.Limit, _ = strconv.ParseFloat(str(f[1]), 64)
		s.Used, _ = strconv.ParseFloat(str(f[2]), 64)
		s.Remaining, _ = f[3].(int64)
		reset, _ := f[4].(int64)
		retry, _ := f[5].(int64)
		s.Reset = time.Duration(max(reset, 0)) * time.Millisecond
		s.RetryAfter = time.Duration(max(retry, 0)) * time.Millisecond
		s.Violated = f[6] == int64(1)
		s.Window = windows[s.Name]
		d.Scopes = append(d.Scopes, s)
		if s.Violated {
			d.Violated = append(d.Violated, s.Name)
		}
	}
	return d, nil
}

func str(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	}
	return fmt.Sprint(v)
}

// releaseScript removes a task's leases. Returns the number of leases removed.
//
// KEYS[1] sessions   KEYS[2] long-running   ARGV[1] task id
var releaseScript = redis.NewScript(`
return redis.call('ZREM', KEYS[1], ARGV[1]) + redis.call('ZREM', KEYS[2], ARGV[1])
`)

// Release frees a task's session (and long-running) lease. Releasing twice is harmless.
func (q *Quotas) Release(ctx context.Context, tenantID, taskID string) (int, error) {
	n, err := releaseScript.Run(ctx, q.rdb, []string{q.keys.Sessions(tenantID), q.keys.LongRunning(tenantID)}, taskID).Int()
	if err != nil {
		return 0, fmt.Errorf("quotas: release: %w", err)
	}
	return n, nil
}

// recordScript counts one executed step and its usage against the period quotas.
//
// KEYS[1] steps per hour   KEYS[2] tokens in period   KEYS[3] usd in period
// ARGV[1] now ms or ""   ARGV[2] tokens   ARGV[3] usd micro   ARGV[4] period end ms
var recordScript = redis.NewScript(`
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local hour = math.floor(now / 3600000)
redis.call('HINCRBY', KEYS[1], hour, 1)
if redis.call('HLEN', KEYS[1]) > 24 then
  for _, h in ipairs(redis.call('HKEYS', KEYS[1])) do
    if tonumber(h) <= hour - 24 then redis.call('HDEL', KEYS[1], h) end
  end
end
redis.call('PEXPIRE', KEYS[1], 25 * 3600000)
local ttl = math.max(1, tonumber(ARGV[4]) - now) + 86400000
if tonumber(ARGV[2]) ~= 0 then
  redis.call('INCRBY', KEYS[2], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ttl)
end
if tonumber(ARGV[3]) ~= 0 then
  redis.call('INCRBY', KEYS[3], ARGV[3])
  redis.call('PEXPIRE', KEYS[3], ttl)
end
return 1
`)

// RecordStepParams are one executed step's usage.
type RecordStepParams struct {
	TenantID  string
	Tokens    int64
	CostMicro int64
	Period    Period
}

// RecordStep counts a step against agent_steps_daily and its tokens and cost against
// the monthly quotas.
func (q *Quotas) RecordStep(ctx context.Context, p RecordStepParams) error {
	keys := []string{q.keys.StepsDaily(p.TenantID), q.keys.TokensPeriod(p.TenantID, p.Period.ID), q.keys.USDPeriod(p.TenantID, p.Period.ID)}
	if err := recordScript.Run(ctx, q.rdb, keys, q.nowArg(), p.Tokens, p.CostMicro, p.Period.End.UnixMilli()).Err(); err != nil {
		return fmt.Errorf("quotas: record step: %w", err)
	}
	return nil
}

// DropKey deletes the live limit state of a removed (revoked) key.
func (q *Quotas) DropKey(ctx context.Context, tenantID, kid string) error {
	return q.rdb.Del(ctx, q.keys.KeyBucket(tenantID, kid), q.keys.KeyAgentBuckets(tenantID, kid)).Err()
}
