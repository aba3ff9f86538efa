package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// HeldBack reports whether a tenant's own limits or its own demand, rather than the
// worker slots, may have held back a task of it created at since that starts now
// (the plans' start commitment, docs/limits.md). It is asked only about a start that
// came later than the commitment, so its reads cost nothing on the common path.
//
//   - Its own running cap: a tenant leaves its shard's capped set only when a slot of
//     its own frees (or its cap is raised), and that exit stamps its conf ("uncap").
//     A capped tenant is never dispatched, so a stamp at or after since means the cap
//     held it at some moment of the wait.
//   - Its share: its demand now, the tasks it has started (started, as Postgres
//     counts them, the one starting included: its running set also holds tasks
//     handed to the workers ahead of time) and queued, is above its weighted share of the live worker slots
//     among the tenants waiting for one (its shard sets' ready and capped, it
//     included; read at most once a second), at least one slot. A tenant asking for
//     more than its share waits behind its own tasks: that flood is its own.
func (s *Scheduler) HeldBack(ctx context.Context, tenantID string, since time.Time, started int64) (bool, error) {
	pipe := s.rdb.Pipeline()
	conf := pipe.HMGet(ctx, s.keys.TenantConf(tenantID), "uncap", "w")
	queued := pipe.ZCard(ctx, s.keys.TenantQueue(tenantID))
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return false, fmt.Errorf("scheduler: held back: %w", err)
	}
	vals := conf.Val()
	if uncap, ok := num(vals[0]); ok && uncap >= since.UnixMilli() {
		return true, nil
	}
	own := max(1, int64(num1(vals[1])))
	total, of, err := s.backloggedWeights(ctx)
	if err != nil {
		return false, err
	}
	others := total - of[tenantID]
	pool, err := s.SlotUsage(ctx)
	if err != nil {
		return false, err
	}
	share := max(1, float64(pool.Capacity)*float64(own)/float64(others+own))
	return float64(started+queued.Val()) > share, nil
}

// backlogWeightsTTL is how long HeldBack reuses the backlogged tenants' weights: it
// runs inside a start's transaction, and under load many late starts come at once,
// each of which would otherwise read every backlogged tenant.
const backlogWeightsTTL = time.Second

// backlogWeights are the weights of the tenants in the shards' ready and capped sets.
type backlogWeights struct {
	mu    sync.Mutex
	at    time.Time
	total int64
	of    map[string]int64
}

// backloggedWeights returns the backlogged tenants' total weight and each one's,
// read at most once per backlogWeightsTTL. The map is never written once returned.
func (s *Scheduler) backloggedWeights(ctx context.Context) (total int64, of map[string]int64, err error) {
	b := &s.backlog
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.of != nil && time.Since(b.at) < backlogWeightsTTL {
		return b.total, b.of, nil
	}
	pipe := s.rdb.Pipeline()
	sets := make([]*redis.StringSliceCmd, 0, 2*s.keys.Shards())
	for shard := range s.keys.Shards() {
		sets = append(sets, pipe.ZRange(ctx, s.keys.Ready(shard), 0, -1), pipe.ZRange(ctx, s.keys.Capped(shard), 0, -1))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, nil, fmt.Errorf("scheduler: backlogged tenants: %w", err)
	}
	var tenants []string
	pipe = s.rdb.Pipeline()
	var ws []*redis.Cmd
	for _, set := range sets {
		for _, t := range set.Val() {
			tenants = append(tenants, t)
			ws = append(ws, pipe.Do(ctx, "HGET", s.keys.TenantConf(t), "w"))
		}
	}
	if len(ws) > 0 {
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return 0, nil, fmt.Errorf("scheduler: weights: %w", err)
		}
	}
	of = make(map[string]int64, len(tenants))
	for i, w := range ws {
		v, _ := w.Text()
		n := max(1, int64(num1(v)))
		of[tenants[i]] = n
		total += n
	}
	b.at, b.total, b.of = time.Now(), total, of
	return total, of, nil
}

// num reads a conf field.
func num(v any) (int64, bool) {
	str, ok := v.(string)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseFloat(str, 64)
	return int64(n), err == nil
}

// num1 reads a weight: 1 when absent.
func num1(v any) float64 {
	if n, ok := num(v); ok && n > 0 {
		return float64(n)
	}
	return 1
}
