package quotas

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// PoolWithinShare reports whether a tenant whose step asks a pool for ask tokens is
// within its weighted share of the pool: its pass (its place in the pool's weighted
// order, advanced by what it drew ÷ its weight) is at most that one step ahead of
// the pool's virtual time (the pass of its latest grant). A tenant further ahead has
// drawn more than its weight entitles it to, and its wait is its own draw, not the
// pool's (the plans' pool wait commitment, docs/limits.md). known is false when the
// pool does not know the tenant (it forgot an idle tenant, or lost its state): there
// is then nothing to judge its share by, and within is false too.
func (q *Quotas) PoolWithinShare(ctx context.Context, pool, tenant string, ask int64) (within, known bool, err error) {
	keys := q.poolKeys(pool)
	pipe := q.rdb.Pipeline()
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
