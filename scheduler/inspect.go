package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Running is the number of the tenant's tasks dispatched and not finished.
func (s *Scheduler) Running(ctx context.Context, tenantID string) (int64, error) {
	return s.rdb.SCard(ctx, s.keys.TenantRunning(tenantID)).Result()
}

// QueueRunning queues Running's read on pipe, for a caller that sends it with other
// reads in one round trip; the function returned gives its answer once pipe was sent.
func (s *Scheduler) QueueRunning(ctx context.Context, pipe redis.Pipeliner, tenantID string) func() (int64, error) {
	cmd := pipe.SCard(ctx, s.keys.TenantRunning(tenantID))
	return cmd.Result
}

// Reasons a queued task waits, shown to the tenant as wait_reason.
const (
	WaitBehindFairShare  = "behind_fair_share"
	WaitTenantRunningCap = "tenant_running_cap"
	WaitNoWorkerCapacity = "no_worker_capacity"
)

// WaitReason says why a tenant's queued tasks wait: the tenant is at its running cap,
// every worker slot is taken, or other tenants are ahead in fair order (or dispatch is
// about to reach it).
func (s *Scheduler) WaitReason(ctx context.Context, tenantID string) (string, error) {
	st, err := s.Standing(ctx, tenantID, nil)
	return st.Reason, err
}

// The start rate a queued task's expected start is estimated from is measured on the
// tenant's dispatches of the last startWindow, at most startsKept of them: enough to
// span a few of a slow tenant's tasks, and a bounded set for a busy one.
const (
	startWindow = 10 * time.Minute
	startsKept  = 1000
)

// Standing is where a tenant's queued tasks stand: why they wait, the place of each
// asked for in the tenant's queue, and the rate the tenant starts tasks at.
type Standing struct {
	Reason string // WaitBehindFairShare, WaitTenantRunningCap or WaitNoWorkerCapacity
	// Positions are the 1-based places of the tasks asked for in the tenant's queue,
	// in the order dispatch hands them out (priority first, then admission); 0 for a
	// task not in it (parked, dispatched, ended).
	Positions []int64
	// StartRate is the tasks per second the tenant was dispatched over its recent
	// starts: the starts after its oldest one in the window, over the time since that
	// one. 0 when it started fewer than two tasks in the window: no rate is measured.
	StartRate float64
	// At is when it was read, by the clock the dispatches were stamped with.
	At time.Time
}

// ExpectedStart is when a task at position is expected to be dispatched at the
// tenant's measured start rate; ok=false without a rate or a position.
func (st Standing) ExpectedStart(position int64) (at time.Time, ok bool) {
	if st.StartRate <= 0 || position <= 0 {
		return time.Time{}, false
	}
	return st.At.Add(time.Duration(float64(position) / st.StartRate * float64(time.Second))), true
}

// startRateScript reads a tenant's recent starts: how many there were in the window,
// and when the oldest of them was.
//
// KEYS[1] tenant starts
// ARGV[1] now ms or ""   ARGV[2] window ms
// Returns {now, count, oldest (now when none)}.
const startRateScript = luaNow + `
local from = now - tonumber(ARGV[2])
local n = redis.call('ZCOUNT', KEYS[1], from, '+inf')
local first = redis.call('ZRANGEBYSCORE', KEYS[1], from, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
return {now, n, tonumber(first[2] or now)}
`

// Standing reads why the tenant's queued tasks wait, the queue positions of taskIDs
// and the tenant's start rate, in one round trip however many tasks are asked for.
func (s *Scheduler) Standing(ctx context.Context, tenantID string, taskIDs []string) (Standing, error) {
	pipe := s.rdb.Pipeline()
	capped := pipe.ZScore(ctx, s.keys.Capped(s.keys.Shard(tenantID)), tenantID)
	inflight := pipe.Get(ctx, s.keys.SlotsInflight())
	slots := pipe.HVals(ctx, s.keys.WorkerSlots())
	ranks := make([]*redis.IntCmd, len(taskIDs))
	for i, id := range taskIDs {
		ranks[i] = pipe.ZRank(ctx, s.keys.TenantQueue(tenantID), id)
	}
	// Sent whole (EVAL, not EVALSHA): a pipeline cannot load a script Redis lost,
	// and this one is a few lines.
	rate := pipe.Eval(ctx, startRateScript, []string{s.keys.TenantStarts(tenantID)}, s.nowArg(), startWindow.Milliseconds())
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return Standing{}, fmt.Errorf("scheduler: standing: %w", err)
	}
	st := Standing{Reason: WaitBehindFairShare, Positions: make([]int64, len(taskIDs)), At: time.Now()}
	total := s.prefetch
	for _, v := range slots.Val() {
		n, _ := strconv.Atoi(v)
		total += n
	}
	switch n, _ := inflight.Int(); {
	case capped.Err() == nil:
		st.Reason = WaitTenantRunningCap
	case n >= total:
		st.Reason = WaitNoWorkerCapacity
	}
	for i, r := range ranks {
		if r.Err() == nil {
			st.Positions[i] = r.Val() + 1
		}
	}
	if v, err := rate.Int64Slice(); err == nil && len(v) == 3 {
		now, n, oldest := v[0], v[1], v[2]
		st.At = time.UnixMilli(now)
		if n >= 2 && now > oldest {
			st.StartRate = float64(n-1) / (float64(now-oldest) / 1000)
		}
	}
	return st, nil
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

// WorkerSlots are the live workers' slots as dispatch sees them.
type WorkerSlots struct {
	Workers  int   // live worker processes
	Capacity int64 // their slots
	// Busy is the slot counter: tasks dispatched (being handed over or in asynq) and
	// not finished. It may exceed Capacity by up to Prefetch.
	Busy     int64
	Prefetch int
}

// SlotUsage reads the live workers' slots (by Redis's clock, as dispatch counts them)
// and the slot counter. It changes nothing: dead workers' entries are left for the
// next dispatch to remove.
func (s *Scheduler) SlotUsage(ctx context.Context) (WorkerSlots, error) {
	now, err := s.clockMs(ctx)
	if err != nil {
		return WorkerSlots{}, err
	}
	pipe := s.rdb.Pipeline()
	live := pipe.ZRangeByScore(ctx, s.keys.Workers(), &redis.ZRangeBy{Min: "(" + strconv.FormatInt(now, 10), Max: "+inf"})
	slots := pipe.HGetAll(ctx, s.keys.WorkerSlots())
	busy := pipe.Get(ctx, s.keys.SlotsInflight())
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return WorkerSlots{}, fmt.Errorf("scheduler: slot usage: %w", err)
	}
	p := WorkerSlots{Workers: len(live.Val()), Prefetch: s.prefetch}
	for _, w := range live.Val() {
		n, _ := strconv.ParseInt(slots.Val()[w], 10, 64)
		p.Capacity += n
	}
	p.Busy, _ = busy.Int64()
	return p, nil
}
