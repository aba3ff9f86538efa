package admission

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/internal/script"
)

// Steps reserves a step's period quotas (agent_steps_daily, ai_tokens_monthly,
// usd_monthly) and its tenant's ai_tokens_per_minute before it runs, and settles
// them against what it used after; lost counters are rebuilt first (Seeder).
type Steps struct {
	conn
	seeder *Seeder
	// batch carries step reservations (Options.Batch); nil sends each alone.
	batch *redisx.Batch
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
var reserveStepScript = redisx.NewScript(script.Now + script.TenantTokens + `
local H, S = KEYS[1], KEYS[2]
-- with the counters of the request's period, which is the newest one but at a boundary
local m = redis.call('HMGET', H, 'per', 'sd', 'pe', 'x', ARGV[9] .. ARGV[7], ARGV[10] .. ARGV[7])
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
local v
if per == ARGV[7] then v = {m[5], m[6], m[4]} else v = redis.call('HMGET', H, tf, uf, 'x') end
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

// ReserveStep checks agent_steps_daily, ai_tokens_monthly and usd_monthly before a
// step and reserves one step and the estimated tokens and cost. A refusal is a
// *QuotaExceeded. The admission check reads the same counters; counters Redis lost
// are rebuilt from the ledger first.
//
// The first try goes through Options.Batch, when set, with concurrent reservations;
// along are calls that ride in its round trip, on its pipe (a task's "running"
// message), sent once whatever the reservation's answer. Their outcome is not the
// reservation's. A try after a rebuild goes alone.
func (s *Steps) ReserveStep(ctx context.Context, p quotas.StepParams, along ...func(pipe redis.Pipeliner)) error {
	var refused error
	first := true
	err := s.seeder.untilSeeded(ctx, p.TenantID, p.Period, func() (bool, error) {
		var cmd *redis.Cmd
		queue := func(pipe redis.Pipeliner) {
			cmd = s.reserveStep(ctx, pipe, p)
			for _, a := range along {
				a(pipe)
			}
		}
		switch {
		case first && s.batch != nil:
			_ = s.batch.Do(ctx, queue) // the reservation's error is cmd's
		case first && len(along) > 0:
			pipe := s.rdb.Pipeline()
			queue(pipe)
			_, _ = pipe.Exec(ctx)
			if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
				cmd = s.reserveStep(ctx, s.rdb, p) // a client's Run loads the script
			}
		default:
			cmd = s.reserveStep(ctx, s.rdb, p)
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
			refused = &quotas.QuotaExceeded{LimitType: str(res[1]), Used: float64(used), Limit: float64(limit), Period: p.Period, At: s.now()}
		case n == 3 && len(res) == 2:
			ms, _ := res[1].(int64)
			refused = &quotas.CapacityWait{Reason: agentqtype.WaitTokensPerMinute, Wait: time.Duration(ms) * time.Millisecond}
		}
		return false, nil
	})
	if err != nil {
		return err
	}
	return refused
}

func (s *Steps) reserveStep(ctx context.Context, c redis.Scripter, p quotas.StepParams) *redis.Cmd {
	l := p.Limits
	tpm, burst := l.TokensPerMinuteBucket()
	return reserveStepScript.Run(ctx, c,
		[]string{s.keys.AdmissionState(p.TenantID), s.keys.StepsDaily(p.TenantID), s.keys.TenantTokens(p.TenantID)},
		s.nowArg(), l.StepsDaily, l.TokensMonthly, l.USDMonthlyMicro, p.Tokens, p.CostMicro,
		p.Period.ID, stateTTL.Milliseconds(), rkeys.TokensPrefix, rkeys.USDPrefix, tpm, burst)
}

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
var settleScript = redisx.NewScript(script.Now + script.TenantTokens + `
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
func (s *Steps) SettleStep(ctx context.Context, pipe redis.Pipeliner, p quotas.StepParams) error {
	if pipe != nil {
		_ = s.settle(ctx, pipe, p)
		return nil
	}
	if err := s.settle(ctx, s.rdb, p); err != nil {
		return fmt.Errorf("quotas: settle step: %w", err)
	}
	return nil
}

func (s *Steps) settle(ctx context.Context, c redis.Scripter, p quotas.StepParams) error {
	if p.Tokens == 0 && p.CostMicro == 0 && p.Steps == 0 {
		return nil
	}
	tpm, burst := p.Limits.TokensPerMinuteBucket()
	return settleScript.Run(ctx, c,
		[]string{s.keys.AdmissionState(p.TenantID), s.keys.StepsDaily(p.TenantID), s.keys.TenantTokens(p.TenantID)},
		s.nowArg(), p.Tokens, p.CostMicro, p.Steps, p.Period.ID, rkeys.TokensPrefix, rkeys.USDPrefix, tpm, burst).Err()
}
