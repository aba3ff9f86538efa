package scheduler

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/riverqueue/river/rivershared/startstop"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/telemetry"
	"github.com/agentq/agentq/internal/wire"
)

// Enqueuer is the part of asynq.Client the dispatcher uses.
type Enqueuer interface {
	EnqueueContext(ctx context.Context, task *asynq.Task, opts ...asynq.Option) (*asynq.TaskInfo, error)
}

// Dispatcher is the long-running service that moves tasks from tenant queues into
// asynq. Several may run at once against one Redis.
type Dispatcher struct {
	startstop.BaseStartStop

	sched *Scheduler
	rdb   redis.UniversalClient
	asynq Enqueuer
	// writer writes tasks into asynq's queue in shared round trips when asynq is
	// asynq's own client (nil otherwise: a test's Enqueuer).
	writer    *asynqWriter
	inspector *asynq.Inspector
	log       *slog.Logger
	fallback  time.Duration // timer between dispatch rounds when no wake-up arrives
	resend    time.Duration // age after which a "dispatching" entry is re-sent

	tracer  trace.Tracer
	metrics *dispatchMetrics

	kick chan struct{}
	vtMu sync.Mutex
	vt   float64 // the largest head pass seen: the global virtual time

	// parkMu guards nextDue (when the next parked task known to this dispatcher is
	// due; zero: none known) and parkCheck (when the parked sets were last read).
	parkMu    sync.Mutex
	nextDue   time.Time
	parkCheck time.Time
}

// parkPoll is how often a dispatcher reads the parked sets when it knows of no parked
// task due sooner: tasks parked by other processes are found within it.
const parkPoll = 250 * time.Millisecond

// DispatcherOptions configure a Dispatcher.
type DispatcherOptions struct {
	FallbackEvery time.Duration // default 1s
	ResendAfter   time.Duration // default 5s
	// Archetype is where the dispatcher logs, traces each dispatch (agentq.dispatch,
	// in its submission's trace) and meters (agentq.dispatched, agentq.queue_depth,
	// agentq.fair_share_ratio); nil: the defaults.
	Archetype *baseservice.Archetype
}

// NewDispatcher returns a stopped dispatcher.
func NewDispatcher(sched *Scheduler, rdb redis.UniversalClient, enq Enqueuer, opts DispatcherOptions) *Dispatcher {
	arch := opts.Archetype.Defaults()
	d := &Dispatcher{
		sched: sched, rdb: rdb, asynq: enq, log: arch.Logger, inspector: asynq.NewInspectorFromRedisClient(rdb),
		fallback: opts.FallbackEvery, resend: opts.ResendAfter,
		kick: make(chan struct{}, 1),
	}
	if _, ok := enq.(*asynq.Client); ok {
		d.writer = &asynqWriter{s: sched}
	}
	if d.fallback <= 0 {
		d.fallback = time.Second
	}
	if d.resend <= 0 {
		d.resend = 5 * time.Second
	}
	d.tracer = arch.Tracer("github.com/agentq/agentq/scheduler")
	d.metrics = newDispatchMetrics(arch, sched)
	return d
}

// Start runs the dispatcher until Stop or ctx ends. It returns at once; the wake-up
// subscription and the dispatch loop run in the background.
func (d *Dispatcher) Start(ctx context.Context) error {
	ctx, shouldStart, started, stopped := d.StartInit(ctx)
	if !shouldStart {
		return nil
	}
	sub := d.rdb.Subscribe(ctx, d.sched.keys.WakeChannel())
	d.sched.runsHere(d, true)
	go func() {
		started()
		defer stopped()
		defer d.sched.runsHere(d, false)
		defer func() { _ = sub.Close() }()
		var wg sync.WaitGroup
		wg.Go(func() { // forwards wake-ups; coalesced by the 1-slot channel
			ch := sub.Channel()
			for {
				select {
				case <-ctx.Done():
					return
				case msg, ok := <-ch:
					if !ok {
						return
					}
					if due, ok := parkedDueOf(msg.Payload); ok {
						d.parkedDue(due) // parked in another process
					}
					d.Kick()
				}
			}
		})
		d.loop(ctx)
		wg.Wait()
	}()
	return nil
}

// Kick asks for a dispatch round soon (in-process wake-up).
func (d *Dispatcher) Kick() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

func (d *Dispatcher) loop(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	var resentAt time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-d.kick:
		}
		if err := d.unparkDue(ctx); err != nil && ctx.Err() == nil {
			d.log.Warn("queueing parked tasks again failed", "err", err)
		}
		// Stale entries are looked for a few times per resend delay, not in every
		// round: under load a round runs for nearly every completion.
		var err error
		if time.Since(resentAt) >= d.resend/5 {
			resentAt = time.Now()
			_, err = d.RunOnce(ctx)
		} else {
			_, err = d.dispatchAll(ctx)
		}
		if err != nil && ctx.Err() == nil {
			d.log.Warn("dispatch round failed", "err", err)
		}
		t.Reset(d.untilNextRound())
	}
}

// unparkDue queues again the parked tasks that are due, when one is known to be due
// or the parked sets were not read for parkPoll: under load a round runs for nearly
// every completion, and most rounds need not read them.
func (d *Dispatcher) unparkDue(ctx context.Context) error {
	now := time.Now()
	d.parkMu.Lock()
	noted := d.nextDue
	due := (!noted.IsZero() && !now.Before(noted)) || now.Sub(d.parkCheck) >= parkPoll
	if due {
		// The read answers for what was parked before it; a park noted while it runs
		// (parkedDue) lowers the due time from zero, and the answer only lowers it
		// further, so that no such park waits for the next poll.
		d.nextDue = time.Time{}
	}
	d.parkMu.Unlock()
	if !due {
		return nil
	}
	_, next, err := d.sched.Unpark(ctx)
	d.parkMu.Lock()
	defer d.parkMu.Unlock()
	if err != nil {
		d.lowerDue(noted)
		return err
	}
	d.parkCheck = now
	if next >= 0 {
		d.lowerDue(now.Add(next))
	}
	return nil
}

// lowerDue notes due as the next parked task's due time if none sooner is noted.
// d.parkMu must be held.
func (d *Dispatcher) lowerDue(due time.Time) {
	if !due.IsZero() && (d.nextDue.IsZero() || due.Before(d.nextDue)) {
		d.nextDue = due
	}
}

// parkedDue notes a task parked in this process, due at due.
func (d *Dispatcher) parkedDue(due time.Time) {
	d.parkMu.Lock()
	defer d.parkMu.Unlock()
	d.lowerDue(due)
}

// untilNextRound is the fallback delay, or less when a parked task is due sooner.
func (d *Dispatcher) untilNextRound() time.Duration {
	d.parkMu.Lock()
	defer d.parkMu.Unlock()
	if d.nextDue.IsZero() {
		return d.fallback
	}
	return max(min(d.fallback, time.Until(d.nextDue)), time.Millisecond)
}

// RunOnce re-sends stale "dispatching" entries, then dispatches until every shard is
// empty or every worker slot is taken. It returns the number of tasks handed to asynq.
//
// Each dispatch first takes a worker slot (one global counter, so shards share all the
// slots), then pops from the shard whose head tenant has the smallest pass: all shards
// share one virtual time, so fairness across shards holds to the same bound as within
// one.
func (d *Dispatcher) RunOnce(ctx context.Context) (int, error) {
	if err := d.resendStale(ctx); err != nil {
		return 0, err
	}
	return d.dispatchAll(ctx)
}

// dispatchBatch bounds the worker slots one step of a round takes at once: the slots
// are taken in one call and the step's tasks confirmed in one round trip, instead of
// a call of each per task.
const dispatchBatch = 16

// dispatchAll is RunOnce without the re-sends.
func (d *Dispatcher) dispatchAll(ctx context.Context) (int, error) {
	shards := d.sched.keys.Shards()
	active := make([]bool, shards)
	for i := range active {
		active[i] = true
	}
	n := 0
	defer func() { d.publishVT(context.WithoutCancel(ctx)) }()
	// Several shards: one task per step, each from the shard whose head has the
	// smallest pass, sent before the next is picked, so that fairness across shards
	// keeps its bound however the processes' rounds interleave.
	batch := dispatchBatch
	if shards > 1 {
		batch = 1
	}
	for {
		slots, err := d.sched.reserveN(ctx, batch)
		if err != nil || slots == 0 {
			return n, err // no slot: every one is taken; a completion wakes us
		}
		jobs, popErr := d.pop(ctx, active, slots)
		if unused := slots - len(jobs); unused > 0 {
			if rerr := d.sched.releaseN(ctx, unused); rerr != nil {
				d.log.Warn("releasing unused worker slots failed", "slots", unused, "err", rerr)
			}
		}
		sent, err := d.sendAll(ctx, jobs)
		n += sent
		switch {
		case err != nil:
			return n, err
		case errors.Is(popErr, errEmpty):
			return n, nil
		case popErr != nil:
			return n, popErr
		}
	}
}

// pop takes up to slots tasks in fair order: on one shard in one call of the pop
// script, on several the one task of the shard whose head has the smallest pass.
// What it popped is returned with any error, so that it is sent all the same.
func (d *Dispatcher) pop(ctx context.Context, active []bool, slots int) ([]Dispatched, error) {
	if len(active) == 1 {
		jobs, err := d.sched.dispatchMany(ctx, 0, d.globalVT(), slots)
		if errors.Is(err, errBusy) {
			err = nil // candidates moved under it: the next step goes on
		}
		return jobs, err
	}
	job, err := d.dispatchNext(ctx, active)
	if err != nil {
		return nil, err
	}
	return []Dispatched{job}, nil
}

// sendAll hands a step's tasks to asynq, then confirms those sent in one round trip.
// A task not sent or not confirmed stays in "dispatching", where resendStale finds it.
//
// With asynq's client, the tasks are written in one round trip (writeAll). With
// another Enqueuer they go at once, each call on a connection of its own, rather than
// each waiting for the one before. They are popped in fair order already, and a round
// holds at most the pool's free slots.
func (d *Dispatcher) sendAll(ctx context.Context, jobs []Dispatched) (int, error) {
	errs := make([]error, len(jobs))
	switch {
	case d.writer != nil:
		errs = d.writeAll(ctx, jobs)
	case len(jobs) == 1:
		errs[0] = d.enqueue(ctx, jobs[0])
	default:
		var wg sync.WaitGroup
		for i, job := range jobs {
			wg.Go(func() { errs[i] = d.enqueue(ctx, job) })
		}
		wg.Wait()
	}
	sent := make([]Dispatched, 0, len(jobs))
	var sendErr error
	for i, job := range jobs {
		if errs[i] != nil {
			sendErr = cmp.Or(sendErr, errs[i])
			continue
		}
		sent = append(sent, job)
	}
	if len(sent) > 0 {
		if err := d.sched.confirmAll(ctx, sent); err != nil {
			return len(sent), err
		}
	}
	return len(sent), sendErr
}

// writeAll writes a step's tasks into asynq's task queue in one round trip (see
// asynqWriter), each in its own dispatch span.
func (d *Dispatcher) writeAll(ctx context.Context, jobs []Dispatched) []error {
	ctxs := make([]context.Context, len(jobs))
	ends := make([]func(error), len(jobs))
	traced := make([]Dispatched, len(jobs))
	for i, job := range jobs {
		ctxs[i], traced[i], ends[i] = d.beginSend(ctx, job)
	}
	errs := d.writer.enqueue(ctx, traced)
	for i, job := range traced {
		errs[i] = d.afterSend(ctxs[i], job, errs[i])
		ends[i](errs[i])
	}
	return errs
}

// dispatchNext pops one task from the active shard with the smallest head pass.
func (d *Dispatcher) dispatchNext(ctx context.Context, active []bool) (Dispatched, error) {
	for {
		shard, ok, err := d.pickShard(ctx, active)
		if err != nil {
			return Dispatched{}, err
		}
		if !ok {
			return Dispatched{}, errEmpty
		}
		job, err := d.sched.dispatchOne(ctx, shard, d.globalVT())
		switch {
		case err == nil:
			return job, nil
		case errors.Is(err, errBusy):
			continue
		case errors.Is(err, errEmpty):
			active[shard] = false
		default:
			return Dispatched{}, err
		}
	}
}

func (d *Dispatcher) pickShard(ctx context.Context, active []bool) (int, bool, error) {
	if len(active) == 1 {
		return 0, active[0], nil
	}
	pipe := d.rdb.Pipeline()
	heads := make([]*redis.ZSliceCmd, len(active))
	for i, on := range active {
		if on {
			heads[i] = pipe.ZRangeWithScores(ctx, d.sched.keys.Ready(i), 0, 0)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, false, err
	}
	best, bestPass := -1, 0.0
	for i, h := range heads {
		if h == nil {
			continue
		}
		z := h.Val()
		if len(z) == 0 {
			active[i] = false
			continue
		}
		if best < 0 || z[0].Score < bestPass {
			best, bestPass = i, z[0].Score
		}
	}
	if best >= 0 {
		d.vtMu.Lock()
		d.vt = max(d.vt, bestPass)
		d.vtMu.Unlock()
	}
	return best, best >= 0, nil
}

func (d *Dispatcher) globalVT() float64 {
	d.vtMu.Lock()
	defer d.vtMu.Unlock()
	return d.vt
}

// publishVT raises every shard's virtual time to the global one, so a tenant that
// becomes backlogged on a quiet shard starts level with the others (no banked credit
// across shards either).
func (d *Dispatcher) publishVT(ctx context.Context) {
	shards := d.sched.keys.Shards()
	if shards == 1 {
		return
	}
	vt := d.globalVT()
	pipe := d.rdb.Pipeline()
	for i := range shards {
		raiseVT.Run(ctx, pipe, []string{d.sched.keys.VirtualTime(i)}, strconv.FormatFloat(vt, 'f', -1, 64), int(queueTTL.Seconds()))
	}
	_, _ = pipe.Exec(ctx)
}

// raiseVT sets a shard's virtual time to ARGV[1] if that is higher.
//
// KEYS[1] virtual time   ARGV[1] value   ARGV[2] ttl s
var raiseVT = redis.NewScript(`
if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
end
return 1
`)

// enqueue hands a popped task to asynq, in the task's trace.
func (d *Dispatcher) enqueue(ctx context.Context, job Dispatched) (err error) {
	ctx, job, end := d.beginSend(ctx, job)
	defer func() { end(err) }()
	task, err := NewAsynqTask(d.sched.keys, job)
	if err != nil {
		return err
	}
	_, err = d.asynq.EnqueueContext(ctx, task)
	return d.afterSend(ctx, job, err)
}

// beginSend starts a task's dispatch span, which continues the submission's trace
// (the worker's continues the dispatch's, through the payload); end ends it with the
// send's outcome.
func (d *Dispatcher) beginSend(ctx context.Context, job Dispatched) (context.Context, Dispatched, func(error)) {
	ctx, span := d.tracer.Start(telemetry.WithTraceParent(ctx, job.TraceParent), "agentq.dispatch",
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
			attribute.String("agentq.task_id", job.TaskID), attribute.String("agentq.tenant_id", job.TenantID),
			attribute.Int("agentq.priority", job.Priority)))
	if tp := telemetry.TraceParent(ctx); tp != "" {
		job.TraceParent = tp
	}
	return ctx, job, func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, "dispatch failed")
		} else {
			d.metrics.dispatched(ctx, job)
		}
		span.End()
	}
}

// afterSend is a send's outcome: err, unless asynq refused the task's id as a
// duplicate. Then asynq still holds a message under this id. Pending or active: it
// will run (a re-send after a crash). Archived or completed: a leftover of an earlier
// attempt that would block this one for good, so it goes and the task is sent again.
func (d *Dispatcher) afterSend(ctx context.Context, job Dispatched, err error) error {
	if isConflict(err) && d.inspector != nil {
		queue := d.sched.keys.TaskQueue()
		if info, ierr := d.inspector.GetTaskInfo(queue, job.asynqID()); ierr == nil &&
			(info.State == asynq.TaskStateArchived || info.State == asynq.TaskStateCompleted) {
			if derr := d.inspector.DeleteTask(queue, job.asynqID()); derr == nil {
				var task *asynq.Task
				if task, err = NewAsynqTask(d.sched.keys, job); err == nil {
					_, err = d.asynq.EnqueueContext(ctx, task)
				}
			}
		}
	}
	if err != nil && !isConflict(err) {
		// Left in "dispatching": resendStale retries it.
		return err
	}
	return nil
}

// staleScript lists a shard's "dispatching" entries older than the resend delay, aged
// by the clock their scores were written with (Redis TIME, or the test clock), in the
// same round trip.
//
// KEYS[1] dispatching   ARGV[1] now ms or ""   ARGV[2] resend delay ms   ARGV[3] max
var staleScript = redis.NewScript(luaNow + `
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]), 'LIMIT', 0, tonumber(ARGV[3]))
`)

func (d *Dispatcher) resendStale(ctx context.Context) error {
	for shard := range d.sched.keys.Shards() {
		members, err := staleScript.Run(ctx, d.rdb, []string{d.sched.keys.Dispatching(shard)},
			d.sched.nowArg(), d.resend.Milliseconds(), 100).StringSlice()
		if err != nil {
			return fmt.Errorf("scheduler: stale dispatching entries: %w", err)
		}
		for _, m := range members {
			job, err := parseMember(m)
			if err != nil {
				d.rdb.ZRem(ctx, d.sched.keys.Dispatching(shard), m)
				continue
			}
			d.log.Info("re-sending task left in dispatching", "task_id", job.TaskID, "tenant_id", job.TenantID)
			if _, err := d.sendAll(ctx, []Dispatched{job}); err != nil {
				return err
			}
		}
	}
	return nil
}

// DefaultEstimateMs is a tenant's estimated task cost in worker-milliseconds before
// any of its tasks finished; completions then refine it (an EWMA), and correct each
// task's charge to what it really took.
const DefaultEstimateMs = 100

// dispatchScript pops up to ARGV[7] tasks of one shard in weighted-fair order, one
// after the other as single pops would. The caller holds a worker slot for each. A
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
// or "", parks so far, ahead "1" or "0"), candidates...}: status "ok" when it popped ARGV[7] tasks, else "retry" or
// "empty" (the shard has no backlogged tenant); candidates are the heads of ready,
// then of capped, after the call.
var dispatchScript = redis.NewScript(luaNow + `
local first = 8
local want = tonumber(ARGV[7])
local slot = {}
for i = first, #ARGV do slot[ARGV[i]] = 4 + (i - first) * 3 end
local out, n = {}, 0
-- the virtual time, read at the first pop and written once, when the call answers
local vt, vtRead = nil, false
local expired = {}
local function answer(status)
  if vtRead then redis.call('SET', KEYS[4], vt, 'EX', ARGV[2]) end
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
  local running = redis.call('SCARD', run)
  if cap > 0 and running >= cap then
    -- at its running cap: wait outside the shared pool until a completion
    redis.call('ZREM', KEYS[1], tenant)
    redis.call('ZADD', KEYS[2], pass, tenant)
  else
    -- the head and the one after it: whether the queue empties with this pop
    local task = redis.call('ZRANGE', queue, 0, 1, 'WITHSCORES')
    if #task == 0 then
      -- its tasks were cancelled while it waited
      redis.call('ZREM', KEYS[1], tenant)
      redis.call('HSET', conf, 'fp', pass)
      redis.call('EXPIRE', conf, ARGV[2])
    else
      redis.call('ZREM', queue, task[1])
      local tg = redis.call('HMGET', conf, 'tp:' .. task[1], 'g:' .. task[1])
      local tp = tg[1]
      if tp then redis.call('HDEL', conf, 'tp:' .. task[1]) else tp = '' end
      redis.call('SADD', run, task[1])
      if not expired[run] then
        redis.call('EXPIRE', run, ARGV[2])
        expired[run] = true
      end
      local prio = 9 - math.floor(tonumber(task[2]) / 1e13)
      local est = math.floor(tonumber(c[3] or ARGV[3]))
      local gen = tonumber(tg[2] or '0')
      -- rkeys.DispatchingMember, with rkeys.AsynqTaskID
      local id = task[1]
      if gen > 0 then id = id .. '.' .. gen end
      redis.call('ZADD', KEYS[3], now, prio .. ':' .. est .. ':' .. tenant .. ':' .. id)
      if not vtRead then
        vt = math.max(tonumber(ARGV[4]) or 0, tonumber(redis.call('GET', KEYS[4]) or '0'))
        vtRead = true
      end
      vt = math.max(vt, pass)
      local w = tonumber(c[2] or '1')
      local finish = pass + est / w
      if #task == 2 then
        redis.call('ZREM', KEYS[1], tenant)
        redis.call('HSET', conf, 'fp', finish)
        redis.call('EXPIRE', conf, ARGV[2])
      else
        redis.call('ZADD', KEYS[1], finish, tenant)
      end
      local ahead = '0'
      if running == 0 then ahead = '1' end
      for _, v in ipairs({tenant, task[1], tostring(prio), tostring(math.floor(est)), tostring(w), tp, tostring(gen), ahead}) do
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
	// Gen is how many times the task was parked before this dispatch.
	Gen int
	// Ahead is set when its tenant had no task running when it was popped (a tenant
	// that was idle, or runs one task at a time): it goes to the head of asynq's
	// pending list, before the tasks the prefetch holds there. Those were popped
	// earlier for tenants with work in progress; behind them, an idle tenant's task
	// would wait for the prefetch to drain although the fair order put it next.
	Ahead bool
}

// asynqID is the dispatch's asynq message id.
func (d Dispatched) asynqID() string { return rkeys.AsynqTaskID(d.TaskID, d.Gen) }

// member is the task's entry in the dispatching set.
func (d Dispatched) member() string {
	return rkeys.DispatchingMember(d.Priority, d.EstimateMs, d.TenantID, d.asynqID())
}

func parseMember(m string) (Dispatched, error) {
	p, est, tenant, id, err := rkeys.ParseDispatchingMember(m)
	if err != nil {
		return Dispatched{}, fmt.Errorf("scheduler: %w", err)
	}
	task, gen, err := rkeys.ParseAsynqTaskID(id)
	if err != nil {
		return Dispatched{}, fmt.Errorf("scheduler: %w", err)
	}
	return Dispatched{Priority: p, EstimateMs: est, TenantID: tenant, TaskID: task, Gen: gen}, nil
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
// worker slot.
func (s *Scheduler) dispatchOne(ctx context.Context, shard int, globalVT float64) (Dispatched, error) {
	ds, err := s.dispatchMany(ctx, shard, globalVT, 1)
	if len(ds) == 1 {
		return ds[0], nil
	}
	return Dispatched{}, err
}

// poppedFields is how many values the dispatch script answers per popped task.
const poppedFields = 8

// dispatchMany pops up to want tasks of one shard in fair order, in one call of
// dispatchScript when its candidates are current. The caller holds a worker slot for
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
		popped := res[2 : 2+poppedFields*n]
		for i := 0; i < len(popped); i += poppedFields {
			prio, _ := strconv.Atoi(popped[i+2])
			est, _ := strconv.ParseInt(popped[i+3], 10, 64)
			w, _ := strconv.ParseFloat(popped[i+4], 64)
			gen, _ := strconv.Atoi(popped[i+6])
			out = append(out, Dispatched{TenantID: popped[i], TaskID: popped[i+1], Priority: prio, EstimateMs: est,
				Weight: int(w), TraceParent: popped[i+5], Gen: gen, Ahead: popped[i+7] == "1"})
		}
		s.setCandidates(shard, res[2+poppedFields*n:])
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

// confirmScript records that asynq holds dispatched tasks of one shard, and counts
// each among its tenant's recent starts (each tenant's trimmed once, to ARGV[2] ms and
// ARGV[3] entries).
//
// KEYS[1] dispatching   KEYS[2] inflight   then for each task i (from 0):
// KEYS[3+2i] its tenant's running set   KEYS[4+2i] its tenant's starts
// ARGV[1] now ms or ""   ARGV[2] start window ms   ARGV[3] starts kept   then for each
// task i: ARGV[4+2i] its dispatching member   ARGV[5+2i] its id
// A task that already finished (its worker was quicker than this call) is not added
// to inflight.
var confirmScript = redisx.NewScript(luaNow + `
local trim = {}
for i = 0, (#KEYS - 2) / 2 - 1 do
  local running, starts, id = KEYS[3 + 2 * i], KEYS[4 + 2 * i], ARGV[5 + 2 * i]
  redis.call('ZREM', KEYS[1], ARGV[4 + 2 * i])
  if redis.call('SISMEMBER', running, id) == 1 then
    redis.call('ZADD', KEYS[2], now, id)
  end
  redis.call('ZADD', starts, now, id)
  trim[starts] = true
end
for starts in pairs(trim) do
  redis.call('ZREMRANGEBYSCORE', starts, '-inf', '(' .. (now - tonumber(ARGV[2])))
  redis.call('ZREMRANGEBYRANK', starts, 0, -tonumber(ARGV[3]) - 1)
  redis.call('PEXPIRE', starts, ARGV[2])
end
return 1
`)

func (s *Scheduler) confirm(ctx context.Context, d Dispatched) error {
	return s.confirmAll(ctx, []Dispatched{d})
}

// confirmAll confirms a round's tasks in one round trip, shared with other calls of
// the moment, with one call of confirmScript per shard.
func (s *Scheduler) confirmAll(ctx context.Context, ds []Dispatched) error {
	type call struct {
		keys []string
		args []any
	}
	var calls []*call
	byShard := map[int]*call{}
	for _, d := range ds {
		shard := s.keys.Shard(d.TenantID)
		c := byShard[shard]
		if c == nil {
			c = &call{keys: []string{s.keys.Dispatching(shard), s.keys.Inflight(shard)},
				args: []any{s.nowArg(), startWindow.Milliseconds(), startsKept}}
			byShard[shard] = c
			calls = append(calls, c)
		}
		c.keys = append(c.keys, s.keys.TenantRunning(d.TenantID), s.keys.TenantStarts(d.TenantID))
		c.args = append(c.args, d.member(), d.TaskID)
	}
	err := s.batch.Do(ctx, func(pipe redis.Pipeliner) {
		for _, c := range calls {
			confirmScript.Run(ctx, pipe, c.keys, c.args...)
		}
	})
	if err != nil {
		return fmt.Errorf("scheduler: confirm: %w", err)
	}
	return nil
}

// NewAsynqTask builds the asynq task for a dispatched task. TaskID is the task id, so
// a re-send after a crash is refused as a duplicate instead of running twice.
func NewAsynqTask(keys rkeys.Keys, d Dispatched) (*asynq.Task, error) {
	body, err := json.Marshal(d.payload())
	if err != nil {
		return nil, err
	}
	return asynq.NewTask(wire.TaskType, body,
		asynq.TaskID(d.asynqID()),
		asynq.Queue(keys.TaskQueue()),
		asynq.MaxRetry(asynqMaxRetry),
		asynq.Timeout(asynqTimeout),
	), nil
}

// payload is what the worker is handed of a dispatched task.
func (d Dispatched) payload() wire.Payload {
	return wire.Payload{TaskID: d.TaskID, TenantID: d.TenantID, Priority: d.Priority, EstimateMs: d.EstimateMs,
		TraceParent: d.TraceParent, Gen: d.Gen}
}

// Take performs one dispatch — worker slot, fair pick within a shard, confirm — but
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
			return wire.Payload{TaskID: d.TaskID, TenantID: d.TenantID, Priority: d.Priority, EstimateMs: d.EstimateMs, Gen: d.Gen}, nil
		}
		if !errors.Is(err, errEmpty) && !errors.Is(err, errBusy) {
			_ = s.release(ctx)
			return wire.Payload{}, err
		}
	}
	_ = s.release(ctx)
	return wire.Payload{}, errEmpty
}
