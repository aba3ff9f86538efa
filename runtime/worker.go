package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/riverqueue/river/rivershared/startstop"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/telemetry"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/internal/wire"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/scheduler"
)

// Lifecycle is what the worker needs of the task lifecycle (*tasks.Lifecycle): the
// state changes it makes on a task, under the claim Start gives it, and the claim's
// heartbeat.
type Lifecycle interface {
	Start(ctx context.Context, id uuid.UUID) (store.Task, tasks.StartOutcome, error)
	RecordStep(ctx context.Context, p store.RecordStepParams) error
	// RecordLastStep records the last step and ends the task in one transaction.
	RecordLastStep(ctx context.Context, p store.RecordStepParams, fin tasks.FinishParams) (bool, error)
	Finish(ctx context.Context, p tasks.FinishParams) (bool, error)
	Requeue(ctx context.Context, c store.Claim) error
	// Park puts the task back to queued to wait for token capacity.
	Park(ctx context.Context, p tasks.ParkParams) error
	// Pause moves the task to paused at a limit (its plan's on_limit: pause).
	Pause(ctx context.Context, p tasks.PauseParams) (store.Task, error)
	Heartbeat(ctx context.Context, c store.Claim) error
	// StaleAfter is how long a running task's heartbeat must be silent before
	// another delivery may take the task over.
	StaleAfter() time.Duration
}

// Trees is what the worker needs of task trees (*tasks.Trees): record a step that
// spawns children, read a parent's children, and wake a parent whose children all
// ended while it parked.
type Trees interface {
	Spawn(ctx context.Context, p tasks.SpawnParams) (agentqtype.SpawnRecord, error)
	Children(ctx context.Context, parent uuid.UUID) (live int, children []agentqtype.ChildResult, err error)
	WakeIfDone(ctx context.Context, parent uuid.UUID)
	// Left is what a root's tree has not handed out: what the root's steps may use.
	Left(ctx context.Context, root uuid.UUID, plan quotas.TreeBudgets) (quotas.TreeBudget, tasks.TreeRemaining, error)
}

// TenantReader reads a task's tenant, for its limits (*store.Store).
type TenantReader interface {
	GetTenant(ctx context.Context, id string) (store.Tenant, error)
}

// PolicySource gives a tenant's policy: its plan with its overrides applied.
type PolicySource interface {
	Policy(t store.Tenant) (tenants.Policy, error)
}

// Slots is what the worker needs of the scheduler: release a finished task's slots and
// advertise this process's capacity.
type Slots interface {
	// Done releases a finished task's slots; along ride in its round trip, on its
	// pipe (the end's settlement, lease release and last messages).
	Done(ctx context.Context, p wire.Payload, took time.Duration, along ...func(redis.Pipeliner)) error
	// DoneAgain repeats Done once the end is recorded (see Worker.endTask); along as
	// Done's.
	DoneAgain(ctx context.Context, p wire.Payload, along ...func(redis.Pipeliner)) error
	// Park releases a parked task's slots and keeps it out of its queue until its
	// capacity is expected.
	Park(ctx context.Context, p scheduler.ParkParams) error
	// Paused releases a paused task's slots and names its next dispatch anew; the
	// lease release rides along in its round trip.
	Paused(ctx context.Context, p wire.Payload, took time.Duration, along ...func(redis.Pipeliner)) error
	Heartbeat(ctx context.Context, workerID string, concurrency int, ttl time.Duration) error
	Deregister(ctx context.Context, workerID string) error
}

// Limits is what the worker needs of the quotas package: count each step against the
// tenant's period quotas and its agent's model pool, and release a task's session
// lease when it ends. A call that takes a pipe goes in the round trip of that pipe's
// other calls (a redisx.Batch's), or alone on nil.
type Limits interface {
	// ReserveStep reserves a step; along ride in its round trip, on its pipe (the
	// "running" message before the first step).
	ReserveStep(ctx context.Context, p quotas.StepParams, along ...func(pipe redis.Pipeliner)) error
	SettleStep(ctx context.Context, pipe redis.Pipeliner, p quotas.StepParams) error
	Release(ctx context.Context, pipe redis.Pipeliner, tenantID, taskID string) (int, error)
	TouchLease(ctx context.Context, tenantID, taskID string) error
	// TryPool, ReservePool, SettlePool, GiveBackPool and ThrottlePool draw a step's
	// tokens from its agent's model pool (see quotas.PoolBinding). A try rides in the
	// round trip of the step's own reservation (ReserveStep) and takes no place in the
	// pool's line unless granted; a grant is given back when the step's own limits
	// hold it back, and a step that may run but was not granted asks (ReservePool),
	// taking its place. The try's answer is there once the pipe has run.
	TryPool(ctx context.Context, pipe redis.Pipeliner, p quotas.PoolReserveParams) func() (quotas.TokenAnswer, error)
	ReservePool(ctx context.Context, p quotas.PoolReserveParams) (quotas.TokenAnswer, error)
	SettlePool(ctx context.Context, pipe redis.Pipeliner, p quotas.PoolSettleParams) (int64, error)
	GiveBackPool(ctx context.Context, pipe redis.Pipeliner, p quotas.PoolSettleParams) (int64, error)
	ThrottlePool(ctx context.Context, p quotas.PoolThrottleParams) (quotas.PoolThrottle, error)
}

// PoolBindings says which model pool, if any, an agent's steps draw on.
type PoolBindings interface {
	Binding(ctx context.Context, agent string) (quotas.PoolBinding, bool, error)
}

// WorkerOptions configure a Worker.
type WorkerOptions struct {
	Concurrency int
	Queues      map[string]int // asynq queue name → weight
	// DrainQueues are asynq queues that tasks no longer go to but may still hold
	// messages an earlier version sent (scheduler.LegacyQueues). The worker looks at
	// them with its heartbeat and, once they hold a message, runs one more asynq
	// server, of one slot, on them; they cost the fetches of Queues nothing.
	DrainQueues       []string
	CancelChannel     string        // pub/sub channel carrying task ids to interrupt
	ShutdownTimeout   time.Duration // how long running steps may take to finish on Stop
	TaskCheckInterval time.Duration // asynq's poll interval when its queues are empty
	// Fetchers is how many asynq servers share Concurrency (at least 1, at most
	// Concurrency). An asynq server takes its tasks one at a time, each after one to
	// three Redis round trips; under load that one loop capped what the worker took
	// in, so several loops fetch side by side. Each polls empty queues Fetchers times
	// less often, so an idle worker costs Redis about what one server did.
	Fetchers int
	// Archetype is where the worker logs, traces each delivery (agentq.task) and step
	// (agentq.step), in the trace the task carries from its submission, and meters
	// (agentq.task_wait, agentq.worker_busy_ratio); nil: the defaults.
	Archetype *baseservice.Archetype
	// Policies gives a tenant's limits, for the step-time quota checks
	// (tenants.Service or tenants.Policies); nil checks none.
	Policies PolicySource
	// Pools says which model pool each agent draws on; nil: no agent draws on one.
	Pools PoolBindings
	// Events names the pub/sub channel of a task's progress stream; nil publishes none.
	Events func(taskID string) string
	// Batch carries the progress messages, a step's settlements and a finished
	// task's Redis calls, shared with the other workers' calls of the same moment;
	// nil makes one on the worker's client. The App gives the one its Scheduler and
	// Quotas use.
	Batch *redisx.Batch
	// Trees makes the children steps spawn and reads them back for their parents;
	// nil: a step that spawns or waits for children fails its task.
	Trees Trees
}

// Worker runs agent tasks handed out by asynq. Stop withdraws it and lets running
// steps finish up to the configured ShutdownTimeout.
type Worker struct {
	startstop.BaseStartStop

	id        string
	lifecycle Lifecycle
	tenants   TenantReader
	agents    *Registry
	slots     Slots
	limits    Limits
	rdb       redis.UniversalClient // asynq and pub/sub
	batch     *redisx.Batch
	opts      WorkerOptions
	log       *slog.Logger

	tracer trace.Tracer
	wait   metric.Float64Histogram
	// capWait and throttled meter waits for token capacity and throttled steps.
	capWait    metric.Float64Histogram
	throttled  metric.Int64Counter
	poolTokens metric.Int64Counter
	// stepParks meters the times each step that ran parked before it ran.
	stepParks metric.Int64Histogram
	// poolTenants bounds the tenant_id label of agentq.pool_tokens.
	poolTenants tenantLabels

	// est holds the running average of each (tenant, agent)'s step tokens: a
	// step's estimate when its agent gave none.
	est *tokenAverages

	mu      sync.Mutex
	running map[uuid.UUID]context.CancelCauseFunc
	busy    int // deliveries being processed

	// A task's terminal write is made after its delivery released its dispatch
	// slots (see ProcessTask). ends holds one token per end still being recorded:
	// at most Concurrency, beyond which deliveries wait. endCtx bounds their retries;
	// a shutdown that outlasts them cancels it.
	ends    chan struct{}
	endCtx  context.Context
	endStop context.CancelFunc

	warm *warmGoroutines // run the deliveries and the ends

	// drainSrv is the asynq server of DrainQueues, once they held a message; stopping
	// keeps it from starting while the worker stops.
	drainMu  sync.Mutex
	drainSrv *asynq.Server
	stopping bool
}

// errCancelled is the cause recorded when a tenant cancels a running task.
var errCancelled = errors.New("task cancelled")

// NewWorker returns a stopped worker.
func NewWorker(lc Lifecycle, tr TenantReader, agents *Registry, slots Slots, limits Limits, rdb redis.UniversalClient, opts WorkerOptions) *Worker {
	if opts.Concurrency < 1 {
		opts.Concurrency = 1
	}
	arch := opts.Archetype.Defaults()
	if opts.Batch == nil {
		opts.Batch = redisx.NewBatch(rdb, 0)
	}
	host, _ := os.Hostname()
	w := &Worker{
		id:        fmt.Sprintf("%s-%d-%s", host, os.Getpid(), uuid.NewString()[:8]),
		lifecycle: lc,
		tenants:   tr,
		agents:    agents,
		slots:     slots,
		limits:    limits,
		rdb:       rdb,
		batch:     opts.Batch,
		opts:      opts,
		log:       arch.Logger,
		running:   map[uuid.UUID]context.CancelCauseFunc{},
		ends:      make(chan struct{}, opts.Concurrency),
		warm:      newWarmGoroutines(warmIdle),
		est:       newTokenAverages(),
	}
	w.endCtx, w.endStop = context.WithCancel(context.Background())
	w.tracer = arch.Tracer("github.com/agentq/agentq/runtime")
	w.instrument(arch.MeterProvider)
	return w
}

// instrument creates the worker's instruments.
func (w *Worker) instrument(mp metric.MeterProvider) {
	meter := mp.Meter("github.com/agentq/agentq/runtime")
	w.wait, _ = meter.Float64Histogram("agentq.task_wait", metric.WithUnit("s"),
		metric.WithDescription("Time from a task's admission to its first start on a worker"),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600))
	w.capWait, _ = meter.Float64Histogram("agentq.capacity_wait", metric.WithUnit("s"),
		metric.WithDescription("Time a step waits, parked without a worker, for token capacity, by what it waits for (tokens_per_minute, pool:<name>, throttled:<pool>, throttled)"),
		metric.WithExplicitBucketBoundaries(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
	w.throttled, _ = meter.Int64Counter("agentq.throttled_steps",
		metric.WithDescription("Steps an agent answered throttled (its upstream refused them), by pool"))
	w.poolTokens, _ = meter.Int64Counter("agentq.pool_tokens", metric.WithUnit("{token}"),
		metric.WithDescription("Tokens the steps of each tenant used from each model pool"))
	w.stepParks, _ = meter.Int64Histogram("agentq.step_parks", metric.WithUnit("{park}"),
		metric.WithDescription("Times a step parked (sent back to wait for token capacity) before it ran, by the agent's pool"),
		metric.WithExplicitBucketBoundaries(0, 1, 2, 3, 5, 10, 20, 50, 100))
	busy, _ := meter.Float64ObservableGauge("agentq.worker_busy_ratio", metric.WithUnit("1"),
		metric.WithDescription("The share of this worker's concurrency slots processing a task"))
	_, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		w.mu.Lock()
		n := w.busy
		w.mu.Unlock()
		o.ObserveFloat64(busy, float64(n)/float64(w.opts.Concurrency))
		return nil
	}, busy)
	if err != nil {
		w.log.Warn("registering the worker's gauge failed", "err", err)
	}
}

// ID is this worker's registration id.
func (w *Worker) ID() string { return w.id }

// warmIdle is how long a warm goroutine waits for more work before it ends.
const warmIdle = 2 * time.Second

const heartbeatEvery, heartbeatTTL = 2 * time.Second, 10 * time.Second

// taskHeartbeatEvery is how often a running task's heartbeat is stamped in Postgres:
// well within the silence after which a redelivery takes the task over
// (tasks.DefaultStaleAfter).
const taskHeartbeatEvery = 5 * time.Second

// fetcherShares splits a worker's concurrency over its asynq servers: at most
// fetchers of them (at least one), each with at least one slot, their slots adding
// up to concurrency.
func fetcherShares(concurrency, fetchers int) []int {
	n := min(max(fetchers, 1), max(concurrency, 1))
	out := make([]int, n)
	for i := range out {
		out[i] = concurrency / n
		if i < concurrency%n {
			out[i]++
		}
	}
	return out
}

// drainCheckInterval is how often the server of DrainQueues polls them while they
// are empty.
const drainCheckInterval = time.Second

// asynqConfig configures one of the worker's asynq servers.
func (w *Worker) asynqConfig(concurrency int, queues map[string]int, checkEvery time.Duration) asynq.Config {
	return asynq.Config{
		Concurrency:       concurrency,
		Queues:            queues,
		ShutdownTimeout:   w.opts.ShutdownTimeout,
		TaskCheckInterval: checkEvery,
		Logger:            asynqLogger{w.log},
		LogLevel:          asynq.WarnLevel,
		// Task errors are infrastructure errors (Postgres down); asynq retries them.
		RetryDelayFunc: func(n int, _ error, _ *asynq.Task) time.Duration {
			return time.Duration(math.Min(float64(time.Second)*math.Pow(2, float64(n)), float64(time.Minute)))
		},
	}
}

// Start registers the worker's capacity and starts processing, until Stop. It
// returns once asynq's server runs.
func (w *Worker) Start(ctx context.Context) error {
	ctx, shouldStart, started, stopped := w.StartInit(ctx)
	if !shouldStart {
		return nil
	}
	if err := w.slots.Heartbeat(ctx, w.id, w.opts.Concurrency, heartbeatTTL); err != nil {
		stopped()
		return err
	}
	mux := asynq.NewServeMux()
	mux.HandleFunc(wire.TaskType, w.ProcessTask)
	shares := fetcherShares(w.opts.Concurrency, w.opts.Fetchers)
	var servers []*asynq.Server
	for _, n := range shares {
		srv := asynq.NewServerFromRedisClient(w.rdb, w.asynqConfig(n, w.opts.Queues, w.opts.TaskCheckInterval*time.Duration(len(shares))))
		if err := srv.Start(mux); err != nil {
			for _, s := range servers {
				s.Shutdown()
			}
			stopped()
			return fmt.Errorf("runtime: start asynq server: %w", err)
		}
		servers = append(servers, srv)
	}
	w.drainMu.Lock()
	w.stopping = false
	w.drainMu.Unlock()
	sub := w.rdb.Subscribe(ctx, w.opts.CancelChannel)
	go func() {
		started()
		defer stopped()
		var bg sync.WaitGroup
		bg.Go(func() {
			defer sub.Close()
			for {
				select {
				case <-ctx.Done():
					return
				case m, ok := <-sub.Channel():
					if !ok {
						return
					}
					if id, err := uuid.Parse(m.Payload); err == nil {
						w.interrupt(id)
					}
				}
			}
		})
		bg.Go(func() {
			t := time.NewTicker(heartbeatEvery)
			defer t.Stop()
			w.startDrain(ctx, mux)
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if err := w.slots.Heartbeat(ctx, w.id, w.opts.Concurrency, heartbeatTTL); err != nil && ctx.Err() == nil {
						w.log.Warn("worker heartbeat failed", "err", err)
					}
					w.startDrain(ctx, mux)
				}
			}
		})
		<-ctx.Done()
		w.drain(servers)
		bg.Wait()
	}()
	return nil
}

// startDrain starts the asynq server of DrainQueues once they hold a message (pending,
// running, or waiting for a retry or a schedule); it runs until the worker stops. They
// are looked at with the worker's heartbeat, so an idle worker polls them only then.
func (w *Worker) startDrain(ctx context.Context, mux *asynq.ServeMux) {
	if len(w.opts.DrainQueues) == 0 {
		return
	}
	w.drainMu.Lock()
	defer w.drainMu.Unlock()
	if w.stopping || w.drainSrv != nil {
		return
	}
	pipe := w.rdb.Pipeline()
	held := make([]*redis.IntCmd, len(w.opts.DrainQueues))
	for i, q := range w.opts.DrainQueues {
		k := "asynq:{" + q + "}:"
		held[i] = pipe.Exists(ctx, k+"pending", k+"active", k+"scheduled", k+"retry")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return // the next heartbeat looks again
	}
	if !slices.ContainsFunc(held, func(c *redis.IntCmd) bool { return c.Val() > 0 }) {
		return
	}
	queues := map[string]int{}
	for _, q := range w.opts.DrainQueues {
		queues[q] = 1
	}
	srv := asynq.NewServerFromRedisClient(w.rdb, w.asynqConfig(1, queues, drainCheckInterval))
	if err := srv.Start(mux); err != nil {
		w.log.Warn("starting the asynq server of the former priority queues failed", "err", err)
		return
	}
	w.drainSrv = srv
}

// drain stops taking tasks, withdraws the worker's capacity and lets running steps
// finish up to ShutdownTimeout: asynq's Shutdown waits for its handlers that long,
// then cancels them and requeues their tasks.
func (w *Worker) drain(servers []*asynq.Server) {
	// Running steps get ShutdownTimeout (asynq's Shutdown); the ends handed off by
	// deliveries get what is left of it and 2 s more.
	flushBy := time.Now().Add(w.opts.ShutdownTimeout + 2*time.Second)
	w.drainMu.Lock()
	w.stopping = true
	if w.drainSrv != nil {
		servers = append(slices.Clip(servers), w.drainSrv)
		w.drainSrv = nil
	}
	w.drainMu.Unlock()
	// No new tasks. Each server's Stop waits out its fetch loop's pause after an
	// empty poll: they wait side by side.
	var stop sync.WaitGroup
	for _, srv := range servers {
		stop.Go(srv.Stop)
	}
	stop.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := w.slots.Deregister(ctx, w.id); err != nil {
		w.log.Warn("worker deregister failed", "err", err)
	}
	var shut sync.WaitGroup
	for _, srv := range servers {
		shut.Go(srv.Shutdown)
	}
	shut.Wait()
	// The ends handed off by the deliveries: their results are only in this process.
	fctx, fcancel := context.WithDeadline(context.Background(), flushBy)
	defer fcancel()
	if err := w.Flush(fctx); err != nil {
		w.log.Warn("task ends not recorded by the shutdown timeout; the janitor re-runs those tasks from their last recorded step",
			"tasks", len(w.ends))
		w.mu.Lock()
		w.endStop() // their retries stop; a write under way still ends within its timeout
		w.endCtx, w.endStop = context.WithCancel(context.Background())
		w.mu.Unlock()
	}
}

// Flush waits until every task end handed off by a delivery is recorded and its
// Redis calls made, or ctx ends.
func (w *Worker) Flush(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for len(w.ends) > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("runtime: %d task ends still being recorded: %w", len(w.ends), ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// Interrupt cancels a task running in this process, if any (tests and in-process
// callers; other replicas learn of cancels through the cancel channel).
func (w *Worker) interrupt(id uuid.UUID) {
	w.mu.Lock()
	cancel := w.running[id]
	w.mu.Unlock()
	if cancel != nil {
		cancel(errCancelled)
	}
}

// ProcessTask is the asynq handler: it runs one task to a terminal state, on one of
// the worker's warm goroutines.
func (w *Worker) ProcessTask(ctx context.Context, t *asynq.Task) (err error) {
	w.warm.Run(func() { err = w.processTask(ctx, t) })
	return err
}

// processTask decodes a delivery and runs it, as a taskRun, in the delivery's span.
func (w *Worker) processTask(ctx context.Context, t *asynq.Task) (err error) {
	r := &taskRun{w: w, began: time.Now()}
	w.mu.Lock()
	w.busy++
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.busy--
		w.mu.Unlock()
	}()
	if err := json.Unmarshal(t.Payload(), &r.p); err != nil {
		return fmt.Errorf("runtime: bad payload: %v: %w", err, asynq.SkipRetry)
	}
	p := r.p
	id, err := uuid.Parse(p.TaskID)
	if err != nil {
		return fmt.Errorf("runtime: bad task id %q: %w", p.TaskID, asynq.SkipRetry)
	}
	// The delivery's span continues the trace the task carries: submission, then
	// dispatch, then this.
	ctx, span := w.tracer.Start(telemetry.WithTraceParent(ctx, p.TraceParent), "agentq.task", consumerSpan)
	if span.IsRecording() { // attributes built for a dropped span are allocations thrown away
		span.SetAttributes(attribute.String("agentq.task_id", p.TaskID), attribute.String("agentq.tenant_id", p.TenantID))
	}
	defer func() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, "task delivery failed")
		}
		span.End()
	}()
	r.ctx = ctx
	return r.execute(id)
}

// consumerSpan is the span kind of a delivery's span (one option value, built once).
var consumerSpan = trace.WithSpanKind(trace.SpanKindConsumer)

// endTask records a task's end in the background, then sends the end's Redis calls
// with a second release of its dispatch slots. That release is a look at the running
// set that normally finds nothing (the script runs only when it finds the task): it is
// there for a janitor pass that saw the task running in Postgres, missing from its
// tenant's running set (released above), and put it back before the end was recorded.
// The janitor re-checks Postgres after it puts an entry back, so one of the two always
// sees the end. It blocks while Concurrency ends are already being recorded.
func (w *Worker) endTask(ctx context.Context, r *taskRun) {
	p := r.p
	w.ends <- struct{}{}
	w.mu.Lock()
	endCtx := w.endCtx
	w.mu.Unlock()
	ctx = trace.ContextWithSpanContext(endCtx, trace.SpanContextFromContext(ctx))
	w.warm.Go(func() {
		defer func() { <-w.ends }()
		defer func() {
			if r := recover(); r != nil {
				w.log.Error("recording a task's end panicked; the janitor re-runs the task", "task_id", p.TaskID, "panic", r)
			}
		}()
		if tail, lost := r.recordEnd(ctx); !lost {
			w.releaseAgain(p, tail...)
		}
	})
}

// park parks a delivery's task in Redis once Postgres holds it as queued: its slots
// go back (its tenant is charged took of worker time) and it waits out of its queue
// until its capacity is expected. Its session lease stays: the task is live.
func (w *Worker) park(r *taskRun, took time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := w.slots.Park(ctx, scheduler.ParkParams{Payload: r.p, Took: took, Wait: max(time.Until(r.parked), 0),
		Priority: r.task.Priority, CreatedAt: r.task.CreatedAt})
	if err != nil {
		// Queued in Postgres, still in its tenant's running set: the janitor takes
		// it out and the recovery sweep queues it again.
		w.log.Error("parking a task in Redis failed; the janitor queues it again", "task_id", r.p.TaskID, "err", err)
	}
	if r.waitsChildren {
		// Its last child may have ended before the park reached Redis.
		w.opts.Trees.WakeIfDone(ctx, r.task.ID)
	}
}

// queueReleaseLease queues the release of a task's session lease.
func (w *Worker) queueReleaseLease(tenantID, taskID string) func(redis.Pipeliner) {
	return func(pipe redis.Pipeliner) { _, _ = w.limits.Release(context.Background(), pipe, tenantID, taskID) }
}

// release frees a delivery's dispatch slots (took < 0: charge no worker time). tail
// are other Redis calls to make with it (an end's last settlement, lease release and
// last progress messages): they go in the same round trip, shared with other workers'
// calls of the moment.
func (w *Worker) release(p wire.Payload, took time.Duration, tail ...func(redis.Pipeliner)) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.slots.Done(ctx, p, took, tail...); err != nil {
		// The janitor repairs the slots, the settlement and the lease (which also
		// lapses with its TTL); a lost progress message is re-read from Postgres.
		w.log.Error("releasing a task's slots, or its settlement, lease release or last message, failed", "task_id", p.TaskID, "err", err)
	}
}

// releaseAgain is release repeated once a task's end is recorded (see endTask), with
// the end's calls.
func (w *Worker) releaseAgain(p wire.Payload, tail ...func(redis.Pipeliner)) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.slots.DoneAgain(ctx, p, tail...); err != nil {
		w.log.Error("releasing a task's slots, or its settlement, lease release or last message, failed", "task_id", p.TaskID, "err", err)
	}
}

// Event is one message of a task's progress stream (GET /v1/tasks/{id}/events).
type Event = wire.Progress

// publish sends progress messages, in one round trip when there are several.
func (w *Worker) publish(ctx context.Context, evs ...Event) {
	if w.opts.Events == nil || len(evs) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	// Progress messages are best effort: the stream re-reads Postgres for state.
	_ = w.batch.Do(ctx, w.queuePublish(ctx, evs...))
}

// queuePublish queues progress messages on a pipe.
func (w *Worker) queuePublish(ctx context.Context, evs ...Event) func(redis.Pipeliner) {
	now := time.Now().UTC()
	return func(pipe redis.Pipeliner) {
		if w.opts.Events == nil {
			return
		}
		for _, ev := range evs {
			ev.Time = now
			pipe.Publish(ctx, w.opts.Events(ev.TaskID), ev.Encode())
		}
	}
}

// Bounds on what one step may report. A step beyond them is refused rather than
// billed: it is far past any model's output, and the micro-dollar total must stay far
// from the int64 range.
const (
	MaxStepTokens  = 100_000_000
	MaxStepCostUSD = 100_000.0
)

// checkUsage refuses a step's usage that is negative, non-finite or above the per-step
// bounds; the error names the field and what was wrong.
func checkUsage(u StepUsage) error {
	switch {
	case u.Tokens < 0:
		return fmt.Errorf("usage.tokens %d is negative", u.Tokens)
	case u.Tokens > MaxStepTokens:
		return fmt.Errorf("usage.tokens %d is above the per-step bound of %d", u.Tokens, MaxStepTokens)
	case math.IsNaN(u.CostUSD) || math.IsInf(u.CostUSD, 0):
		return fmt.Errorf("usage.cost_usd %v is not a finite number", u.CostUSD)
	case u.CostUSD < 0:
		return fmt.Errorf("usage.cost_usd %g is negative", u.CostUSD)
	case u.CostUSD > MaxStepCostUSD:
		return fmt.Errorf("usage.cost_usd %g is above the per-step bound of %g", u.CostUSD, MaxStepCostUSD)
	}
	return nil
}

// taskBudget reads a task's stored budget. Admission stores all three fields; a field
// missing or not above 0 (a task stored by an earlier version, where 0 meant no cap)
// takes the plan's default, or without a plan the long-running threshold for the wall
// clock and no other cap beyond the tenant's quotas.
func taskBudget(raw json.RawMessage, plan *quotas.Budget) quotas.TaskBudget {
	var b quotas.TaskBudget
	_ = json.Unmarshal(raw, &b)
	if plan != nil {
		return plan.Fill(b)
	}
	if !(b.MaxWallclockS > 0) {
		b.MaxWallclockS = quotas.LongRunningThreshold.Seconds()
	}
	return b
}

// holdFor bounds how long a worker retries a Postgres read or write (a finished step's
// result, the terminal state, the task's tenant) while Postgres is unreachable before
// it gives the task up (the janitor then re-runs it from its last recorded step).
const holdFor = 2 * time.Minute

// holdUntilRecorded runs write until it succeeds, retrying with backoff for up to
// holdFor: a Postgres restart must not turn a finished step into a failed task.
func holdUntilRecorded(ctx context.Context, log *slog.Logger, write func(context.Context) error) error {
	deadline := time.Now().Add(holdFor)
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := write(wctx)
		cancel()
		if err == nil || errors.Is(err, agentqtype.ErrNotFound) || errors.Is(err, store.ErrLostClaim) ||
			errors.Is(err, store.ErrTaskEnded) || time.Now().Add(wait).After(deadline) {
			return err
		}
		if attempt == 1 {
			log.Warn("Postgres write failed; holding the result and retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// asynqLogger routes asynq's logs to slog.
type asynqLogger struct{ l *slog.Logger }

func (a asynqLogger) Debug(args ...any) { a.l.Debug(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Info(args ...any)  { a.l.Info(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Warn(args ...any)  { a.l.Warn(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Error(args ...any) { a.l.Error(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Fatal(args ...any) {
	a.l.Error(fmt.Sprint(args...), "component", "asynq")
	os.Exit(1)
}
