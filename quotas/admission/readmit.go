package admission

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/internal/script"
)

// reAdmitScript takes a session lease for a task that is already stored, as
// admission does for a new one, but checks nothing else: a paused task resuming
// counts against its tenant's concurrent_sessions (and long_running_inflight, for a
// long-running task) again, and is refused when they are full.
//
// A task still in its tenant's running set is refused with "handoff": the delivery
// that paused it has not given its slots back yet, and its lease release goes out
// ahead of that (scheduler.Paused), so a lease found now may be about to go. Once the
// task is out of the set, a lease it still holds is the resume's own: one left behind
// by a release that failed, or a retried resume's. Its expiry is pushed a lease TTL
// forward, as a fresh lease's would be.
//
// A spawned task (ARGV[8]) holds no lease of its own, its tree holding its root's:
// past the hand-off check it is granted, and takes nothing.
//
// KEYS[1] session leases   KEYS[2] long-running leases   KEYS[3] tenant running set
// ARGV[1] now ms or ""   ARGV[2] task id   ARGV[3] lease ttl ms   ARGV[4] "1" if long-running
// ARGV[5] concurrent_sessions (< 0: off)   ARGV[6] long_running_inflight (< 0: off)
// ARGV[7] lease set keep ms   ARGV[8] "1" if spawned
// Returns {1 granted or 0, the limit that refused or "handoff" ("" when granted), leases held}.
var reAdmitScript = redis.NewScript(script.Now + `
local SL, LL, task = KEYS[1], KEYS[2], ARGV[2]
local is_long, sessions, long = ARGV[4] == '1', tonumber(ARGV[5]), tonumber(ARGV[6])
if redis.call('SISMEMBER', KEYS[3], task) == 1 then return {0, 'handoff', 0} end
if ARGV[8] == '1' then return {1, '', 0} end
local expiry = now + tonumber(ARGV[3])
if redis.call('ZADD', SL, 'XX', 'CH', expiry, task) + redis.call('ZADD', LL, 'XX', 'CH', expiry, task) > 0 then
  return {1, '', 0}
end
if redis.call('ZSCORE', SL, task) or redis.call('ZSCORE', LL, task) then return {1, '', 0} end
redis.call('ZREMRANGEBYSCORE', SL, '-inf', now)
redis.call('ZREMRANGEBYSCORE', LL, '-inf', now)
local l = redis.call('ZCARD', LL)
local s = redis.call('ZCARD', SL) + l
if sessions >= 0 and s >= sessions then return {0, 'concurrent_sessions', s} end
if is_long and long >= 0 and l >= long then return {0, 'long_running_inflight', l} end
if is_long then
  redis.call('ZADD', LL, expiry, task)
  redis.call('PEXPIRE', LL, ARGV[7])
else
  redis.call('ZADD', SL, expiry, task)
  redis.call('PEXPIRE', SL, ARGV[7])
end
return {1, '', s + 1}
`)

// ReAdmit takes a session lease for a stored task (a paused task resuming), or makes
// the one it holds its own; a spawned task takes none. A full limit is a *ReAdmitRefusal; a task still in its
// running set is ErrHandOff.
func (tl *TaskLeases) ReAdmit(ctx context.Context, p quotas.ReAdmitParams) error {
	res, err := reAdmitScript.Run(ctx, tl.rdb, []string{tl.keys.Sessions(p.TenantID), tl.keys.LongRunning(p.TenantID), tl.keys.TenantRunning(p.TenantID)},
		tl.nowArg(), p.TaskID, leaseTTL.Milliseconds(), script.Bool(p.LongRunning), p.Limits.Sessions, p.Limits.LongRunning,
		(leaseTTL + leaseSlack).Milliseconds(), script.Bool(p.Spawned)).Slice()
	if err != nil {
		return fmt.Errorf("quotas: re-admit: %w", err)
	}
	if ok, _ := res[0].(int64); ok == 1 {
		return nil
	}
	lt, _ := res[1].(string)
	if lt == "handoff" {
		return quotas.ErrHandOff
	}
	held, _ := res[2].(int64)
	limit := p.Limits.Sessions
	if lt == quotas.LongRunningInflight {
		limit = p.Limits.LongRunning
	}
	return &quotas.ReAdmitRefusal{LimitType: lt, Limit: limit, Held: held}
}

// releaseSettledScript releases a task's lease (session or long-running) unless it
// was taken or refreshed less than ARGV[3] ago (its expiry, a lease TTL from then,
// lies past now + ARGV[4] - ARGV[3]). The lease pass frees a paused task's lease so,
// leaving the one a resume took a moment ago, between the pass's read of the task's
// state and this call.
//
// KEYS[1] session leases   KEYS[2] long-running leases
// ARGV[1] now ms or ""   ARGV[2] task id   ARGV[3] fresh ms   ARGV[4] lease ttl ms
// Returns the number of leases released.
var releaseSettledScript = redis.NewScript(script.Now + `
local latest = now + tonumber(ARGV[4]) - tonumber(ARGV[3])
local n = 0
for k = 1, 2 do
  local s = redis.call('ZSCORE', KEYS[k], ARGV[2])
  if s and tonumber(s) <= latest then n = n + redis.call('ZREM', KEYS[k], ARGV[2]) end
end
return n
`)

// ReleaseSettled releases a task's leases unless one was taken or refreshed less
// than fresh ago. It returns the number released.
func (tl *TaskLeases) ReleaseSettled(ctx context.Context, tenantID, taskID string, fresh time.Duration) (int, error) {
	n, err := releaseSettledScript.Run(ctx, tl.rdb, []string{tl.keys.Sessions(tenantID), tl.keys.LongRunning(tenantID)},
		tl.nowArg(), taskID, fresh.Milliseconds(), leaseTTL.Milliseconds()).Int()
	if err != nil {
		return 0, fmt.Errorf("quotas: release settled lease: %w", err)
	}
	return n, nil
}
