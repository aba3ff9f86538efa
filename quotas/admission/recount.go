package admission

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/internal/script"
)

// The recount: a janitor pass compares each seeded tenant's period counters with the
// ledger and corrects the drift a seed cannot prevent (steps in flight when Redis lost
// its data), and that crashes leave (a worker that died between a step's reservation
// and its settlement). It reads the counters (SnapshotCounters), then the ledger, then
// corrects (CorrectCounters) only if the counters did not move in between.
//
// In-flight reservations: a step reserved and not yet recorded is in the counters and
// not in the ledger. So the counters may legitimately exceed the ledger by what the
// tenant's running tasks hold reserved: one step each and at most what each one's
// last step used (the worker's estimate for the next; usage.Ledger.RecountBasis says
// what a task that has recorded none counts). The recount leaves counters
// within [ledger, ledger + in flight] alone and brings any outside it to the nearer
// bound: down to ledger + in flight (never below what may be reserved, so a running
// step's settlement cannot take the counter under the truth), up to the ledger.

// Recounter reads a page of tenants' period counters and corrects them against the
// ledger (see above).
type Recounter struct{ conn }

// recountScript reads a tenant's period counters and, in "fix" mode, corrects them
// against the ledger. "read" answers {0, fingerprint} ({2} if unseeded). "fix" answers
// {3} if the fingerprint differs from the one read before (the counters moved: a step
// reserved or settled), {2} if unseeded, else {1, steps delta, tokens delta, usd
// delta}. "held" is "fix" without the fingerprint check (Correction.Held): the drift
// is measured on the snapshot's values and what moved since (reservations of tasks
// that started after the ledger's running count was read, settlements) is kept on
// top, so the correction commutes with concurrent steps. The steps are rewritten from
// the ledger's hours (plus what stays reserved, in the current hour); tokens and
// micro-dollars only when Redis's newest period is the ledger's and the snapshot's
// (around a period boundary they are left alone).
//
// KEYS[1] state hash   KEYS[2] steps hash
// ARGV[1] now ms or ""   ARGV[2] "read", "fix" or "held"   ARGV[3] fingerprint of the read
// ARGV[4] period id   ARGV[5] ledger tokens   ARGV[6] ledger usd (micro)
// ARGV[7] in-flight steps   ARGV[8] in-flight tokens   ARGV[9] in-flight usd (micro)
// ARGV[10] tokens field prefix   ARGV[11] usd field prefix
// ARGV[12...] pairs of hour (since the epoch) and ledger steps recorded in it
var recountScript = redis.NewScript(script.Now + `
local H, S = KEYS[1], KEYS[2]
local hour = math.floor(now / 3600000)
local m = redis.call('HMGET', H, 'sd', 'per')
if not m[1] then return {2} end
local per, tp, up = m[2] or '', ARGV[10], ARGV[11]
local c = redis.call('HMGET', H, tp .. per, up .. per)
local steps = 0
local all = redis.call('HGETALL', S)
for i = 1, #all, 2 do
  if tonumber(all[i]) > hour - 24 then steps = steps + tonumber(all[i + 1]) end
end
local fp = steps .. ':' .. per .. ':' .. (c[1] or '') .. ':' .. (c[2] or '')
if ARGV[2] == 'read' then return {0, fp} end
if ARGV[2] == 'fix' and fp ~= ARGV[3] then return {3} end
-- held: the drift is measured on the snapshot (the values the fingerprint holds) and
-- what moved since is kept on top of the correction
local s0, p0, t0, u0 = string.match(ARGV[3], '^(-?%d+):([^:]*):([^:]*):([^:]*)$')
s0 = tonumber(s0) or steps
local function clamp(v, lo, hi)
  if v < lo then return lo end
  if v > hi then return hi end
  return v
end
local function corrected(now, snap, lo, hi)
  local v = clamp(snap, lo, hi) + (now - snap)
  if v < lo then v = lo end
  return v
end
local ls = 0
for i = 12, #ARGV - 1, 2 do
  if tonumber(ARGV[i]) > hour - 24 then ls = ls + tonumber(ARGV[i + 1]) end
end
local ts = corrected(steps, s0, ls, ls + tonumber(ARGV[7]))
if ts ~= steps then
  redis.call('DEL', S)
  for i = 12, #ARGV - 1, 2 do
    local h, n = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
    if h > hour - 24 and n > 0 then
      if h > hour then h = hour end
      redis.call('HINCRBY', S, h, n)
    end
  end
  if ts > ls then redis.call('HINCRBY', S, hour, ts - ls) end
  if ts > 0 then redis.call('PEXPIRE', S, 25 * 3600000) end
end
local dt, du = 0, 0
if per == ARGV[4] and (p0 == nil or p0 == per) then
  local tok, usd = tonumber(c[1]) or 0, tonumber(c[2]) or 0
  local lt, lu = tonumber(ARGV[5]), tonumber(ARGV[6])
  -- a field the snapshot lacked held 0 then; without a snapshot ("fix"), now is it
  local function snap(v, now) if p0 == nil then return now end return tonumber(v) or 0 end
  local tt = corrected(tok, snap(t0, tok), lt, lt + tonumber(ARGV[8]))
  local tu = corrected(usd, snap(u0, usd), lu, lu + tonumber(ARGV[9]))
  if tt ~= tok then redis.call('HSET', H, tp .. per, tt); dt = tt - tok end
  if tu ~= usd then redis.call('HSET', H, up .. per, tu); du = tu - usd end
end
return {1, ts - steps, dt, du}
`)

func (rc *Recounter) recountArgs(mode, print string, l quotas.LedgerCounts) []any {
	args := make([]any, 0, 11+2*len(l.Usage.StepsByHour))
	args = append(args, rc.nowArg(), mode, print, l.Period.ID, l.Usage.Tokens, l.Usage.CostMicro,
		l.InFlight.Steps, l.InFlight.Tokens, l.InFlight.CostMicro, rkeys.TokensPrefix, rkeys.USDPrefix)
	for h, n := range l.Usage.StepsByHour {
		args = append(args, strconv.FormatInt(h, 10), n)
	}
	return args
}

// runRecount runs the recount script once per tenant, pipelined: one round trip for
// a page of tenants, each call on its own tenant's slot.
func (rc *Recounter) runRecount(ctx context.Context, tenants []string, args func(i int) []any) ([][]any, error) {
	if err := recountScript.Load(ctx, rc.rdb).Err(); err != nil {
		return nil, fmt.Errorf("quotas: recount: %w", err)
	}
	pipe := rc.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(tenants))
	for i, t := range tenants {
		cmds[i] = recountScript.EvalSha(ctx, pipe, []string{rc.keys.AdmissionState(t), rc.keys.StepsDaily(t)}, args(i)...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("quotas: recount: %w", err)
	}
	out := make([][]any, len(tenants))
	for i, c := range cmds {
		v, err := c.Slice()
		if err != nil || len(v) == 0 {
			return nil, fmt.Errorf("quotas: recount: reply %v, %w", v, err)
		}
		out[i] = v
	}
	return out, nil
}

// SnapshotCounters reads the period counters of a page of tenants, in one round trip.
func (rc *Recounter) SnapshotCounters(ctx context.Context, tenants []string) ([]quotas.CounterSnapshot, error) {
	res, err := rc.runRecount(ctx, tenants, func(int) []any { return rc.recountArgs("read", "", quotas.LedgerCounts{}) })
	if err != nil {
		return nil, err
	}
	out := make([]quotas.CounterSnapshot, len(tenants))
	for i, t := range tenants {
		out[i] = quotas.CounterSnapshot{TenantID: t}
		if n, _ := res[i][0].(int64); n == 0 && len(res[i]) == 2 {
			out[i].Seeded, out[i].Fingerprint = true, str(res[i][1])
		}
	}
	return out, nil
}

// CorrectCounters brings each tenant's counters within what its ledger allows (see the
// recount above), unless they moved since the snapshot and the correction is not Held:
// one round trip for the page.
func (rc *Recounter) CorrectCounters(ctx context.Context, cs []quotas.Correction) ([]quotas.RecountResult, error) {
	if len(cs) == 0 {
		return nil, nil
	}
	tenants := make([]string, len(cs))
	for i, c := range cs {
		tenants[i] = c.Snapshot.TenantID
	}
	res, err := rc.runRecount(ctx, tenants, func(i int) []any {
		mode := "fix"
		if cs[i].Held {
			mode = "held"
		}
		return rc.recountArgs(mode, cs[i].Snapshot.Fingerprint, cs[i].Ledger)
	})
	if err != nil {
		return nil, err
	}
	out := make([]quotas.RecountResult, len(cs))
	for i, v := range res {
		r := quotas.RecountResult{TenantID: tenants[i]}
		switch n, _ := v[0].(int64); {
		case n == 2:
			r.Outcome = quotas.RecountUnseeded
		case n == 3:
			r.Outcome = quotas.RecountBusy
		case n == 1 && len(v) == 4:
			r.Steps, _ = v[1].(int64)
			r.Tokens, _ = v[2].(int64)
			r.CostMicro, _ = v[3].(int64)
			if r.Steps != 0 || r.Tokens != 0 || r.CostMicro != 0 {
				r.Outcome = quotas.RecountCorrected
			}
		default:
			return nil, fmt.Errorf("quotas: recount: unexpected reply %v", v)
		}
		out[i] = r
	}
	return out, nil
}
