package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Running is the number of the tenant's tasks dispatched and not finished.
func (s *Scheduler) Running(ctx context.Context, tenantID string) (int64, error) {
	return s.rdb.SCard(ctx, s.keys.TenantRunning(tenantID)).Result()
}

// Reasons a queued task waits, shown to the tenant as wait_reason.
const (
	WaitBehindFairShare  = "behind_fair_share"
	WaitTenantRunningCap = "tenant_running_cap"
	WaitNoWorkerCapacity = "no_worker_capacity"
)

// WaitReason says why a tenant's queued tasks wait: the tenant is at its running cap,
// the worker pool is full, or other tenants are ahead in fair order (or dispatch is
// about to reach it).
func (s *Scheduler) WaitReason(ctx context.Context, tenantID string) (string, error) {
	pipe := s.rdb.Pipeline()
	capped := pipe.ZScore(ctx, s.keys.Capped(s.keys.Shard(tenantID)), tenantID)
	inflight := pipe.Get(ctx, s.keys.PoolInflight())
	slots := pipe.HVals(ctx, s.keys.WorkerSlots())
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return "", fmt.Errorf("scheduler: wait reason: %w", err)
	}
	if capped.Err() == nil {
		return WaitTenantRunningCap, nil
	}
	total := s.prefetch
	for _, v := range slots.Val() {
		n, _ := strconv.Atoi(v)
		total += n
	}
	if n, _ := inflight.Int(); n >= total {
		return WaitNoWorkerCapacity, nil
	}
	return WaitBehindFairShare, nil
}

// RunningMembers lists the tenant's dispatched, unfinished task ids as Redis has them.
func (s *Scheduler) RunningMembers(ctx context.Context, tenantID string) ([]string, error) {
	return s.rdb.SMembers(ctx, s.keys.TenantRunning(tenantID)).Result()
}

// RunningSets lists the running sets of a page of tenants, in the page's order, in one
// round trip.
func (s *Scheduler) RunningSets(ctx context.Context, tenants []string) ([][]string, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StringSliceCmd, len(tenants))
	for i, t := range tenants {
		cmds[i] = pipe.SMembers(ctx, s.keys.TenantRunning(t))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("scheduler: running sets: %w", err)
	}
	out := make([][]string, len(tenants))
	for i, c := range cmds {
		out[i] = c.Val()
	}
	return out, nil
}

// QueueLen is the number of the tenant's queued tasks.
func (s *Scheduler) QueueLen(ctx context.Context, tenantID string) (int64, error) {
	return s.rdb.ZCard(ctx, s.keys.TenantQueue(tenantID)).Result()
}

// Depth is a tenant's queued and dispatched-not-finished task counts.
type Depth struct {
	Queued  int64
	Running int64
}

// Depths reads the queue depth and running count of each tenant, in the order given,
// in one round trip (the operator view).
func (s *Scheduler) Depths(ctx context.Context, tenants []string) ([]Depth, error) {
	if len(tenants) == 0 {
		return nil, nil
	}
	pipe := s.rdb.Pipeline()
	q := make([]*redis.IntCmd, len(tenants))
	r := make([]*redis.IntCmd, len(tenants))
	for i, t := range tenants {
		q[i] = pipe.ZCard(ctx, s.keys.TenantQueue(t))
		r[i] = pipe.SCard(ctx, s.keys.TenantRunning(t))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("scheduler: depths: %w", err)
	}
	out := make([]Depth, len(tenants))
	for i := range tenants {
		out[i] = Depth{Queued: q[i].Val(), Running: r[i].Val()}
	}
	return out, nil
}

// Pool is the worker pool as dispatch sees it.
type Pool struct {
	Workers  int   // live worker processes
	Capacity int64 // their slots
	// Busy is the pool counter: tasks dispatched (being handed over or in asynq) and
	// not finished. It may exceed Capacity by up to Prefetch.
	Busy     int64
	Prefetch int
}

// PoolUsage reads the live workers' slots (by Redis's clock, as dispatch counts them)
// and the pool counter. It changes nothing: dead workers' entries are left for the
// next dispatch to remove.
func (s *Scheduler) PoolUsage(ctx context.Context) (Pool, error) {
	now, err := s.clockMs(ctx)
	if err != nil {
		return Pool{}, err
	}
	pipe := s.rdb.Pipeline()
	live := pipe.ZRangeByScore(ctx, s.keys.Workers(), &redis.ZRangeBy{Min: "(" + strconv.FormatInt(now, 10), Max: "+inf"})
	slots := pipe.HGetAll(ctx, s.keys.WorkerSlots())
	busy := pipe.Get(ctx, s.keys.PoolInflight())
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return Pool{}, fmt.Errorf("scheduler: pool usage: %w", err)
	}
	p := Pool{Workers: len(live.Val()), Prefetch: s.prefetch}
	for _, w := range live.Val() {
		n, _ := strconv.ParseInt(slots.Val()[w], 10, 64)
		p.Capacity += n
	}
	p.Busy, _ = busy.Int64()
	return p, nil
}
