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

// A change of a tenant's billing anchor. The monthly counters are held per period id
// ("tok:<id>", "usd:<id>"), and "per" names the newest period seen: a request of a
// newer period starts it, one of an older period books into "per". A new anchor puts
// "now" in another period, whose id may be older than "per" (the billing day moved
// backwards: admission would read a counter nothing writes, steps would keep booking
// into the old period) or newer (moved forwards: the first step would start the new
// period at zero although the ledger holds use in it). So the change re-seeds the
// counters of the new period from the ledger (ReseedAnchor), and marks the period as
// set by hand: field "pe", its end. Until then no request starts another period, and
// every reservation and settlement books into "per", whatever period its caller works
// out (a task that started before the change keeps its tenant, and so its old anchor,
// to its end). The first request at or past "pe" starts the next period as usual and
// drops the mark.
//
// What the re-seed cannot see: a step reserved before it and recorded in the ledger
// after its read. Its reservation went with the old counters; its settlement books only
// the difference. The counters are then short by that step's estimate, which the quota
// recount raises back to the ledger.

// reseedScript replaces a seeded tenant's monthly counters with those of period,
// rebuilt from the ledger, and marks the period as set by an anchor change. Counters
// without their "sd" mark are left alone: the next admission seeds them, for the
// period its caller names (the new anchor's). The steps of the sliding day do not
// depend on the anchor and are kept.
//
// KEYS[1] state hash
// ARGV[1] now ms or ""   ARGV[2] period id   ARGV[3] tokens   ARGV[4] usd (micro)
// ARGV[5] period end ms   ARGV[6] tokens field prefix   ARGV[7] usd field prefix
// Returns 1 when it wrote the counters, 0 when they were unseeded.
var reseedScript = redis.NewScript(script.Now + `
local H = KEYS[1]
if redis.call('HEXISTS', H, 'sd') == 0 then return 0 end
local tp, up = ARGV[6], ARGV[7]
for _, f in ipairs(redis.call('HKEYS', H)) do
  if f:sub(1, #tp) == tp or f:sub(1, #up) == up then redis.call('HDEL', H, f) end
end
local per = ARGV[2]
local w = {'per', per, 'pe', ARGV[5]}
if tonumber(ARGV[3]) ~= 0 then w[#w+1] = tp .. per; w[#w+1] = ARGV[3] end
if tonumber(ARGV[4]) ~= 0 then w[#w+1] = up .. per; w[#w+1] = ARGV[4] end
redis.call('HSET', H, unpack(w))
return 1
`)

// ReseedAnchor rewrites a tenant's monthly counters for the billing period its new
// anchor puts now in, from the UsageSource, after the anchor changed (see above). It
// reports whether it wrote them: not when Redis holds no seeded counters for the
// tenant (the next admission seeds them) or the Seeder has no UsageSource.
func (sd *Seeder) ReseedAnchor(ctx context.Context, tenantID string, anchor quotas.Anchor) (bool, error) {
	if sd.usage == nil {
		return false, nil
	}
	now := sd.now()
	period := anchor.PeriodAt(now)
	u, err := sd.usage.PeriodUsage(ctx, tenantID, period, now)
	if err != nil {
		return false, fmt.Errorf("quotas: reseed counters: %w", err)
	}
	n, err := reseedScript.Run(ctx, sd.rdb, []string{sd.keys.AdmissionState(tenantID)},
		sd.nowArg(), period.ID, u.Tokens, u.CostMicro, strconv.FormatInt(period.End.UnixMilli(), 10),
		rkeys.TokensPrefix, rkeys.USDPrefix).Int()
	if err != nil {
		return false, fmt.Errorf("quotas: reseed counters: %w", err)
	}
	if n == 1 && sd.log != nil {
		sd.log.Info("quota counters re-seeded for a new billing anchor", "tenant_id", tenantID, "period", period.ID,
			"tokens", u.Tokens, "cost_micro_usd", u.CostMicro)
	}
	return n == 1, nil
}
