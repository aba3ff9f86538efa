package admission

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/quotas/internal/script"
)

// TaskLeases are the tasks' leases that concurrent_sessions and
// long_running_inflight count: admission takes one (admitScript), a resume takes one
// again (ReAdmit), heartbeats and the janitor keep them alive, a task's end releases
// it. A lease is in one set: a long-running task's in the long-running one, any
// other's in the session one.
type TaskLeases struct{ conn }

// leaseTTL bounds a session lease whose task is never released (a crash before the
// release); admission also drops expired leases when a tenant reaches its limit.
const leaseTTL = 6 * time.Hour

// leaseSlack is how much longer than a lease TTL the lease sets are kept alive, so
// that admissions need to push their expiry forward only once per slack, not each time.
const leaseSlack = time.Hour

// Release frees a task's lease (session or long-running), and its place in the
// admitted-not-yet-queued count. Releasing twice is harmless. Alone (pipe nil) it
// returns the number of leases removed. On pipe (a redisx.Batch's) it goes in the
// round trip of the pipe's other calls and returns 0: its outcome is the pipe's.
func (tl *TaskLeases) Release(ctx context.Context, pipe redis.Pipeliner, tenantID, taskID string) (int, error) {
	if pipe != nil {
		tl.queueRelease(ctx, pipe, tenantID, taskID)
		return 0, nil
	}
	pipe = tl.rdb.TxPipeline()
	a, b := tl.queueRelease(ctx, pipe, tenantID, taskID)
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("quotas: release: %w", err)
	}
	return int(a.Val() + b.Val()), nil
}

// queueRelease queues Release on pipe; the two answers count the session and
// long-running leases it freed.
func (tl *TaskLeases) queueRelease(ctx context.Context, pipe redis.Pipeliner, tenantID, taskID string) (sessions, longRunning *redis.IntCmd) {
	sessions = pipe.ZRem(ctx, tl.keys.Sessions(tenantID), taskID)
	longRunning = pipe.ZRem(ctx, tl.keys.LongRunning(tenantID), taskID)
	pipe.ZRem(ctx, tl.keys.PendingQueue(tenantID), taskID)
	return sessions, longRunning
}

// touchScript pushes live leases' expiry forward: a running task's (heartbeats), a
// queued task's (the janitor, for tasks that wait longer than a lease lives) or a
// stream's. Members that are not there are not added, and neither set's life is
// shortened (it also holds other leases).
//
// KEYS[1] session leases   KEYS[2] long-running leases   ARGV[1] now ms or ""
// ARGV[2] lease ttl ms   ARGV[3...] members
// Returns the number of leases pushed forward.
var touchScript = redis.NewScript(script.Now + `
local ttl = tonumber(ARGV[2])
local n = 0
for i = 3, #ARGV do
  local a = redis.call('ZADD', KEYS[1], 'XX', 'CH', now + ttl, ARGV[i])
  local b = redis.call('ZADD', KEYS[2], 'XX', 'CH', now + ttl, ARGV[i])
  n = n + a + b
end
if n > 0 then
  for k = 1, 2 do
    local pttl = redis.call('PTTL', KEYS[k])
    if pttl ~= -2 and pttl < ttl then redis.call('PEXPIRE', KEYS[k], ttl) end
  end
end
return n
`)

// TouchLease keeps a running task's leases alive for another lease TTL.
func (tl *TaskLeases) TouchLease(ctx context.Context, tenantID, taskID string) error {
	_, err := tl.TouchLeases(ctx, tenantID, []string{taskID})
	return err
}

// TouchLeases keeps the leases of live tasks (queued or running) alive for another
// lease TTL; tasks without a lease are left alone. It returns how many leases it
// pushed forward.
func (tl *TaskLeases) TouchLeases(ctx context.Context, tenantID string, taskIDs []string) (int, error) {
	total := 0
	for ids := range slices.Chunk(taskIDs, touchChunk) { // bounded script calls
		args := make([]any, 0, 2+len(ids))
		args = append(args, tl.nowArg(), leaseTTL.Milliseconds())
		for _, id := range ids {
			args = append(args, id)
		}
		n, err := touchScript.Run(ctx, tl.rdb, []string{tl.keys.Sessions(tenantID), tl.keys.LongRunning(tenantID)}, args...).Int()
		if err != nil {
			return total, fmt.Errorf("quotas: touch leases: %w", err)
		}
		total += n
	}
	return total, nil
}

// touchChunk bounds the members of one touch script call.
const touchChunk = 500

// Leases returns a tenant's leases: every session (long-running ones included) and
// the long-running ones.
func (tl *TaskLeases) Leases(ctx context.Context, tenantID string) (sessions, long []string, err error) {
	s, l, err := tl.LeaseAges(ctx, tenantID)
	for m := range s {
		sessions = append(sessions, m)
	}
	for m := range l {
		long = append(long, m)
	}
	return sessions, long, err
}

// LeaseMembers lists the sessions (long-running ones included) and the long-running
// leases of a page of tenants, in
// the page's order, in one round trip.
func (tl *TaskLeases) LeaseMembers(ctx context.Context, tenants []string) (sessions, long [][]string, err error) {
	pipe := tl.rdb.Pipeline()
	sc := make([]*redis.StringSliceCmd, len(tenants))
	lc := make([]*redis.StringSliceCmd, len(tenants))
	for i, t := range tenants {
		sc[i] = pipe.ZRange(ctx, tl.keys.Sessions(t), 0, -1)
		lc[i] = pipe.ZRange(ctx, tl.keys.LongRunning(t), 0, -1)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, nil, fmt.Errorf("quotas: leases: %w", err)
	}
	sessions, long = make([][]string, len(tenants)), make([][]string, len(tenants))
	for i := range tenants {
		// a long-running lease is a session too (it is kept in the long-running set only)
		sessions[i], long[i] = append(sc[i].Val(), lc[i].Val()...), lc[i].Val()
	}
	return sessions, long, nil
}

// LeaseAges returns a tenant's leases with the time since each was taken or last
// refreshed, on the clock the leases expire by (Redis TIME, or the test clock).
func (tl *TaskLeases) LeaseAges(ctx context.Context, tenantID string) (sessions, long map[string]time.Duration, err error) {
	pipe := tl.rdb.Pipeline()
	a := pipe.ZRangeWithScores(ctx, tl.keys.Sessions(tenantID), 0, -1)
	b := pipe.ZRangeWithScores(ctx, tl.keys.LongRunning(tenantID), 0, -1)
	var tm *redis.TimeCmd
	if !tl.clock.Fake() {
		tm = pipe.Time(ctx)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, nil, fmt.Errorf("quotas: leases: %w", err)
	}
	var now int64
	if tm != nil {
		now = tm.Val().UnixMilli()
	} else {
		now = tl.clock.NowMs()
	}
	age := func(z redis.Z) time.Duration {
		return time.Duration(now-int64(z.Score)+leaseTTL.Milliseconds()) * time.Millisecond
	}
	sessions, long = make(map[string]time.Duration), make(map[string]time.Duration)
	for _, z := range a.Val() {
		sessions[z.Member.(string)] = age(z)
	}
	for _, z := range b.Val() { // a long-running lease is a session too
		sessions[z.Member.(string)], long[z.Member.(string)] = age(z), age(z)
	}
	return sessions, long, nil
}

// addLeaseScript re-adds a live task's lease, expiring a lease TTL from now on the
// Redis clock, to the long-running set if the task is long-running, else to the
// session set (a lease is in one of them, see admitScript).
//
// KEYS[1] session leases   KEYS[2] long-running leases   ARGV[1] now ms or ""
// ARGV[2] task id   ARGV[3] lease ttl ms   ARGV[4] "1" if long-running
// ARGV[5] lease set keep ms: a set it extends lives as long as admission keeps them
var addLeaseScript = redis.NewScript(script.Now + `
local ttl = tonumber(ARGV[3])
local k = ARGV[4] == '1' and 2 or 1
redis.call('ZADD', KEYS[k], now + ttl, ARGV[2])
if redis.call('PTTL', KEYS[k]) < ttl then redis.call('PEXPIRE', KEYS[k], ARGV[5]) end
return 1
`)

// AddLease re-adds the lease of a live task that Redis lost: it counts as a session,
// and as a long-running one if long.
func (tl *TaskLeases) AddLease(ctx context.Context, tenantID, taskID string, long bool) error {
	err := addLeaseScript.Run(ctx, tl.rdb, []string{tl.keys.Sessions(tenantID), tl.keys.LongRunning(tenantID)},
		tl.nowArg(), taskID, leaseTTL.Milliseconds(), script.Bool(long), (leaseTTL + leaseSlack).Milliseconds()).Err()
	if err != nil {
		return fmt.Errorf("quotas: add lease: %w", err)
	}
	return nil
}
