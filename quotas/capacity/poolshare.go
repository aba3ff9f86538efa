package capacity

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/redisx"
)

// PoolWithinShare reports whether a tenant whose step asks a pool for ask tokens is
// within its weighted share of the pool: its pass (its place in the pool's weighted
// order, advanced by what it drew ÷ its weight) is at most that one step ahead of
// the pool's virtual time (the pass of its latest grant). A tenant further ahead has
// drawn more than its weight entitles it to, and its wait is its own draw, not the
// pool's (the plans' pool wait commitment, docs/limits.md). known is false when the
// pool does not know the tenant (it forgot an idle tenant, or lost its state): there
// is then nothing to judge its share by, and within is false too.
func (pl *Pools) PoolWithinShare(ctx context.Context, pool, tenant string, ask int64) (within, known bool, err error) {
	keys := pl.poolKeys(pool)
	pipe := pl.rdb.Pipeline()
	v := pipe.HGet(ctx, keys[0], "v")
	pw := pipe.HMGet(ctx, keys[1], "p:"+tenant, "w:"+tenant)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return false, false, fmt.Errorf("quotas: pool %s share: %w", pool, err)
	}
	vt, _ := strconv.ParseFloat(v.Val(), 64)
	vals := pw.Val()
	str, ok := vals[0].(string)
	if !ok {
		return false, false, nil
	}
	pass, err := strconv.ParseFloat(str, 64)
	if err != nil {
		return false, false, nil
	}
	w := 1.0
	if ws, ok := vals[1].(string); ok {
		if n, err := strconv.ParseFloat(ws, 64); err == nil && n > 0 {
			w = n
		}
	}
	return pass-vt <= float64(max(ask, 0))/w, true, nil
}

// leavePoolScript drops a tenant's place in a pool's line when a task that waited
// for it leaves (cancelled while parked), unless a later ask of the tenant holds the
// place: its place lapses later than the leaving ask's would.
//
// KEYS[1] waiters by pass (zset)   KEYS[2] tenants by the time their place lapses (zset)
// ARGV[1] tenant   ARGV[2] when the leaving ask's place lapses, ms
// Returns 1 when the place was dropped, else 0.
var leavePoolScript = redisx.NewScript(`
local c = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[1]))
if not c or c > tonumber(ARGV[2]) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
`)

// LeavePool drops the tenant's place in pool's line for a parked step that will not
// come back (its task ended while it waited for the pool until due): the tenants
// behind it need not wait for its place to lapse. A place a later ask of the tenant
// holds stays. It reports whether the place was dropped.
func (pl *Pools) LeavePool(ctx context.Context, pool, tenant string, due time.Time) (bool, error) {
	if pool == "" || strings.ContainsAny(pool, "{}") {
		return false, fmt.Errorf("quotas: pool name %q", pool)
	}
	keys := pl.poolKeys(pool)
	n, err := leavePoolScript.Run(ctx, pl.rdb, []string{keys[2], keys[3]}, tenant, due.Add(poolClaimGrace).UnixMilli()).Int()
	if err != nil {
		return false, fmt.Errorf("quotas: leave pool %s: %w", pool, err)
	}
	return n == 1, nil
}
