package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/wire"
)

// Priority bands: one asynq queue each.
const (
	BandHigh    = "high"    // priority 7–9
	BandDefault = "default" // priority 4–6
	BandLow     = "low"     // priority 0–3
)

// Bands lists the bands with the asynq weight workers give each.
var Bands = map[string]int{BandHigh: 6, BandDefault: 3, BandLow: 1}

// Priority bounds; DefaultPriority applies when a request names none.
const (
	MinPriority     = 0
	MaxPriority     = 9
	DefaultPriority = 5
)

// BandOf maps a task priority to its band.
func BandOf(priority int) string {
	switch {
	case priority >= 7:
		return BandHigh
	case priority >= 4:
		return BandDefault
	default:
		return BandLow
	}
}

const (
	scoreBandWidth = 1e13
	// Queue scores count milliseconds from 2025-01-01 so they stay well inside a
	// float64's exact integer range: (9·1e13 + a few centuries of ms) < 2^53.
	scoreEpochMs = 1735689600000
	// ttls bound every per-tenant key: state of an idle tenant expires on its own; the
	// recovery sweep re-pushes from Postgres any queued task that outlives them. An idle
	// tenant's conf (its cost estimate and finish pass) is kept for this long too, so a
	// tenant that comes back is charged its own estimate from its last finish pass. The per-shard sets (ready, capped, inflight,
	// dispatching) have no ttl: they are bounded by the tenants and worker slots and
	// empty as work drains.
	queueTTL = 7 * 24 * time.Hour
)

// QueueScore orders a tenant's queue: priority first, then admission time.
func QueueScore(priority int, createdAt time.Time) float64 {
	return float64(MaxPriority-priority)*scoreBandWidth + float64(createdAt.UnixMilli()-scoreEpochMs)
}

// Scheduler owns the per-tenant queues and the dispatch scripts.
type Scheduler struct {
	rdb      redis.UniversalClient
	keys     rkeys.Keys
	prefetch int
	nowMs    func() int64 // nil: scripts read Redis TIME
	batch    *redisx.Batch

	// cand holds, per shard, the tenants the last dispatch answered as the next one's
	// candidates. Stale entries cost a retry, never a wrong pick.
	candMu sync.Mutex
	cand   [][]string

	// wakeMu guards wakeArmed (a wake-up is due) and local.
	wakeMu    sync.Mutex
	wakeArmed bool
	// local are the dispatchers running in this process. Every dispatcher serves
	// every shard, so a wake-up that one of them takes needs no other: it is kicked
	// in process instead of published through Redis.
	local map[*Dispatcher]struct{}
}

// Options configure a Scheduler.
type Options struct {
	Prefetch int          // dispatch may run this many tasks ahead of free worker slots
	NowMs    func() int64 // test clock; nil uses Redis TIME
	// Batch carries the pool slot releases of concurrent completions and a dispatch
	// round's confirmations in shared round trips; nil makes one on rdb.
	Batch *redisx.Batch
}

// New returns a Scheduler on rdb.
func New(rdb redis.UniversalClient, keys rkeys.Keys, opts Options) *Scheduler {
	if opts.Batch == nil {
		opts.Batch = redisx.NewBatch(rdb, 0)
	}
	return &Scheduler{rdb: rdb, keys: keys, prefetch: opts.Prefetch, nowMs: opts.NowMs, batch: opts.Batch,
		cand: make([][]string, keys.Shards())}
}

// Keys returns the key builder.
func (s *Scheduler) Keys() rkeys.Keys { return s.keys }

func (s *Scheduler) nowArg() string {
	if s.nowMs == nil {
		return ""
	}
	return strconv.FormatInt(s.nowMs(), 10)
}

// luaNow is shared by every script: ARGV[1] is "now" in ms, or "" for Redis TIME.
const luaNow = `
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
`

// enqueueScript adds a task to its tenant's queue and makes the tenant backlogged. A
// newly backlogged tenant starts at the later of the virtual time and the finish pass
// of its last dispatch (conf field fp): idle time banks no credit, and a tenant whose
// queue emptied at its last dispatch still pays for it.
//
// KEYS[1] tenant queue   KEYS[2] tenant conf   KEYS[3] ready   KEYS[4] capped
// KEYS[5] virtual time   KEYS[6] tenant running set
// KEYS[7] tenant's admitted-not-yet-queued tasks (queue_backlog counts them until here)
// ARGV[1] now ms or ""   ARGV[2] task id   ARGV[3] score   ARGV[4] weight
// ARGV[5] running cap (0 = none)   ARGV[6] ttl seconds   ARGV[7] tenant id
// ARGV[8] the submission's traceparent or "" (kept in the tenant conf, field
// "tp:<task id>", until the task is dispatched or removed)
// Returns 1 if the task was added, 0 if it was already queued.
var enqueueScript = redisx.NewScript(luaNow + `
local added = redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
redis.call('ZREM', KEYS[7], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('HSET', KEYS[2], 'w', ARGV[4], 'cap', ARGV[5])
if ARGV[8] and ARGV[8] ~= '' then redis.call('HSET', KEYS[2], 'tp:' .. ARGV[2], ARGV[8]) end
redis.call('EXPIRE', KEYS[2], ARGV[6])
local tenant = ARGV[7]
if redis.call('ZSCORE', KEYS[3], tenant) or redis.call('ZSCORE', KEYS[4], tenant) then
  return added
end
-- newly backlogged: no banked credit, no escaped charge
local vt = math.max(tonumber(redis.call('GET', KEYS[5]) or '0'),
  tonumber(redis.call('HGET', KEYS[2], 'fp') or '0'))
local cap = tonumber(ARGV[5])
if cap > 0 and redis.call('SCARD', KEYS[6]) >= cap then
  redis.call('ZADD', KEYS[4], vt, tenant)
else
  redis.call('ZADD', KEYS[3], vt, tenant)
end
return added
`)

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
// task in its queue, no longer as admitted-not-yet-queued.
func (s *Scheduler) Enqueue(ctx context.Context, p EnqueueParams) error {
	keys, args := enqueueArgs(s.keys, p, s.nowArg())
	// Concurrent submissions' pushes share a round trip.
	err := s.batch.Do(ctx, func(pipe redis.Pipeliner) { enqueueScript.Run(ctx, pipe, keys, args...) })
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

// Remove takes a queued task off its tenant's queue (cancel). It reports whether the
// task was there.
func (s *Scheduler) Remove(ctx context.Context, tenantID string, taskID uuid.UUID) (bool, error) {
	pipe := s.rdb.Pipeline()
	rem := pipe.ZRem(ctx, s.keys.TenantQueue(tenantID), taskID.String())
	pipe.HDel(ctx, s.keys.TenantConf(tenantID), "tp:"+taskID.String())
	_, _ = pipe.Exec(ctx)
	n, err := rem.Result()
	if err != nil {
		return false, fmt.Errorf("scheduler: remove: %w", err)
	}
	return n == 1, nil
}

// wakeDelay is how long a wake-up waits for others to share its message: a round of
// dispatch takes every task that can go, so one message per delay wakes the
// dispatchers as well as one per enqueue and completion did, at a fraction of the
// publishes (and of the rounds they start) under load.
const wakeDelay = time.Millisecond

// wake asks the dispatchers for a round soon: within wakeDelay, in one wake-up with
// every other of this process in that time. It does not wait for Redis.
//
// A process that runs a dispatcher wakes its own, in process: any dispatcher
// dispatches every shard, and the round trip of a message (and the round it would
// start in every other dispatcher) is saved. A process without one publishes the
// wake-up to all of them.
func (s *Scheduler) wake(context.Context) {
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	if s.wakeArmed {
		return
	}
	s.wakeArmed = true
	time.AfterFunc(wakeDelay, func() {
		s.wakeMu.Lock()
		s.wakeArmed = false
		kicked := len(s.local) > 0
		for d := range s.local {
			d.Kick()
		}
		s.wakeMu.Unlock()
		if kicked {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		// A lost wake-up only delays dispatch until the fallback timer.
		_ = s.rdb.Publish(ctx, s.keys.WakeChannel(), "1").Err()
	})
}

// runsHere records a dispatcher of this process as running (on) or stopped.
func (s *Scheduler) runsHere(d *Dispatcher, on bool) {
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	if !on {
		delete(s.local, d)
		return
	}
	if s.local == nil {
		s.local = map[*Dispatcher]struct{}{}
	}
	s.local[d] = struct{}{}
}

// DefaultEstimateMs is a tenant's estimated task cost in worker-milliseconds before
// any of its tasks finished; completions then refine it (an EWMA), and correct each
// task's charge to what it really took.
const DefaultEstimateMs = 100

// dispatchScript pops up to ARGV[7] tasks of one shard in weighted-fair order, one
// after the other as single pops would. The caller holds a pool slot for each. A
// tenant that leaves the ready set because its queue is empty keeps its pass, charge
// included, as its finish pass (conf field fp); the enqueue that brings it back starts
// it there (or at the virtual time if later).
//
// The script touches only keys it is given: the caller names candidate tenants (the
// shard's ready and capped heads, as the previous call answered them) and passes
// their conf, running-set and queue keys. The script takes the head of ready itself,
// so each pick is always the current one; when the head is not a candidate, or every
// candidate was capped or empty, it stops and answers "retry" with the current
// candidates.
//
// KEYS[1] ready   KEYS[2] capped   KEYS[3] dispatching   KEYS[4] virtual time,
// then 3 per candidate, in ARGV's order: tenant conf, tenant running set, tenant queue
// ARGV[1] now ms or ""   ARGV[2] ttl s   ARGV[3] default estimate (worker-ms)
// ARGV[4] global virtual time   ARGV[5] ready heads to answer   ARGV[6] capped heads
// to answer   ARGV[7] most tasks to pop   ARGV[8...] candidate tenant ids
// Returns {status, n, n × (tenant, task, priority, estimate ms, weight, traceparent
// or ""), candidates...}: status "ok" when it popped ARGV[7] tasks, else "retry" or
// "empty" (the shard has no backlogged tenant); candidates are the heads of ready,
// then of capped, after the call.
var dispatchScript = redis.NewScript(luaNow + `
local first = 8
local want = tonumber(ARGV[7])
local slot = {}
for i = first, #ARGV do slot[ARGV[i]] = 4 + (i - first) * 3 end
local out, n = {}, 0
local function answer(status)
  local r = {status, tostring(n)}
  for _, v in ipairs(out) do r[#r+1] = v end
  for _, t in ipairs(redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[5]) - 1)) do r[#r+1] = t end
  for _, t in ipairs(redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[6]) - 1)) do r[#r+1] = t end
  return r
end
while n < want do
  local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if #head == 0 then return answer('empty') end
  local tenant, pass = head[1], tonumber(head[2])
  local b = slot[tenant]
  if not b then return answer('retry') end
  local conf, run, queue = KEYS[b + 1], KEYS[b + 2], KEYS[b + 3]
  local c = redis.call('HMGET', conf, 'cap', 'w', 'est')
  local cap = tonumber(c[1] or '0')
  if cap > 0 and redis.call('SCARD', run) >= cap then
    -- at its running cap: wait outside the shared pool until a completion
    redis.call('ZREM', KEYS[1], tenant)
    redis.call('ZADD', KEYS[2], pass, tenant)
  else
    local task = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
    if #task == 0 then
      -- its tasks were cancelled while it waited
      redis.call('ZREM', KEYS[1], tenant)
      redis.call('HSET', conf, 'fp', pass)
      redis.call('EXPIRE', conf, ARGV[2])
    else
      redis.call('ZREM', queue, task[1])
      local tp = redis.call('HGET', conf, 'tp:' .. task[1])
      if tp then redis.call('HDEL', conf, 'tp:' .. task[1]) else tp = '' end
      redis.call('SADD', run, task[1])
      redis.call('EXPIRE', run, ARGV[2])
      local prio = 9 - math.floor(tonumber(task[2]) / 1e13)
      local est = math.floor(tonumber(c[3] or ARGV[3]))
      -- rkeys.DispatchingMember
      redis.call('ZADD', KEYS[3], now, prio .. ':' .. est .. ':' .. tenant .. ':' .. task[1])
      local vt = math.max(pass, tonumber(ARGV[4]) or 0, tonumber(redis.call('GET', KEYS[4]) or '0'))
      redis.call('SET', KEYS[4], vt, 'EX', ARGV[2])
      local w = tonumber(c[2] or '1')
      local finish = pass + est / w
      if redis.call('ZCARD', queue) == 0 then
        redis.call('ZREM', KEYS[1], tenant)
        redis.call('HSET', conf, 'fp', finish)
        redis.call('EXPIRE', conf, ARGV[2])
      else
        redis.call('ZADD', KEYS[1], finish, tenant)
      end
      for _, v in ipairs({tenant, task[1], tostring(prio), tostring(math.floor(est)), tostring(w), tp}) do
        out[#out+1] = v
      end
      n = n + 1
    end
  end
end
return answer('ok')
`)

// How many of a shard's ready and capped heads a dispatch names as the next call's
// candidates. The next pick is nearly always among them: the head just dispatched
// and the tenants behind it, or a capped tenant a completion brought back. A miss
// costs one more call (the "retry" answer carries fresh candidates).
const (
	readyCandidates  = 8
	cappedCandidates = 4
	// dispatchTries bounds the calls of one dispatchOne: each "retry" answer either
	// follows progress (candidates capped or dropped) or refreshes stale candidates.
	dispatchTries = 8
)

// Dispatched is a task popped by dispatch and not yet confirmed in asynq.
type Dispatched struct {
	TenantID   string
	TaskID     string
	Priority   int
	EstimateMs int64 // what its tenant's pass was charged
	// Weight is its tenant's weight at dispatch (0 when not known: a re-send).
	Weight int
	// TraceParent is the submission's traceparent ("" for none, or a re-send).
	TraceParent string
}

// member is the task's entry in the dispatching set.
func (d Dispatched) member() string {
	return rkeys.DispatchingMember(d.Priority, d.EstimateMs, d.TenantID, d.TaskID)
}

func parseMember(m string) (Dispatched, error) {
	p, est, tenant, task, err := rkeys.ParseDispatchingMember(m)
	if err != nil {
		return Dispatched{}, fmt.Errorf("scheduler: %w", err)
	}
	return Dispatched{Priority: p, EstimateMs: est, TenantID: tenant, TaskID: task}, nil
}

// Why dispatch stopped.
var (
	errEmpty      = errors.New("no backlogged tenant")
	errNoCapacity = errors.New("no worker capacity")
	errBusy       = errors.New("scanned tenants were capped or empty")
)

func (s *Scheduler) candidates(shard int) []string {
	s.candMu.Lock()
	defer s.candMu.Unlock()
	return s.cand[shard]
}

func (s *Scheduler) setCandidates(shard int, c []string) {
	s.candMu.Lock()
	defer s.candMu.Unlock()
	s.cand[shard] = c
}

// dispatchOne runs dispatchScript on one shard for one task. The caller holds a
// pool slot.
func (s *Scheduler) dispatchOne(ctx context.Context, shard int, globalVT float64) (Dispatched, error) {
	ds, err := s.dispatchMany(ctx, shard, globalVT, 1)
	if len(ds) == 1 {
		return ds[0], nil
	}
	return Dispatched{}, err
}

// dispatchMany pops up to want tasks of one shard in fair order, in one call of
// dispatchScript when its candidates are current. The caller holds a pool slot for
// each. It returns what it popped, and errEmpty or errBusy when that is fewer.
func (s *Scheduler) dispatchMany(ctx context.Context, shard int, globalVT float64, want int) ([]Dispatched, error) {
	vt := strconv.FormatFloat(globalVT, 'f', -1, 64)
	var out []Dispatched
	for range dispatchTries {
		cand := s.candidates(shard)
		keys := make([]string, 0, 4+3*len(cand))
		keys = append(keys, s.keys.Ready(shard), s.keys.Capped(shard), s.keys.Dispatching(shard), s.keys.VirtualTime(shard))
		args := make([]any, 0, 7+len(cand))
		args = append(args, s.nowArg(), int(queueTTL.Seconds()), DefaultEstimateMs, vt, readyCandidates, cappedCandidates,
			want-len(out))
		for _, t := range cand {
			keys = append(keys, s.keys.TenantConf(t), s.keys.TenantRunning(t), s.keys.TenantQueue(t))
			args = append(args, t)
		}
		res, err := dispatchScript.Run(ctx, s.rdb, keys, args...).StringSlice()
		if err != nil {
			return out, fmt.Errorf("scheduler: dispatch: %w", err)
		}
		n, _ := strconv.Atoi(res[1])
		popped := res[2 : 2+6*n]
		for i := 0; i < len(popped); i += 6 {
			prio, _ := strconv.Atoi(popped[i+2])
			est, _ := strconv.ParseInt(popped[i+3], 10, 64)
			w, _ := strconv.ParseFloat(popped[i+4], 64)
			out = append(out, Dispatched{TenantID: popped[i], TaskID: popped[i+1], Priority: prio, EstimateMs: est,
				Weight: int(w), TraceParent: popped[i+5]})
		}
		s.setCandidates(shard, res[2+6*n:])
		switch res[0] {
		case "ok":
			return out, nil
		case "empty":
			return out, errEmpty
		}
		// "retry": the candidates are fresh now
	}
	return out, errBusy
}

// reserveScript takes up to ARGV[3] slots of the live worker pool, as many as are free.
//
// KEYS[1] workers   KEYS[2] worker slots   KEYS[3] pool inflight
// ARGV[1] now ms or ""   ARGV[2] prefetch   ARGV[3] slots wanted (default 1)
// Returns the number of slots taken, 0 if the pool is full.
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

// releaseScript gives ARGV[1] pool slots back (default 1; never below zero).
//
// KEYS[1] pool inflight   ARGV[1] slots
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

// reserveN takes up to n pool slots, as many as are free.
func (s *Scheduler) reserveN(ctx context.Context, n int) (int, error) {
	got, err := reserveScript.Run(ctx, s.rdb, []string{s.keys.Workers(), s.keys.WorkerSlots(), s.keys.PoolInflight()},
		s.nowArg(), s.prefetch, n).Int()
	if err != nil {
		return 0, fmt.Errorf("scheduler: reserve: %w", err)
	}
	return got, nil
}

func (s *Scheduler) release(ctx context.Context) error { return s.releaseN(ctx, 1) }

// releaseN gives n pool slots back.
func (s *Scheduler) releaseN(ctx context.Context, n int) error {
	// Concurrent workers' releases share a round trip.
	err := s.batch.Do(ctx, func(pipe redis.Pipeliner) { releaseScript.Run(ctx, pipe, []string{s.keys.PoolInflight()}, n) })
	if err != nil {
		return fmt.Errorf("scheduler: release: %w", err)
	}
	return nil
}

// confirmScript records that asynq holds a dispatched task.
//
// KEYS[1] dispatching   KEYS[2] inflight   KEYS[3] tenant running set
// ARGV[1] now ms or ""   ARGV[2] dispatching member   ARGV[3] task id
// A task that already finished (its worker was quicker than this call) is not added
// to inflight.
var confirmScript = redisx.NewScript(luaNow + `
redis.call('ZREM', KEYS[1], ARGV[2])
if redis.call('SISMEMBER', KEYS[3], ARGV[3]) == 1 then
  redis.call('ZADD', KEYS[2], now, ARGV[3])
end
return 1
`)

func (s *Scheduler) confirm(ctx context.Context, d Dispatched) error {
	return s.confirmAll(ctx, []Dispatched{d})
}

// confirmAll confirms a round's tasks in one round trip, shared with other calls of
// the moment.
func (s *Scheduler) confirmAll(ctx context.Context, ds []Dispatched) error {
	err := s.batch.Do(ctx, func(pipe redis.Pipeliner) {
		for _, d := range ds {
			shard := s.keys.Shard(d.TenantID)
			keys := []string{s.keys.Dispatching(shard), s.keys.Inflight(shard), s.keys.TenantRunning(d.TenantID)}
			confirmScript.Run(ctx, pipe, keys, s.nowArg(), d.member(), d.TaskID)
		}
	})
	if err != nil {
		return fmt.Errorf("scheduler: confirm: %w", err)
	}
	return nil
}

// doneScript ends a dispatched task: frees its running slot, corrects its tenant's
// pass from the estimate to the worker time it really took, refines the estimate, and
// brings a capped tenant back into the ready set. The correction goes to the pass in
// ready or capped, or, when the tenant is in neither (its queue is empty), to its
// finish pass, so a tenant that keeps its queue shallow is corrected like any other.
// An idle tenant's conf stays, with its ttl, for its next submission.
//
// KEYS[1] tenant running set   KEYS[2] inflight   KEYS[3] dispatching   KEYS[4] ready
// KEYS[5] capped   KEYS[6] tenant queue   KEYS[7] tenant conf
// ARGV[1] now ms or ""   ARGV[2] task id   ARGV[3] tenant   ARGV[4] dispatching member
// ARGV[5] estimate charged (ms)   ARGV[6] worker time taken (ms, -1 if unknown)
// ARGV[7] ttl s
// Returns 1 if the task held a pool slot (the caller releases it), else 0.
var doneScript = redisx.NewScript(luaNow + `
local held = redis.call('SREM', KEYS[1], ARGV[2])
local counted = redis.call('ZREM', KEYS[2], ARGV[2]) + redis.call('ZREM', KEYS[3], ARGV[4])
if held == 0 then return 0 end
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
    if redis.call('ZCARD', KEYS[6]) > 0 then
      redis.call('ZADD', KEYS[4], pass, tenant)
    else
      -- its queue emptied while it was capped: it leaves with its pass
      redis.call('HSET', KEYS[7], 'fp', pass)
      redis.call('EXPIRE', KEYS[7], ARGV[7])
    end
  end
end
if counted > 0 then return 1 end
return 0
`)

// Done releases a dispatched task's running slot and pool slot, charges its tenant
// the worker time it took (took < 0: unknown, keep the estimate), and wakes the
// dispatchers. Calling it twice is harmless. p's Priority and EstimateMs rebuild the
// task's dispatching member, which is still there when its worker was quicker than
// the dispatcher's confirm; once confirmed, the task is found by its id alone.
func (s *Scheduler) Done(ctx context.Context, p wire.Payload, took time.Duration) error {
	return s.DoneQueued(ctx, s.done(ctx, s.rdb, p, took))
}

// QueueDone queues Done's script on pipe (a redisx.Batch's, to go out with the other
// calls of a task's end); DoneQueued, given its answer once the pipe was sent,
// finishes Done.
func (s *Scheduler) QueueDone(ctx context.Context, pipe redis.Pipeliner, p wire.Payload, took time.Duration) *redis.Cmd {
	return s.done(ctx, pipe, p, took)
}

// DoneQueued finishes a Done queued with QueueDone: it releases the task's pool slot
// if the script found it held, and wakes the dispatchers.
func (s *Scheduler) DoneQueued(ctx context.Context, cmd *redis.Cmd) error {
	held, err := cmd.Int()
	if err != nil {
		return fmt.Errorf("scheduler: done: %w", err)
	}
	if held == 1 {
		if err := s.release(ctx); err != nil {
			return err
		}
	}
	s.wake(ctx)
	return nil
}

func (s *Scheduler) done(ctx context.Context, c redis.Scripter, p wire.Payload, took time.Duration) *redis.Cmd {
	shard := s.keys.Shard(p.TenantID)
	keys := []string{
		s.keys.TenantRunning(p.TenantID), s.keys.Inflight(shard), s.keys.Dispatching(shard), s.keys.Ready(shard),
		s.keys.Capped(shard), s.keys.TenantQueue(p.TenantID), s.keys.TenantConf(p.TenantID),
	}
	d := Dispatched{TenantID: p.TenantID, TaskID: p.TaskID, Priority: p.Priority, EstimateMs: p.EstimateMs}
	tookMs := int64(-1)
	if took >= 0 {
		tookMs = took.Milliseconds()
	}
	return doneScript.Run(ctx, c, keys, s.nowArg(), p.TaskID, p.TenantID, d.member(), p.EstimateMs, tookMs,
		int(queueTTL.Seconds()))
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

// NewAsynqTask builds the asynq task for a dispatched task. TaskID is the task id, so
// a re-send after a crash is refused as a duplicate instead of running twice.
func NewAsynqTask(keys rkeys.Keys, d Dispatched) (*asynq.Task, error) {
	body, err := json.Marshal(wire.Payload{TaskID: d.TaskID, TenantID: d.TenantID, Priority: d.Priority, EstimateMs: d.EstimateMs,
		TraceParent: d.TraceParent})
	if err != nil {
		return nil, err
	}
	return asynq.NewTask(wire.TaskType, body,
		asynq.TaskID(d.TaskID),
		asynq.Queue(keys.AsynqQueue(BandOf(d.Priority))),
		// Retries are for infrastructure errors and for redeliveries after a worker
		// died (each counts as one); business outcomes end the task in Postgres.
		asynq.MaxRetry(10),
		// agentq enforces each task's own wallclock budget; asynq's timeout is a backstop.
		asynq.Timeout(2*time.Hour),
	), nil
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

// Running is the number of the tenant's tasks dispatched and not finished.
func (s *Scheduler) Running(ctx context.Context, tenantID string) (int64, error) {
	return s.rdb.SCard(ctx, s.keys.TenantRunning(tenantID)).Result()
}

// Queued names a task Postgres holds as queued.
type Queued struct {
	TenantID string
	TaskID   uuid.UUID
}

// Missing returns the tasks of qs that Redis knows nothing of: in neither their
// tenant's queue nor its dispatched set. Those were lost (Redis restarted without
// persistence, or the push after the Postgres write failed) and must be pushed again.
func (s *Scheduler) Missing(ctx context.Context, qs []Queued) ([]Queued, error) {
	pipe := s.rdb.Pipeline()
	scores := make([]*redis.FloatCmd, len(qs))
	members := make([]*redis.BoolCmd, len(qs))
	for i, q := range qs {
		scores[i] = pipe.ZScore(ctx, s.keys.TenantQueue(q.TenantID), q.TaskID.String())
		members[i] = pipe.SIsMember(ctx, s.keys.TenantRunning(q.TenantID), q.TaskID.String())
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("scheduler: missing: %w", err)
	}
	var out []Queued
	for i, q := range qs {
		if errors.Is(scores[i].Err(), redis.Nil) && !members[i].Val() {
			out = append(out, q)
		}
	}
	return out, nil
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

// EnqueueInPipeline queues the enqueue script of p on pipe without waking the
// dispatchers (bulk loads and benchmarks; call Enqueue for single tasks).
func EnqueueInPipeline(ctx context.Context, pipe redis.Pipeliner, keys rkeys.Keys, p EnqueueParams) {
	ks, args := enqueueArgs(keys, p, "")
	enqueueScript.Run(ctx, pipe, ks, args...)
}

// Take performs one dispatch — pool slot, fair pick within a shard, confirm — but
// returns the task instead of handing it to asynq (benchmarks, tools). With several
// shards it takes from the first non-empty one, not the smallest head pass (that is
// the Dispatcher's job). Finish the task with Done.
func (s *Scheduler) Take(ctx context.Context) (wire.Payload, error) {
	ok, err := s.reserve(ctx)
	if err != nil {
		return wire.Payload{}, err
	}
	if !ok {
		return wire.Payload{}, errNoCapacity
	}
	for shard := range s.keys.Shards() {
		d, err := s.dispatchOne(ctx, shard, 0)
		if err == nil {
			if err := s.confirm(ctx, d); err != nil {
				return wire.Payload{}, err
			}
			return wire.Payload{TaskID: d.TaskID, TenantID: d.TenantID, Priority: d.Priority, EstimateMs: d.EstimateMs}, nil
		}
		if !errors.Is(err, errEmpty) && !errors.Is(err, errBusy) {
			_ = s.release(ctx)
			return wire.Payload{}, err
		}
	}
	_ = s.release(ctx)
	return wire.Payload{}, errEmpty
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

// generationTTL keeps the generation marker alive between janitor leaders' checks
// (every second), however long a Redis runs.
const generationTTL = 30 * 24 * time.Hour

// MarkGeneration sets this Redis's generation markers, the global one and each
// shard's, where they are missing, and renews their ttl. It reports whether any was
// missing: the Redis (or, on a cluster, a node) lost its data (FLUSHDB, a restart
// without persistence, a failover to a replica that lagged), or never had it.
func (s *Scheduler) MarkGeneration(ctx context.Context) (bool, error) {
	now := time.Now().UTC().Format(time.RFC3339)
	markers := make([]string, 0, 1+s.keys.Shards())
	markers = append(markers, s.keys.Generation())
	for shard := range s.keys.Shards() {
		markers = append(markers, s.keys.ShardGeneration(shard))
	}
	// One key per command, so on a cluster each goes to its own node.
	pipe := s.rdb.Pipeline()
	sets := make([]*redis.BoolCmd, len(markers))
	for i, m := range markers {
		sets[i] = pipe.SetNX(ctx, m, now, generationTTL)
		pipe.Expire(ctx, m, generationTTL)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return false, fmt.Errorf("scheduler: generation marker: %w", err)
	}
	missing := false
	for _, c := range sets {
		missing = missing || c.Val()
	}
	return missing, nil
}

// QueueLen is the number of the tenant's queued tasks.
func (s *Scheduler) QueueLen(ctx context.Context, tenantID string) (int64, error) {
	return s.rdb.ZCard(ctx, s.keys.TenantQueue(tenantID)).Result()
}

// AddRunning re-adds a running task that Redis lost to its tenant's running set, so
// the tenant's cap counts it.
func (s *Scheduler) AddRunning(ctx context.Context, tenantID, taskID string) error {
	pipe := s.rdb.TxPipeline()
	pipe.SAdd(ctx, s.keys.TenantRunning(tenantID), taskID)
	pipe.Expire(ctx, s.keys.TenantRunning(tenantID), queueTTL)
	_, err := pipe.Exec(ctx)
	return err
}

// poolFixScript sets the pool counter to the in-flight count measured by the janitor,
// unless it moved since it was read.
//
// KEYS[1] pool inflight   ARGV[1] value read   ARGV[2] measured value
var poolFixScript = redis.NewScript(`
if (redis.call('GET', KEYS[1]) or '0') ~= ARGV[1] then return -1 end
redis.call('SET', KEYS[1], ARGV[2], 'EX', 86400)
return 1
`)

// ReconcilePool recounts the tasks the worker pool holds (every shard's dispatching
// and inflight sets) and corrects the pool counter if it drifted (a crash between a
// reservation and its release). It returns the drift it corrected.
func (s *Scheduler) ReconcilePool(ctx context.Context) (int64, error) {
	before, err := s.rdb.Get(ctx, s.keys.PoolInflight()).Int64()
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
	n, err := poolFixScript.Run(ctx, s.rdb, []string{s.keys.PoolInflight()}, strconv.FormatInt(before, 10), actual).Int()
	if err != nil || n != 1 {
		return 0, err // it moved: dispatch is busy; the next run looks again
	}
	s.wake(ctx)
	return actual - before, nil
}

// Stranded reports whether a dispatched task that has not started is lost to asynq:
// confirmed in flight for longer than minAge while asynq holds no live message for it
// (gone with a Redis data loss, or archived after its retries). A stranded task's
// leftover message is deleted, so the task can be sent again.
func (s *Scheduler) Stranded(ctx context.Context, insp *asynq.Inspector, tenantID, taskID string, priority int, minAge time.Duration) (bool, error) {
	score, err := s.rdb.ZScore(ctx, s.keys.Inflight(s.keys.Shard(tenantID)), taskID).Result()
	if errors.Is(err, redis.Nil) {
		return false, nil // not confirmed yet: the dispatcher re-sends it
	}
	if err != nil {
		return false, err
	}
	now, err := s.clockMs(ctx)
	if err != nil {
		return false, err
	}
	if now-int64(score) < minAge.Milliseconds() {
		return false, nil
	}
	queue := s.keys.AsynqQueue(BandOf(priority))
	info, err := insp.GetTaskInfo(queue, taskID)
	switch {
	case errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound):
		return true, nil
	case err != nil:
		return false, err
	case info.State == asynq.TaskStateArchived || info.State == asynq.TaskStateCompleted:
		return true, insp.DeleteTask(queue, taskID)
	}
	return false, nil
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
