package scheduler

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
)

// Priority bounds; DefaultPriority applies when a request names none.
const (
	MinPriority     = 0
	MaxPriority     = 9
	DefaultPriority = 5
)

// Every dispatched task goes through one asynq queue (rkeys.Keys.TaskQueue). The
// dispatcher sends tasks in fair order, each tenant's by priority, and only as many as
// the live workers' free slots and the prefetch, so the workers take them in the order
// they were sent, and each fetch is one script call whatever the tasks' priorities.
//
// Earlier versions sent each priority band to an asynq queue of its own: 7–9 "high",
// 4–6 "default" (the task queue now) and 0–3 "low". The other two may still hold
// messages such a version sent or retried: the workers drain them (LegacyQueues) and
// Stranded looks for a task's message there.

// LegacyQueues are the asynq queues of the priority bands other than the default one,
// which earlier versions sent tasks of priority 7–9 and 0–3 to.
func LegacyQueues(keys rkeys.Keys) []string {
	return []string{keys.AsynqQueue("high"), keys.AsynqQueue("low")}
}

// legacyQueue is the asynq queue an earlier version sent a task of this priority to.
func legacyQueue(keys rkeys.Keys, priority int) string {
	switch {
	case priority >= 7:
		return keys.AsynqQueue("high")
	case priority >= 4:
		return keys.TaskQueue()
	default:
		return keys.AsynqQueue("low")
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
	// owed counts the worker slots released and not yet sent (releaseN).
	owed atomic.Int64
	// kickHere: Options.WakeInProcess
	kickHere bool

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

	// backlog is the backlogged tenants' weights as HeldBack last read them.
	backlog backlogWeights
}

// Options configure a Scheduler.
type Options struct {
	Prefetch int          // dispatch may run this many tasks ahead of free worker slots
	NowMs    func() int64 // test clock; nil uses Redis TIME
	// Batch carries the slot releases of concurrent completions (Done) and a
	// dispatch round's confirmations in shared round trips; nil makes one on rdb. The
	// App gives the worker's, whose other calls of the moment then share them too.
	Batch *redisx.Batch
	// WakeInProcess says a Dispatcher on this Scheduler runs in this process (the App
	// sets it with the scheduler role). A wake-up (after an enqueue or a completion)
	// then kicks the dispatchers running here instead of publishing through Redis:
	// any dispatcher serves every shard, so the message's round trip, and the round
	// it would start in every other dispatcher, are saved. While none runs here
	// (before its start, after its stop) wake-ups are published, so none is lost.
	// Off, every wake-up is published, whichever dispatchers run here.
	WakeInProcess bool
}

// New returns a Scheduler on rdb.
func New(rdb redis.UniversalClient, keys rkeys.Keys, opts Options) *Scheduler {
	if opts.Batch == nil {
		opts.Batch = redisx.NewBatch(rdb, 0)
	}
	return &Scheduler{rdb: rdb, keys: keys, prefetch: opts.Prefetch, nowMs: opts.NowMs, batch: opts.Batch, kickHere: opts.WakeInProcess,
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

// luaClock defines clock(): "now" as luaNow has it, but read from Redis TIME only when
// the script comes to need it, for the scripts that rarely do.
const luaClock = `
local clock_now
local function clock()
  if not clock_now then
    clock_now = tonumber(ARGV[1])
    if not clock_now then
      local t = redis.call('TIME')
      clock_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
  end
  return clock_now
end
`

// luaClockOfNow defines clock() in a script that has luaNow's now already.
const luaClockOfNow = `
local function clock() return now end
`

// wakeDelay is how long a wake-up waits for others to share its message: a round of
// dispatch takes every task that can go, so one message per delay wakes the
// dispatchers as well as one per enqueue and completion did, at a fraction of the
// publishes (and of the rounds they start) under load.
const wakeDelay = time.Millisecond

// wake asks the dispatchers for a round soon: within wakeDelay, in one wake-up with
// every other of this process in that time. It does not wait for Redis.
//
// With Options.WakeInProcess, a running dispatcher of this process is woken in
// process; otherwise the wake-up is published to all of them.
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
		kicked := s.kickHere && len(s.local) > 0
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
