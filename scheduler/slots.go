package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/redisx"
)

// reserveScript takes up to ARGV[3] of the live workers' slots, as many as are free.
//
// KEYS[1] workers   KEYS[2] worker slots   KEYS[3] slots inflight
// ARGV[1] now ms or ""   ARGV[2] prefetch   ARGV[3] slots wanted (default 1)
// Returns the number of slots taken, 0 if every slot is taken.
var reserveScript = redis.NewScript(luaNow + `
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
if #dead > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  redis.call('HDEL', KEYS[2], unpack(dead))
end
local slots = 0
for _, v in ipairs(redis.call('HVALS', KEYS[2])) do slots = slots + tonumber(v) end
local free = slots + tonumber(ARGV[2]) - tonumber(redis.call('GET', KEYS[3]) or '0')
local n = math.min(free, tonumber(ARGV[3] or '1'))
if n <= 0 then return 0 end
redis.call('INCRBY', KEYS[3], n)
redis.call('EXPIRE', KEYS[3], 86400)
return n
`)

// releaseScript gives ARGV[1] worker slots back (default 1; never below zero).
//
// KEYS[1] slots inflight   ARGV[1] slots
var releaseScript = redisx.NewScript(`
local held = tonumber(redis.call('GET', KEYS[1]) or '0')
local n = math.min(held, tonumber(ARGV[1] or '1'))
if n > 0 then return redis.call('DECRBY', KEYS[1], n) end
return held
`)

func (s *Scheduler) reserve(ctx context.Context) (bool, error) {
	n, err := s.reserveN(ctx, 1)
	return n == 1, err
}

// reserveN takes up to n worker slots, as many as are free.
func (s *Scheduler) reserveN(ctx context.Context, n int) (int, error) {
	got, err := reserveScript.Run(ctx, s.rdb, []string{s.keys.Workers(), s.keys.WorkerSlots(), s.keys.SlotsInflight()},
		s.nowArg(), s.prefetch, n).Int()
	if err != nil {
		return 0, fmt.Errorf("scheduler: reserve: %w", err)
	}
	return got, nil
}

func (s *Scheduler) release(ctx context.Context) error { return s.releaseN(ctx, 1) }

// releaseN gives n worker slots back. Concurrent releases share a round trip (the
// Batch's) and one call of releaseScript: each adds its slots to those owed, and the
// first of them queued on a pipe gives back all that are owed then, its own and those
// of the releases queued after it, which queue nothing. A release carried so is sent
// in the same flush as its own call or an earlier one, so it is answered when its call
// returns. A failure is reported by the call that carried it, as a lone release's
// was: the counter then stays above the slots really held until the janitor's slot
// counter pass corrects it (a release is not sent twice, which could take the counter
// below them and let dispatch hand out more than the workers' slots).
func (s *Scheduler) releaseN(ctx context.Context, n int) error {
	s.owed.Add(int64(n))
	err := s.batch.Do(ctx, func(pipe redis.Pipeliner) {
		if owed := s.owed.Swap(0); owed > 0 {
			releaseScript.Run(ctx, pipe, []string{s.keys.SlotsInflight()}, owed)
		}
	})
	if err != nil {
		return fmt.Errorf("scheduler: release: %w", err)
	}
	return nil
}

// heartbeatScript registers a worker's slots until ttl after Redis TIME, the clock
// reserveScript expires them by: a worker host whose clock is off still counts for
// exactly its ttl.
//
// KEYS[1] workers   KEYS[2] worker slots
// ARGV[1] now ms or ""   ARGV[2] worker id   ARGV[3] concurrency   ARGV[4] ttl ms
var heartbeatScript = redis.NewScript(luaNow + `
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[1], 86400)
redis.call('EXPIRE', KEYS[2], 86400)
return 1
`)

// Heartbeat registers a worker process's concurrency until ttl from now (Redis TIME).
// Dispatch counts only live workers' slots.
func (s *Scheduler) Heartbeat(ctx context.Context, workerID string, concurrency int, ttl time.Duration) error {
	err := heartbeatScript.Run(ctx, s.rdb, []string{s.keys.Workers(), s.keys.WorkerSlots()},
		s.nowArg(), workerID, concurrency, ttl.Milliseconds()).Err()
	if err != nil {
		return fmt.Errorf("scheduler: heartbeat: %w", err)
	}
	return nil
}

// clockMs is the scheduler's clock in ms: Redis TIME (or the test clock), the clock
// every score the scripts write is taken from, never this host's clock.
func (s *Scheduler) clockMs(ctx context.Context) (int64, error) {
	if s.nowMs != nil {
		return s.nowMs(), nil
	}
	t, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("scheduler: redis time: %w", err)
	}
	return t.UnixMilli(), nil
}

// Deregister removes a worker at shutdown so dispatch stops counting its slots at once.
func (s *Scheduler) Deregister(ctx context.Context, workerID string) error {
	pipe := s.rdb.TxPipeline()
	pipe.ZRem(ctx, s.keys.Workers(), workerID)
	pipe.HDel(ctx, s.keys.WorkerSlots(), workerID)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("scheduler: deregister: %w", err)
	}
	return nil
}

// slotCountFixScript sets the slot counter to the in-flight count measured by the janitor,
// unless it moved since it was read.
//
// KEYS[1] slots inflight   ARGV[1] value read   ARGV[2] measured value
var slotCountFixScript = redis.NewScript(`
if (redis.call('GET', KEYS[1]) or '0') ~= ARGV[1] then return -1 end
redis.call('SET', KEYS[1], ARGV[2], 'EX', 86400)
return 1
`)

// ReconcileSlots recounts the tasks the worker slots hold (every shard's dispatching
// and inflight sets) and corrects the slot counter if it drifted (a crash between a
// reservation and its release). It returns the drift it corrected.
func (s *Scheduler) ReconcileSlots(ctx context.Context) (int64, error) {
	before, err := s.rdb.Get(ctx, s.keys.SlotsInflight()).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, err
	}
	var actual int64
	for shard := range s.keys.Shards() {
		pipe := s.rdb.Pipeline()
		a := pipe.ZCard(ctx, s.keys.Inflight(shard))
		b := pipe.ZCard(ctx, s.keys.Dispatching(shard))
		if _, err := pipe.Exec(ctx); err != nil {
			return 0, err
		}
		actual += a.Val() + b.Val()
	}
	if actual == before {
		return 0, nil
	}
	n, err := slotCountFixScript.Run(ctx, s.rdb, []string{s.keys.SlotsInflight()}, strconv.FormatInt(before, 10), actual).Int()
	if err != nil || n != 1 {
		return 0, err // it moved: dispatch is busy; the next run looks again
	}
	s.wake(ctx)
	return actual - before, nil
}
