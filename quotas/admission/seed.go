package admission

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"
	"golang.org/x/sync/singleflight"

	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/internal/script"
)

// Seeding: the period counters (the steps of the sliding day, the period's tokens and
// micro-dollars) live in Redis, and Redis can lose them (FLUSHDB, a restart without
// persistence, an expired or evicted key). The usage ledger in Postgres holds the
// truth. A tenant's admission state carries a mark, field "sd", set only by the seed
// script below, which writes the counters rebuilt from the ledger and the mark in one
// step; every script that reads or writes the counters checks the mark first:
//
//   - admission (admit with a period quota on, and peek) answers "unseeded" without
//     deciding or taking anything;
//   - the worker's step reservation answers "unseeded" without reserving;
//   - a settlement leaves unmarked counters alone (its step is in the ledger, which
//     the seed reads), so no partial counter exists for a seed to overwrite or add to.
//
// On "unseeded" the caller reads the tenant's use from its UsageSource (one query),
// runs the seed script, which writes only if the mark is still missing (two replicas
// seeding at once write once), and asks again. A marked tenant pays nothing for this
// but one more field in a read the script makes anyway. The mark lives and dies with
// the hash that holds the counters, so a restart with Redis intact rebuilds nothing.
// Limits of the scheme, and the recount that corrects what it misses: billing/usage/doc.go.

// Seeder rebuilds a tenant's period counters from its UsageSource when Redis lost
// them (see above), and re-seeds them when its billing anchor changes (anchor.go).
type Seeder struct {
	conn
	usage   quotas.UsageSource // what lost counters are rebuilt from; nil: zero
	log     *slog.Logger
	rebuilt metric.Int64Counter // rebuilds (agentq.quotas.counters_rebuilt); nil: not counted
	seeds   singleflight.Group  // rebuilds in progress, by tenant
	seedMu  sync.Mutex
	seeded  map[string]uint64 // rebuilds finished, by tenant
}

// SetUsageSource makes the period counters rebuild from src when Redis lost them.
// Without one (tests, a Store without a ledger) missing counters start at zero. Call
// it before the Store is used.
// Each rebuild is logged to arch's logger and counted on its meter provider's
// agentq.quotas.counters_rebuilt (nil: the defaults).
func (sd *Seeder) SetUsageSource(src quotas.UsageSource, arch *baseservice.Archetype) {
	arch = arch.Defaults()
	sd.usage, sd.log = src, arch.Logger
	sd.rebuilt = newRebuiltCounter(arch.MeterProvider)
}

// newRebuiltCounter makes agentq.quotas.counters_rebuilt on mp, exported at 0 from
// the start.
func newRebuiltCounter(mp metric.MeterProvider) metric.Int64Counter {
	c, _ := mp.Meter("github.com/agentq/agentq/quotas").Int64Counter("agentq.quotas.counters_rebuilt",
		metric.WithUnit("{tenant}"),
		metric.WithDescription("Tenants whose period quota counters were rebuilt from the usage ledger"))
	c.Add(context.Background(), 0)
	return c
}

// seedTimeout bounds one rebuild: a ledger query and a script call. It is not the
// admission's Redis timeout: a rebuild reads Postgres, and giving up on it refuses
// the tenant's work (quotas fail closed).
const seedTimeout = 5 * time.Second

// seedTries bounds how often an admission or a reservation seeds and asks again: more
// than once only if Redis loses the counters again meanwhile.
const seedTries = 3

// seedScript writes a tenant's period counters rebuilt from the ledger, and the "sd"
// mark, unless the mark is there already: then another caller seeded first (or the
// counters were never lost) and nothing is written. It replaces whatever unmarked
// counters the hash and the steps hash hold (left by an earlier version, or by a
// partial loss).
//
// KEYS[1] state hash   KEYS[2] steps hash
// ARGV[1] now ms or ""   ARGV[2] period id   ARGV[3] tokens   ARGV[4] usd (micro)
// ARGV[5] state ttl ms   ARGV[6] tokens field prefix   ARGV[7] usd field prefix
// ARGV[8...] pairs of hour (since the epoch) and steps recorded in it
// Returns 1 when it wrote the counters, 0 when they were marked already.
var seedScript = redis.NewScript(script.Now + `
local H, S = KEYS[1], KEYS[2]
if redis.call('HEXISTS', H, 'sd') == 1 then return 0 end
local hour = math.floor(now / 3600000)
local ttl = tonumber(ARGV[5])
redis.call('DEL', S)
local any = false
for i = 8, #ARGV - 1, 2 do
  local h, n = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  if h > hour - 24 and n > 0 then
    if h > hour then h = hour end -- the ledger's clock a little ahead of Redis's
    redis.call('HINCRBY', S, h, n)
    any = true
  end
end
if any then redis.call('PEXPIRE', S, 25 * 3600000) end
local tp, up = ARGV[6], ARGV[7]
for _, f in ipairs(redis.call('HKEYS', H)) do
  if f:sub(1, #tp) == tp or f:sub(1, #up) == up then redis.call('HDEL', H, f) end
end
redis.call('HDEL', H, 'pe') -- a period set by an anchor change, left by a partial loss
local per = ARGV[2]
local w = {'sd', now, 'per', per, 'x', now + ttl}
if tonumber(ARGV[3]) ~= 0 then w[#w+1] = tp .. per; w[#w+1] = ARGV[3] end
if tonumber(ARGV[4]) ~= 0 then w[#w+1] = up .. per; w[#w+1] = ARGV[4] end
redis.call('HSET', H, unpack(w))
redis.call('PEXPIRE', H, ttl)
return 1
`)

// untilSeeded runs attempt, which answers whether the script found the tenant's
// counters unseeded; if it did, it rebuilds them and runs attempt again.
func (sd *Seeder) untilSeeded(ctx context.Context, tenantID string, period quotas.Period, attempt func() (unseeded bool, err error)) error {
	for try := 1; ; try++ {
		before := sd.seededCount(tenantID)
		unseeded, err := attempt()
		if err != nil || !unseeded {
			return err
		}
		if try == seedTries {
			return fmt.Errorf("%w: the quota counters of tenant %s were lost again while being rebuilt", quotas.ErrUnavailable, tenantID)
		}
		// A rebuild that finished since the attempt began is the one this attempt
		// needed: it answered unseeded while that rebuild was writing. Ask again rather
		// than read the ledger once more.
		if sd.seededCount(tenantID) != before {
			continue
		}
		if err := sd.seed(ctx, tenantID, period); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w: rebuilding the quota counters of tenant %s from the ledger: %v", quotas.ErrUnavailable, tenantID, err)
		}
	}
}

// seed rebuilds a tenant's counters. Concurrent callers in this process for one tenant
// share one rebuild, which runs to its own timeout even if the caller that started it
// leaves; across processes the script's mark check makes the first write the only one.
func (sd *Seeder) seed(ctx context.Context, tenantID string, period quotas.Period) error {
	c := sd.seeds.DoChan(tenantID, func() (any, error) {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), seedTimeout)
		defer cancel()
		if _, err := sd.Seed(sctx, tenantID, period); err != nil {
			return nil, err
		}
		// Counted before the call is forgotten, so that an attempt which began before
		// it sees the count moved (untilSeeded).
		sd.seedMu.Lock()
		if sd.seeded == nil {
			sd.seeded = map[string]uint64{}
		}
		sd.seeded[tenantID]++
		sd.seedMu.Unlock()
		return nil, nil
	})
	select {
	case r := <-c:
		return r.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// seededCount is how many rebuilds of the tenant's counters this process finished.
func (sd *Seeder) seededCount(tenantID string) uint64 {
	sd.seedMu.Lock()
	defer sd.seedMu.Unlock()
	return sd.seeded[tenantID]
}

// Seed rebuilds a tenant's period counters from its UsageSource (zero without one)
// unless they carry their mark already. It reports whether it wrote them. Admission
// and step reservations call it when they find the counters unseeded.
func (sd *Seeder) Seed(ctx context.Context, tenantID string, period quotas.Period) (bool, error) {
	var u quotas.Usage
	if sd.usage != nil {
		var err error
		if u, err = sd.usage.PeriodUsage(ctx, tenantID, period, sd.now()); err != nil {
			return false, err
		}
	}
	args := make([]any, 0, 7+2*len(u.StepsByHour))
	args = append(args, sd.nowArg(), period.ID, u.Tokens, u.CostMicro, stateTTL.Milliseconds(), rkeys.TokensPrefix, rkeys.USDPrefix)
	for h, n := range u.StepsByHour {
		args = append(args, strconv.FormatInt(h, 10), n)
	}
	n, err := seedScript.Run(ctx, sd.rdb, []string{sd.keys.AdmissionState(tenantID), sd.keys.StepsDaily(tenantID)}, args...).Int()
	if err != nil {
		return false, fmt.Errorf("quotas: seed counters: %w", err)
	}
	if n == 1 {
		if sd.rebuilt != nil {
			sd.rebuilt.Add(context.WithoutCancel(ctx), 1)
		}
		if sd.log != nil {
			var steps int64
			for _, s := range u.StepsByHour {
				steps += s
			}
			sd.log.Info("quota counters rebuilt from the usage ledger", "tenant_id", tenantID, "period", period.ID,
				"steps_24h", steps, "tokens", u.Tokens, "cost_micro_usd", u.CostMicro)
		}
	}
	return n == 1, nil
}
