package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/wire"
)

// Parking: a task whose next step cannot get token capacity gives its worker and its
// running slot back and waits in its shard's parked set until the capacity is
// expected; the dispatcher then puts it back on its tenant's queue with the score it
// had (its place: priority, then admission time), and dispatches it like any other.
// Its tenant is charged the worker time the delivery took, as at a completion.

// parkScript frees a dispatched task's slots as doneScript does (luaRelease), then
// parks it: it enters the shard's parked set, due when its capacity is expected; its
// queue score is kept in its tenant's conf (field "pq:<task>") for its return, and its
// park count (field "g:<task>") names its next dispatch's asynq message.
//
// KEYS[1..7] doneScript's   KEYS[8] parked
// ARGV[1..7] doneScript's   ARGV[8] wait ms from now   ARGV[9] queue score
// ARGV[10] parked member
// Returns 1 if the task held a worker slot (the caller releases it), else 0.
var parkScript = redisx.NewScript(luaNow + luaClockOfNow + luaRelease + `
local held = release(false)
redis.call('ZADD', KEYS[8], now + math.max(0, tonumber(ARGV[8])), ARGV[10])
redis.call('HSET', KEYS[7], 'pq:' .. ARGV[2], ARGV[9])
redis.call('HINCRBY', KEYS[7], 'g:' .. ARGV[2], 1)
redis.call('EXPIRE', KEYS[7], ARGV[7])
return held
`)

// ParkParams park a dispatched task.
type ParkParams struct {
	Payload wire.Payload  // its dispatch
	Took    time.Duration // the worker time the delivery took (its tenant is charged it)
	Wait    time.Duration // until the capacity is expected
	// Priority and CreatedAt give the task its place back on its queue.
	Priority  int
	CreatedAt time.Time
}

// Park frees a dispatched task's running and worker slots and keeps it out of its
// tenant's queue until p.Wait has passed; the dispatchers then queue it again where it
// was. Its session lease is left alone: the task is still live.
func (s *Scheduler) Park(ctx context.Context, p ParkParams) error {
	keys, args := s.releaseArgs(p.Payload, p.Took)
	keys = append(keys, s.keys.Parked(s.keys.Shard(p.Payload.TenantID)))
	score := strconv.FormatFloat(QueueScore(p.Priority, p.CreatedAt), 'f', -1, 64)
	args = append(args, p.Wait.Milliseconds(), score, rkeys.ParkedMember(p.Payload.TenantID, p.Payload.TaskID))
	if err := s.freeSlots(ctx, "park", func(pipe redis.Pipeliner) *redis.Cmd { return parkScript.Run(ctx, pipe, keys, args...) }, nil); err != nil {
		return err
	}
	due := time.Now().Add(p.Wait)
	if !s.parkedHere(due) {
		// No dispatcher runs here: tell the others when to look, or they would find
		// the task only at their next poll of the parked sets.
		_ = s.rdb.Publish(ctx, s.keys.WakeChannel(), parkedMessage(due)).Err()
	}
	s.wake(ctx)
	return nil
}

// parkedMessage is the wake-up message of a park: "p" and the due time (unix ms).
func parkedMessage(due time.Time) string { return "p" + strconv.FormatInt(due.UnixMilli(), 10) }

// parkedDueOf reads a parkedMessage; ok is false for any other wake-up.
func parkedDueOf(msg string) (time.Time, bool) {
	ms, found := strings.CutPrefix(msg, "p")
	if !found {
		return time.Time{}, false
	}
	v, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(v), true
}

// dueParkedScript lists a shard's parked tasks whose capacity is due, and says when
// the next one is due.
//
// KEYS[1] parked   ARGV[1] now ms or ""   ARGV[2] most to list
// Returns {ms until the first not listed is due, or -1 when none, members...}.
var dueParkedScript = redisx.NewScript(luaNow + `
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local next = redis.call('ZRANGE', KEYS[1], #due, #due, 'WITHSCORES')
local out = {-1}
if #next > 0 then out[1] = math.max(0, math.ceil(tonumber(next[2]) - now)) end
for _, m in ipairs(due) do out[#out+1] = m end
return out
`)

// unparkScript puts a parked task back on its tenant's queue with the score it had,
// and makes the tenant backlogged (luaBacklog), as enqueueScript does. A task no longer parked (a
// cancel took it, or another dispatcher was first) is left alone.
//
// KEYS[1] parked   KEYS[2] tenant queue   KEYS[3] tenant conf   KEYS[4] ready
// KEYS[5] capped   KEYS[6] virtual time   KEYS[7] tenant running set
// ARGV[1] parked member   ARGV[2] task id   ARGV[3] tenant   ARGV[4] ttl s
// Returns 1 if the task went back to its queue, else 0.
var unparkScript = redisx.NewScript(luaBacklog + `
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
local task = ARGV[2]
local score = redis.call('HGET', KEYS[3], 'pq:' .. task) or '0'
redis.call('HDEL', KEYS[3], 'pq:' .. task)
redis.call('ZADD', KEYS[2], score, task)
redis.call('EXPIRE', KEYS[2], ARGV[4])
backlog(ARGV[3], tonumber(redis.call('HGET', KEYS[3], 'cap') or '0'), 3, 4, 5, 6, 7)
return 1
`)

// unparkBatch bounds the parked tasks one call lists.
const unparkBatch = 256

// Unpark queues again every parked task whose capacity is due, on every shard. It
// returns how many went back and how long until the next parked task is due (-1:
// none is parked). The shards' parked sets are read in one round trip (a cluster's
// 64 to 1,024 shards included); only shards with due tasks cost more.
func (s *Scheduler) Unpark(ctx context.Context) (n int, next time.Duration, err error) {
	next = -1
	cmds := make([]*redis.Cmd, s.keys.Shards())
	err = s.batch.Do(ctx, func(pipe redis.Pipeliner) {
		for shard := range cmds {
			cmds[shard] = s.dueParked(ctx, pipe, shard)
		}
	})
	if err != nil {
		return 0, -1, fmt.Errorf("scheduler: due parked tasks: %w", err)
	}
	for shard, cmd := range cmds {
		moved, after, err := s.unparkShard(ctx, shard, cmd)
		n += moved
		if err != nil {
			return n, next, err
		}
		if after >= 0 && (next < 0 || after < next) {
			next = after
		}
	}
	return n, next, nil
}

func (s *Scheduler) dueParked(ctx context.Context, c redis.Scripter, shard int) *redis.Cmd {
	return dueParkedScript.Run(ctx, c, []string{s.keys.Parked(shard)}, s.nowArg(), unparkBatch)
}

// unparkShard queues again a shard's due parked tasks, given the answer of
// dueParkedScript; a full batch is followed by another read.
func (s *Scheduler) unparkShard(ctx context.Context, shard int, cmd *redis.Cmd) (n int, next time.Duration, err error) {
	for {
		res, err := cmd.Slice()
		if err != nil {
			return n, -1, fmt.Errorf("scheduler: due parked tasks: %w", err)
		}
		nextMs, _ := res[0].(int64)
		members := res[1:]
		if len(members) > 0 {
			moved, err := s.unparkMembers(ctx, shard, members)
			n += moved
			if err != nil {
				return n, -1, err
			}
		}
		if len(members) < unparkBatch {
			if nextMs < 0 {
				return n, -1, nil
			}
			return n, time.Duration(nextMs) * time.Millisecond, nil
		}
		cmd = s.dueParked(ctx, s.rdb, shard)
	}
}

// unparkMembers runs unparkScript for each of a shard's due members, in one round
// trip; it returns how many went back to their queues.
func (s *Scheduler) unparkMembers(ctx context.Context, shard int, members []any) (int, error) {
	cmds := make([]*redis.Cmd, 0, len(members))
	err := s.batch.Do(ctx, func(pipe redis.Pipeliner) {
		for _, v := range members {
			m, _ := v.(string)
			tenant, task, err := rkeys.ParseParkedMember(m)
			if err != nil {
				pipe.ZRem(ctx, s.keys.Parked(shard), m)
				continue
			}
			keys := []string{s.keys.Parked(shard), s.keys.TenantQueue(tenant), s.keys.TenantConf(tenant), s.keys.Ready(shard),
				s.keys.Capped(shard), s.keys.VirtualTime(shard), s.keys.TenantRunning(tenant)}
			cmds = append(cmds, unparkScript.Run(ctx, pipe, keys, m, task, tenant, int(queueTTL.Seconds())))
		}
	})
	n := 0
	for _, c := range cmds {
		if v, _ := c.Int(); v == 1 {
			n++
		}
	}
	if err != nil {
		return n, fmt.Errorf("scheduler: unpark: %w", err)
	}
	return n, nil
}

// IsParked reports whether a task waits in its shard's parked set.
func (s *Scheduler) IsParked(ctx context.Context, tenantID, taskID string) (bool, error) {
	_, err := s.rdb.ZScore(ctx, s.keys.Parked(s.keys.Shard(tenantID)), rkeys.ParkedMember(tenantID, taskID)).Result()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	return err == nil, err
}

// parkedHere notes that a task parked by this process is due at due, so that this
// process's dispatchers look for it then without polling Redis before. It reports
// whether one runs here to take it (Options.WakeInProcess).
func (s *Scheduler) parkedHere(due time.Time) bool {
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	for d := range s.local {
		d.parkedDue(due)
	}
	return s.kickHere && len(s.local) > 0
}

// pausedScript frees a paused task's slots as doneScript does (luaRelease) and, as
// parkScript does, counts one more generation for the task (field "g:<task>"): the
// dispatch that runs it after a resume is a new asynq message, never the pausing
// delivery's, which asynq may still hold as active. Running it twice frees nothing
// more.
//
// KEYS[1..7] doneScript's   ARGV[1..7] doneScript's
// Returns 1 if the task held a worker slot (the caller releases it), else 0.
var pausedScript = redisx.NewScript(luaNow + luaClockOfNow + luaRelease + `
local held = release(false)
redis.call('HINCRBY', KEYS[7], 'g:' .. ARGV[2], 1)
redis.call('EXPIRE', KEYS[7], ARGV[7])
return held
`)

// Paused frees a paused task's running and worker slots, charging its tenant the
// worker time it took (took < 0: unknown), and names its next dispatch anew. A paused
// task holds no slot: the worker that paused it calls this before its delivery ends,
// and the running-set pass for a worker that died first. along are calls that ride in
// its round trip, on its pipe (the pausing delivery's lease release, so that a task
// out of its running set has no lease left from it either); the error is Done's.
func (s *Scheduler) Paused(ctx context.Context, p wire.Payload, took time.Duration, along ...func(pipe redis.Pipeliner)) error {
	keys, args := s.releaseArgs(p, took)
	err := s.freeSlots(ctx, "paused", func(pipe redis.Pipeliner) *redis.Cmd { return pausedScript.Run(ctx, pipe, keys, args...) }, along)
	if errors.Is(err, errNotFreed) {
		return err
	}
	s.wake(ctx)
	return err
}

// dueNowScript makes a parked task due now: a wait that ended before its expected
// time (the children a parent waits for have all ended).
//
// KEYS[1] parked   ARGV[1] now ms or ""   ARGV[2] parked member
// Returns 1 if the task was parked, else 0.
var dueNowScript = redisx.NewScript(luaNow + `
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', now, ARGV[2])
return 1
`)

// WakeParked makes a parked task due now, so that a dispatcher queues it again at
// once, and reports whether it was parked. A task not parked (not yet, or queued
// already) is left alone.
func (s *Scheduler) WakeParked(ctx context.Context, tenantID string, taskID uuid.UUID) (bool, error) {
	member := rkeys.ParkedMember(tenantID, taskID.String())
	n, err := dueNowScript.Run(ctx, s.rdb, []string{s.keys.Parked(s.keys.Shard(tenantID))}, s.nowArg(), member).Int()
	if err != nil {
		return false, fmt.Errorf("scheduler: wake parked task: %w", err)
	}
	if n == 0 {
		return false, nil
	}
	now := time.Now()
	if !s.parkedHere(now) {
		_ = s.rdb.Publish(ctx, s.keys.WakeChannel(), parkedMessage(now)).Err()
	}
	s.wake(ctx)
	return true, nil
}
