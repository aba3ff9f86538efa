package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/wire"
)

// luaRelease defines release(), which frees a dispatched task's running slot,
// corrects its tenant's pass from the estimate to the worker time it really took,
// refines the estimate, and brings a capped tenant back into the ready set. The
// correction goes to the pass in ready or capped, or, when the tenant is in neither
// (its queue is empty), to its finish pass, so a tenant that keeps its queue shallow
// is corrected like any other. A tenant leaving capped is stamped (conf "uncap", see
// HeldBack). An idle tenant's conf stays, with its ttl, for its next
// submission. It returns 1 if the task held a worker slot (the caller releases it), else
// 0, and whether the task was in its running set. The keys and arguments are doneScript's; parkScript shares them. again (a release
// repeated after a first one) looks no further than the running set when the task is
// not in it: the first release emptied inflight and dispatching of it, and a task is in
// them only while it is in its running set. The script defines clock() (luaClock).
const luaRelease = `
local function release(again)
  local held = redis.call('SREM', KEYS[1], ARGV[2])
  if held == 0 and again then return 0, false end
  local counted = redis.call('ZREM', KEYS[2], ARGV[2]) + redis.call('ZREM', KEYS[3], ARGV[4])
  if held == 0 then return 0, false end
  local tenant = ARGV[3]
  local took = tonumber(ARGV[6])
  if took >= 0 then
    local c = redis.call('HMGET', KEYS[7], 'w', 'est', 'fp')
    local w = tonumber(c[1] or '1')
    local delta = (took - tonumber(ARGV[5])) / w
    if delta ~= 0 then
      if redis.call('ZSCORE', KEYS[4], tenant) then redis.call('ZINCRBY', KEYS[4], delta, tenant)
      elseif redis.call('ZSCORE', KEYS[5], tenant) then redis.call('ZINCRBY', KEYS[5], delta, tenant)
      elseif c[3] then redis.call('HSET', KEYS[7], 'fp', tonumber(c[3]) + delta) end
    end
    local est = tonumber(c[2] or took)
    redis.call('HSET', KEYS[7], 'est', math.floor(est * 0.8 + took * 0.2 + 0.5))
    redis.call('EXPIRE', KEYS[7], ARGV[7])
  end
  local pass = redis.call('ZSCORE', KEYS[5], tenant)
  if pass then
    local cap = tonumber(redis.call('HGET', KEYS[7], 'cap') or '0')
    if cap == 0 or redis.call('SCARD', KEYS[1]) < cap then
      redis.call('ZREM', KEYS[5], tenant)
      -- when its own cap last held it: a late start since then is not a breach
      redis.call('HSET', KEYS[7], 'uncap', clock())
      if redis.call('ZCARD', KEYS[6]) > 0 then
        redis.call('ZADD', KEYS[4], pass, tenant)
      else
        -- its queue emptied while it was capped: it leaves with its pass
        redis.call('HSET', KEYS[7], 'fp', pass)
        redis.call('EXPIRE', KEYS[7], ARGV[7])
      end
    end
  end
  if counted > 0 then return 1, true end
  return 0, true
end
`

// doneScript ends a dispatched task (luaRelease) and forgets its parks. A repeated
// release (ARGV[8] "1") of a task no longer in its running set changes nothing.
//
// KEYS[1] tenant running set   KEYS[2] inflight   KEYS[3] dispatching   KEYS[4] ready
// KEYS[5] capped   KEYS[6] tenant queue   KEYS[7] tenant conf
// ARGV[1] now ms or ""   ARGV[2] task id   ARGV[3] tenant   ARGV[4] dispatching member
// ARGV[5] estimate charged (ms)   ARGV[6] worker time taken (ms, -1 if unknown)
// ARGV[7] ttl s   ARGV[8] "1" for a repeated release, else "0" (or absent)
// Returns 1 if the task held a worker slot (the caller releases it), else 0.
var doneScript = redisx.NewScript(luaClock + luaRelease + `
local again = ARGV[8] == '1'
local held, found = release(again)
if again and not found then return 0 end
redis.call('HDEL', KEYS[7], 'g:' .. ARGV[2])
return held
`)

// Done releases a dispatched task's running slot and worker slot, charges its tenant
// the worker time it took (took < 0: unknown, keep the estimate), and wakes the
// dispatchers. Calling it twice is harmless. p's Priority and EstimateMs rebuild the
// task's dispatching member, which is still there when its worker was quicker than
// the dispatcher's confirm; once confirmed, the task is found by its id alone.
//
// The script goes through the Scheduler's Batch, with concurrent completions; along
// are calls that ride in its round trip, on its pipe (a finished task's settlement,
// lease release and last messages). The error is the first failed command's, its own
// or a rider's: the slots are freed either way when its own command succeeded.
func (s *Scheduler) Done(ctx context.Context, p wire.Payload, took time.Duration, along ...func(pipe redis.Pipeliner)) error {
	err := s.freeSlots(ctx, "done", func(pipe redis.Pipeliner) *redis.Cmd { return s.done(ctx, pipe, p, took) }, along)
	if errors.Is(err, errNotFreed) {
		return err
	}
	s.wake(ctx)
	return err
}

// DoneAgain is Done repeated once the task's end is recorded, for a janitor pass that
// put the task back in its running set in between (it saw the task running in
// Postgres and missing from the set, which the first Done had left): it frees that
// entry as Done does. That is rare, so the round trip (with the calls along) only
// asks whether the task is in its running set; the release runs, in a second round
// trip, when it is. The janitor puts a task back only before the end's commit and
// looks at Postgres again after that, so a task absent at this look stays freed.
func (s *Scheduler) DoneAgain(ctx context.Context, p wire.Payload, along ...func(pipe redis.Pipeliner)) error {
	var back *redis.BoolCmd
	err := s.batch.Do(ctx, func(pipe redis.Pipeliner) {
		back = pipe.SIsMember(ctx, s.keys.TenantRunning(p.TenantID), p.TaskID)
		for _, a := range along {
			a(pipe)
		}
	})
	if back == nil {
		return fmt.Errorf("scheduler: done again: %w: %w", errNotFreed, err)
	}
	in, berr := back.Result()
	switch {
	case berr != nil:
		return fmt.Errorf("scheduler: done again: %w: %w", errNotFreed, berr)
	case in:
		if ferr := s.freeSlots(ctx, "done again", func(pipe redis.Pipeliner) *redis.Cmd {
			keys, args := s.releaseArgs(p, -1)
			return doneScript.Run(ctx, pipe, keys, append(args, "1")...)
		}, nil); ferr != nil {
			return ferr
		}
		s.wake(ctx)
	}
	if err != nil {
		return fmt.Errorf("scheduler: done again: a call riding along failed: %w", err)
	}
	return nil
}

// errNotFreed marks a freeSlots error after which the slots may still be held.
var errNotFreed = errors.New("slots not freed")

// freeSlots runs a script that frees a dispatched task's running slot (luaRelease's
// callers) through the Batch, with the calls along, and gives the task's worker slot
// back when the script says the task held one. An error that wraps errNotFreed says
// the script did not run or failed; any other is a rider's (or the worker slot's
// release, which the slot counter pass repairs).
func (s *Scheduler) freeSlots(ctx context.Context, what string, script func(redis.Pipeliner) *redis.Cmd, along []func(redis.Pipeliner)) error {
	var cmd *redis.Cmd
	err := s.batch.Do(ctx, func(pipe redis.Pipeliner) {
		cmd = script(pipe)
		for _, a := range along {
			a(pipe)
		}
	})
	if cmd == nil {
		return fmt.Errorf("scheduler: %s: %w: %w", what, errNotFreed, err)
	}
	held, herr := cmd.Int()
	if herr != nil {
		return fmt.Errorf("scheduler: %s: %w: %w", what, errNotFreed, herr)
	}
	if held == 1 {
		if rerr := s.release(ctx); rerr != nil {
			return rerr
		}
	}
	if err != nil {
		return fmt.Errorf("scheduler: %s: a call riding along failed: %w", what, err)
	}
	return nil
}

func (s *Scheduler) done(ctx context.Context, c redis.Scripter, p wire.Payload, took time.Duration) *redis.Cmd {
	keys, args := s.releaseArgs(p, took)
	return doneScript.Run(ctx, c, keys, args...)
}

// releaseArgs are the keys and arguments of luaRelease for a dispatched task.
func (s *Scheduler) releaseArgs(p wire.Payload, took time.Duration) ([]string, []any) {
	shard := s.keys.Shard(p.TenantID)
	keys := []string{
		s.keys.TenantRunning(p.TenantID), s.keys.Inflight(shard), s.keys.Dispatching(shard), s.keys.Ready(shard),
		s.keys.Capped(shard), s.keys.TenantQueue(p.TenantID), s.keys.TenantConf(p.TenantID),
	}
	d := Dispatched{TenantID: p.TenantID, TaskID: p.TaskID, Priority: p.Priority, EstimateMs: p.EstimateMs, Gen: p.Gen}
	tookMs := int64(-1)
	if took >= 0 {
		tookMs = took.Milliseconds()
	}
	return keys, []any{s.nowArg(), p.TaskID, p.TenantID, d.member(), p.EstimateMs, tookMs, int(queueTTL.Seconds())}
}
