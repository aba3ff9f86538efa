package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
)

// enqueueScript adds a task to its tenant's queue and makes the tenant backlogged
// (luaBacklog).
//
// KEYS[1] tenant queue   KEYS[2] tenant conf   KEYS[3] ready   KEYS[4] capped
// KEYS[5] virtual time   KEYS[6] tenant running set
// KEYS[7] tenant's admitted-not-yet-queued tasks (queue_backlog counts them until here)
// ARGV[1] now ms or ""   ARGV[2] task id   ARGV[3] score   ARGV[4] weight
// ARGV[5] running cap (0 = none)   ARGV[6] ttl seconds   ARGV[7] tenant id
// ARGV[8] the submission's traceparent or "" (kept in the tenant conf, field
// "tp:<task id>", until the task is dispatched or removed)
// Returns 1 if the task was added, 0 if it was already queued.
var enqueueScript = redisx.NewScript(luaNow + luaBacklog + `
local added = redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
redis.call('ZREM', KEYS[7], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('HSET', KEYS[2], 'w', ARGV[4], 'cap', ARGV[5])
if ARGV[8] and ARGV[8] ~= '' then redis.call('HSET', KEYS[2], 'tp:' .. ARGV[2], ARGV[8]) end
redis.call('EXPIRE', KEYS[2], ARGV[6])
backlog(ARGV[7], tonumber(ARGV[5]), 2, 3, 4, 5, 6)
return added
`)

// luaBacklog defines backlog(), which makes a tenant with queued tasks backlogged,
// in its shard's ready set or, at its running cap, its capped set, unless it is in
// either already. A newly backlogged tenant starts at the later of the virtual time
// and the finish pass of its last dispatch (conf field fp): idle time banks no
// credit, and a tenant whose queue emptied at its last dispatch still pays for it.
// Its key arguments are KEYS indexes: the tenant's conf, the shard's ready, capped and
// virtual time, the tenant's running set. enqueueScript and unparkScript share it.
const luaBacklog = `
local function backlog(tenant, cap, kconf, kready, kcapped, kvt, krun)
  local conf, ready, capped, vtkey, run = KEYS[kconf], KEYS[kready], KEYS[kcapped], KEYS[kvt], KEYS[krun]
  if redis.call('ZSCORE', ready, tenant) or redis.call('ZSCORE', capped, tenant) then return end
  local vt = math.max(tonumber(redis.call('GET', vtkey) or '0'), tonumber(redis.call('HGET', conf, 'fp') or '0'))
  if cap > 0 and redis.call('SCARD', run) >= cap then
    redis.call('ZADD', capped, vt, tenant)
  else
    redis.call('ZADD', ready, vt, tenant)
  end
end
`

// EnqueueParams describe a queued task and its tenant's scheduling parameters.
type EnqueueParams struct {
	TenantID   string
	TaskID     uuid.UUID
	Priority   int
	CreatedAt  time.Time
	Weight     int
	RunningCap int // 0 = no cap
	// TraceParent is the W3C traceparent of the submission ("" for none): the
	// dispatch, and through it the worker, continue that trace.
	TraceParent string
}

// Enqueue puts a task on its tenant's queue and wakes the dispatchers. Enqueueing a
// task that is already queued changes nothing. From here on queue_backlog counts the
// task in its queue, no longer as admitted-not-yet-queued. along are calls that ride
// in the push's round trip, on its pipe (the submitting request's slot release); the
// error is the push's, a rider reads its own command's.
func (s *Scheduler) Enqueue(ctx context.Context, p EnqueueParams, along ...func(pipe redis.Pipeliner)) error {
	keys, args := enqueueArgs(s.keys, p, s.nowArg())
	// Concurrent submissions' pushes share a round trip.
	var cmd *redis.Cmd
	err := s.batch.Do(ctx, func(pipe redis.Pipeliner) {
		cmd = enqueueScript.Run(ctx, pipe, keys, args...)
		for _, a := range along {
			a(pipe)
		}
	})
	if cmd != nil && len(along) > 0 {
		err = cmd.Err()
		if errors.Is(err, redis.Nil) {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("scheduler: enqueue: %w", err)
	}
	s.wake(ctx)
	return nil
}

func enqueueArgs(k rkeys.Keys, p EnqueueParams, now string) ([]string, []any) {
	shard := k.Shard(p.TenantID)
	keys := []string{
		k.TenantQueue(p.TenantID), k.TenantConf(p.TenantID), k.Ready(shard),
		k.Capped(shard), k.VirtualTime(shard), k.TenantRunning(p.TenantID), k.PendingQueue(p.TenantID),
	}
	score := strconv.FormatFloat(QueueScore(p.Priority, p.CreatedAt), 'f', -1, 64)
	return keys, []any{now, p.TaskID.String(), score, max(p.Weight, 1), max(p.RunningCap, 0),
		int(queueTTL.Seconds()), p.TenantID, p.TraceParent}
}

// Remove takes a queued task off its tenant's queue, or out of the parked set
// (cancel). It reports whether the task was in either.
func (s *Scheduler) Remove(ctx context.Context, tenantID string, taskID uuid.UUID) (bool, error) {
	id := taskID.String()
	pipe := s.rdb.Pipeline()
	rem := pipe.ZRem(ctx, s.keys.TenantQueue(tenantID), id)
	parked := pipe.ZRem(ctx, s.keys.Parked(s.keys.Shard(tenantID)), rkeys.ParkedMember(tenantID, id))
	pipe.HDel(ctx, s.keys.TenantConf(tenantID), "tp:"+id, "pq:"+id, "g:"+id)
	_, _ = pipe.Exec(ctx)
	n, err := rem.Result()
	if err != nil {
		return false, fmt.Errorf("scheduler: remove: %w", err)
	}
	return n == 1 || parked.Val() == 1, nil
}

// configureScript applies a tenant's new weight and running cap to its backlog.
//
// KEYS[1] tenant conf   KEYS[2] ready   KEYS[3] capped   KEYS[4] tenant running set
// KEYS[5] tenant queue
// ARGV[1] weight   ARGV[2] running cap   ARGV[3] tenant
var configureScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'w', ARGV[1], 'cap', ARGV[2])
local cap, tenant = tonumber(ARGV[2]), ARGV[3]
local pass = redis.call('ZSCORE', KEYS[3], tenant)
if pass and (cap == 0 or redis.call('SCARD', KEYS[4]) < cap) and redis.call('ZCARD', KEYS[5]) > 0 then
  redis.call('ZREM', KEYS[3], tenant)
  redis.call('ZADD', KEYS[2], pass, tenant)
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[1], 'uncap', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
end
return 1
`)

// Configure applies a tenant's new weight and running cap to its queued backlog at
// once: a raised cap frees a capped tenant now; a lowered one binds at its next
// dispatch. A tenant with no scheduler state picks the values up at its next
// submission.
func (s *Scheduler) Configure(ctx context.Context, tenantID string, weight, runningCap int) error {
	shard := s.keys.Shard(tenantID)
	keys := []string{s.keys.TenantConf(tenantID), s.keys.Ready(shard), s.keys.Capped(shard),
		s.keys.TenantRunning(tenantID), s.keys.TenantQueue(tenantID)}
	err := configureScript.Run(ctx, s.rdb, keys, max(weight, 1), max(runningCap, 0), tenantID).Err()
	if err == nil {
		s.wake(ctx)
	}
	return err
}

// EnqueueInPipeline queues the enqueue script of p on pipe without waking the
// dispatchers (bulk loads and benchmarks; call Enqueue for single tasks).
func EnqueueInPipeline(ctx context.Context, pipe redis.Pipeliner, keys rkeys.Keys, p EnqueueParams) {
	ks, args := enqueueArgs(keys, p, "")
	enqueueScript.Run(ctx, pipe, ks, args...)
}
