// Package bench holds the benchmarks behind `agentq bench`: they run on real Redis
// (and, end to end through the library, on real Postgres) and report what they
// measured.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/pg"
	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/migrations"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/scheduler"
)

// Fairness is the result of `agentq bench fairness` (the fair scheduler's benchmark).
type Fairness struct {
	LightP99WaitMs            float64            `json:"light_p99_wait_ms"`
	LightP50WaitMs            float64            `json:"light_p50_wait_ms"`
	LightP99WaitUncontendedMs float64            `json:"light_p99_wait_uncontended_ms"`
	FIFOLightP99WaitMs        float64            `json:"fifo_light_p99_wait_ms"`
	LightTasks                int                `json:"light_tasks"`
	HeavyTasksRunDuringLight  int                `json:"heavy_tasks_run_during_light"`
	WeightedShares            map[string]float64 `json:"weighted_shares"`
	WeightedShareMaxError     float64            `json:"weighted_share_max_error"`
	JainIndex                 float64            `json:"jain_index"`
	WeightedShares16          map[string]float64 `json:"weighted_shares_16_shards"`
	WeightedShareMaxError16   float64            `json:"weighted_share_max_error_16_shards"`
	JainIndex16               float64            `json:"jain_index_16_shards"`
	ShallowShares             map[string]float64 `json:"shallow_shares"`
	ShallowShareMaxError      float64            `json:"shallow_share_max_error"`
	ShallowDispatches         int                `json:"shallow_dispatches"`
	DispatchUsPerTask10       float64            `json:"dispatch_us_per_task_10_tenants"`
	DispatchUsPerTask10k      float64            `json:"dispatch_us_per_task_10k_tenants"`
	RedisBytesPerQueuedTask   float64            `json:"redis_bytes_per_queued_task"`
	RedisBytesPerIdleTenant   float64            `json:"redis_bytes_per_idle_tenant"`
	IdleRedisOpsPerS          float64            `json:"idle_redis_ops_per_s"`
	WorkerConcurrency         int                `json:"worker_concurrency"`
	LightDurationS            float64            `json:"light_duration_s"`
}

// FairnessOptions configure the benchmark.
type FairnessOptions struct {
	DatabaseURL string
	RedisURL    string
	Concurrency int           // worker concurrency; 20 by default
	Light       time.Duration // how long light tenants submit; 20 s by default
	HeavyTasks  int           // the heavy tenant's backlog; 10,000 by default
	Shallow     time.Duration // each weight setting of the shallow-queue scenario; 12 s
	WeightTasks int           // per tenant; 2,000 by default
	Progress    io.Writer
}

type fairBench struct {
	o    FairnessOptions
	log  func(string, ...any)
	rdb  *redis.Client
	pool *pgxpool.Pool
}

// RunFairness runs every scenario of `agentq bench fairness` on real Redis and
// Postgres, through the real scheduler, asynq workers and the sim agent. Each scenario
// gets its own Postgres schema and Redis prefix, dropped at the end.
func RunFairness(ctx context.Context, o FairnessOptions) (Fairness, error) {
	if o.Concurrency <= 0 {
		o.Concurrency = 20
	}
	if o.Light <= 0 {
		o.Light = 20 * time.Second
	}
	if o.HeavyTasks <= 0 {
		o.HeavyTasks = 10000
	}
	if o.WeightTasks <= 0 {
		o.WeightTasks = 2000
	}
	if o.Shallow <= 0 {
		o.Shallow = 12 * time.Second
	}
	b := &fairBench{o: o, log: func(f string, a ...any) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, f+"\n", a...)
		}
	}}
	ropt, err := redis.ParseURL(o.RedisURL)
	if err != nil {
		return Fairness{}, err
	}
	ropt.PoolSize = 128
	b.rdb = redis.NewClient(ropt)
	defer b.rdb.Close()
	if b.pool, err = pg.Connect(ctx, o.DatabaseURL, ""); err != nil {
		return Fairness{}, err
	}
	defer b.pool.Close()

	out := Fairness{WorkerConcurrency: o.Concurrency, LightDurationS: o.Light.Seconds()}
	b.log("noisy neighbour: %d heavy tasks of 20 ms, 9 light tenants every 200 ms for %v…", o.HeavyTasks, o.Light)
	if err := b.noisy(ctx, &out, true); err != nil {
		return out, fmt.Errorf("noisy neighbour: %w", err)
	}
	b.log("the same light traffic alone…")
	if err := b.noisy(ctx, &out, false); err != nil {
		return out, fmt.Errorf("uncontended: %w", err)
	}
	b.log("the same mixed traffic through one plain asynq queue (FIFO)…")
	if out.FIFOLightP99WaitMs, err = b.fifo(ctx); err != nil {
		return out, fmt.Errorf("fifo: %w", err)
	}
	b.log("weights 1, 2, 4 with %d tasks each of 10, 40, 20 ms…", o.WeightTasks)
	if out.WeightedShares, out.WeightedShareMaxError, out.JainIndex, err = b.weights(ctx, 1); err != nil {
		return out, fmt.Errorf("weights: %w", err)
	}
	b.log("the same with 16 shards…")
	if out.WeightedShares16, out.WeightedShareMaxError16, out.JainIndex16, err = b.weights(ctx, 16); err != nil {
		return out, fmt.Errorf("weights, 16 shards: %w", err)
	}
	b.log("a shallow-queue tenant (one task queued at every dispatch) against a backlogged one, weights 1:1 and 1:2, %v each…", o.Shallow)
	out.ShallowShares = map[string]float64{}
	for _, deepWeight := range []int{1, 2} {
		share, want, n, err := b.shallow(ctx, deepWeight)
		if err != nil {
			return out, fmt.Errorf("shallow queue, weights 1:%d: %w", deepWeight, err)
		}
		out.ShallowShares[fmt.Sprintf("1:%d", deepWeight)] = math.Round(share*1000) / 1000
		out.ShallowShareMaxError = math.Max(out.ShallowShareMaxError, math.Round(math.Abs(share-want)*1000)/1000)
		out.ShallowDispatches += n
	}
	b.log("dispatch cost with 10 and 10,000 backlogged tenants; memory…")
	if err := b.scale(ctx, &out); err != nil {
		return out, fmt.Errorf("scale: %w", err)
	}
	return out, nil
}

// benchEnv is one scenario's schema, Redis prefix and running agentq process. The
// process runs the worker role; the benchmark dispatches itself, over the same Redis
// and Postgres, so that it can hold dispatch off while it seeds a backlog.
type benchEnv struct {
	mu         sync.Mutex
	admitted   map[uuid.UUID]time.Time // single submissions: when the push returned
	app        *agentq.App
	store      *store.Store
	sched      *scheduler.Scheduler
	dispatcher *scheduler.Dispatcher
	pool       *pgxpool.Pool
	keys       rkeys.Keys
	schema     string
	b          *fairBench
}

func (b *fairBench) start(ctx context.Context, shards int) (*benchEnv, error) {
	id := strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	e := &benchEnv{schema: "bench_" + id, b: b, admitted: map[uuid.UUID]time.Time{}}
	if _, err := b.pool.Exec(ctx, "CREATE SCHEMA "+e.schema); err != nil {
		return nil, err
	}
	pool, err := pg.Connect(ctx, b.o.DatabaseURL, e.schema)
	if err != nil {
		return nil, err
	}
	e.pool = pool
	if _, err := migrations.Up(ctx, pool); err != nil {
		return nil, err
	}
	cfg := agentq.DefaultConfig()
	cfg.Roles = []string{agentq.RoleWorker}
	cfg.HTTPAddr = "127.0.0.1:0" // its health and metrics listener: never a port in use
	cfg.RedisPrefix = "bench" + id + ":"
	cfg.Shards = shards
	cfg.WorkerConcurrency = b.o.Concurrency
	cfg.ShutdownTimeout = 2 * time.Second
	// A worker without the api role needs where its approval links point and the
	// secret that signs them; the bench's tasks never pause and no API serves links.
	cfg.PublicURL, cfg.PanelSecret = "http://bench.invalid", "bench-"+id
	e.keys = rkeys.New(cfg.RedisPrefix, shards)
	e.store = store.New(pool)
	// The product's defaults (prefetch, dispatch timer, asynq's check interval) except
	// the worker count, and the dispatcher the scheduler role would run.
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e.sched = scheduler.New(b.rdb, e.keys, scheduler.Options{Prefetch: cfg.Prefetch, WakeInProcess: true})
	e.dispatcher = scheduler.NewDispatcher(e.sched, b.rdb, asynq.NewClientFromRedisClient(b.rdb), scheduler.DispatcherOptions{Archetype: &baseservice.Archetype{Logger: quiet}})
	app, err := agentq.New(ctx, agentq.Options{Config: cfg, Redis: b.rdb, Pool: pool, Logger: quiet})
	if err != nil {
		return nil, err
	}
	e.app = app
	if err := app.Start(ctx); err != nil {
		return nil, err
	}
	// After the worker, as the scheduler role's services start after the worker role's.
	if err := e.dispatcher.Start(context.WithoutCancel(ctx)); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *benchEnv) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if e.dispatcher != nil {
		e.dispatcher.Stop() // before the worker, as an App stops its roles
	}
	if e.app != nil {
		_ = e.app.Shutdown(ctx)
	}
	if e.pool != nil {
		e.pool.Close()
	}
	_, _ = e.b.pool.Exec(ctx, "DROP SCHEMA "+e.schema+" CASCADE")
	for _, p := range []string{e.keys.Prefix(), e.keys.AsynqKeyPrefix()} {
		redisx.DeletePrefix(ctx, e.b.rdb, p)
	}
}

func (e *benchEnv) tenant(ctx context.Context, id string, weight, running int) error {
	w := weight
	_, err := e.store.CreateTenant(ctx, store.CreateTenantParams{ID: id, Name: id, Plan: "enterprise", Weight: &w,
		Overrides: map[string]quotas.Limit{"running": quotas.Limit(running)}})
	return err
}

// submit writes tasks of stepMs each to Postgres in one COPY and pushes them to the
// tenant's queue, as an admission would. It records when each was admitted: when the
// push returned, the moment an API would answer 202.
func (e *benchEnv) submit(ctx context.Context, tenant string, weight, running, n, stepMs int) error {
	input := json.RawMessage(fmt.Sprintf(`{"steps":1,"step_ms":%d}`, stepMs))
	ps := make([]store.InsertTaskParams, n)
	for i := range ps {
		ps[i] = store.InsertTaskParams{ID: uuid.Must(uuid.NewV7()), TenantID: tenant, Kid: "bench", Agent: "sim",
			Input: input, Budget: json.RawMessage(`{}`), Priority: scheduler.DefaultPriority, RequestHash: []byte{0}}
	}
	if n == 1 {
		if _, _, err := e.store.InsertTask(ctx, ps[0]); err != nil {
			return err
		}
	} else if _, err := e.store.BulkInsertQueued(ctx, ps); err != nil {
		return err
	}
	now := time.Now()
	for i, p := range ps {
		err := e.sched.Enqueue(ctx, scheduler.EnqueueParams{TenantID: tenant, TaskID: p.ID,
			Priority: p.Priority, CreatedAt: now.Add(time.Duration(i) * time.Microsecond), Weight: weight, RunningCap: running})
		if err != nil {
			return err
		}
	}
	if n == 1 {
		e.mu.Lock()
		e.admitted[ps[0].ID] = time.Now()
		e.mu.Unlock()
	}
	return nil
}

var lightTenants = func() []string {
	var out []string
	for i := range 9 {
		out = append(out, fmt.Sprintf("light%d", i))
	}
	return out
}()

// poisson calls submit for each light tenant at exponentially distributed intervals
// (mean 200 ms) until d has passed.
func poisson(ctx context.Context, d time.Duration, submit func(tenant string) error) error {
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	errs := make(chan error, len(lightTenants))
	for i, t := range lightTenants {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i)+1, 42))
			for {
				time.Sleep(time.Duration(r.ExpFloat64() * float64(200*time.Millisecond)))
				if time.Now().After(end) || ctx.Err() != nil {
					return
				}
				if err := submit(t); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(math.Ceil(p*float64(len(s))))-1)]
}

// noisy runs the light traffic with (contended) or without the heavy backlog.
func (b *fairBench) noisy(ctx context.Context, out *Fairness, contended bool) error {
	e, err := b.start(ctx, 1)
	if err != nil {
		return err
	}
	defer e.close()
	for _, t := range lightTenants {
		if err := e.tenant(ctx, t, 1, 20); err != nil {
			return err
		}
	}
	if !contended {
		// An idle system first: what does it cost Redis to wait for work?
		before, _ := totalCommands(ctx, b.rdb)
		time.Sleep(3 * time.Second)
		after, _ := totalCommands(ctx, b.rdb)
		out.IdleRedisOpsPerS = math.Round(float64(after-before) / 3)
	}
	if contended {
		if err := e.tenant(ctx, "heavy", 1, b.o.Concurrency); err != nil {
			return err
		}
		if err := e.submit(ctx, "heavy", 1, b.o.Concurrency, b.o.HeavyTasks, 20); err != nil {
			return err
		}
		time.Sleep(time.Second) // let the heavy backlog fill the pool
	}
	lightStart := time.Now()
	if err := poisson(ctx, b.o.Light, func(t string) error { return e.submit(ctx, t, 1, 20, 1, 20) }); err != nil {
		return err
	}
	// wait for the light tasks to finish
	deadline := time.Now().Add(60 * time.Second)
	var waits []float64
	heavyRan := 0
	for {
		ts, err := e.store.UnscopedTaskTimings(ctx, append(slices.Clone(lightTenants), "heavy"))
		if err != nil {
			return err
		}
		waits, heavyRan = waits[:0], 0
		pending := 0
		for _, t := range ts {
			if t.TenantID == "heavy" {
				if t.StartedAt != nil && t.StartedAt.After(lightStart) {
					heavyRan++
				}
				continue
			}
			if t.StartedAt == nil {
				pending++
				continue
			}
			e.mu.Lock()
			admitted, ok := e.admitted[t.ID]
			e.mu.Unlock()
			if !ok {
				admitted = t.CreatedAt
			}
			waits = append(waits, math.Max(0, float64(t.StartedAt.Sub(admitted).Microseconds())/1000))
		}
		if pending == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	p99 := math.Round(percentile(waits, 0.99)*10) / 10
	if contended {
		out.LightP99WaitMs, out.LightP50WaitMs = p99, math.Round(percentile(waits, 0.5)*10)/10
		out.LightTasks, out.HeavyTasksRunDuringLight = len(waits), heavyRan
	} else {
		out.LightP99WaitUncontendedMs = p99
	}
	return nil
}

func totalCommands(ctx context.Context, rdb *redis.Client) (int64, error) {
	info, err := rdb.Info(ctx, "stats").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			var n int64
			_, err := fmt.Sscan(v, &n)
			return n, err
		}
	}
	return 0, fmt.Errorf("no total_commands_processed in INFO")
}

// fifo runs the noisy-neighbour traffic through one plain asynq queue: what asynq
// users without a fair scheduler get.
func (b *fairBench) fifo(ctx context.Context) (float64, error) {
	// one queue under a throwaway prefix, named the way a deployment names its queues
	keys := rkeys.New("fifo"+uuid.NewString()[:8]+":", 1)
	queue := keys.AsynqQueue("fifo")
	defer redisx.DeletePrefix(context.Background(), b.rdb, keys.AsynqKeyPrefix())
	type job struct {
		Tenant   string    `json:"tenant"`
		Ms       int       `json:"ms"`
		Enqueued time.Time `json:"enqueued"`
	}
	var mu sync.Mutex
	var waits []float64
	srv := asynq.NewServerFromRedisClient(b.rdb, asynq.Config{Concurrency: b.o.Concurrency, Queues: map[string]int{queue: 1},
		TaskCheckInterval: 10 * time.Millisecond, LogLevel: asynq.FatalLevel, ShutdownTimeout: time.Second})
	mux := asynq.NewServeMux()
	mux.HandleFunc("sim", func(ctx context.Context, t *asynq.Task) error {
		var j job
		_ = json.Unmarshal(t.Payload(), &j)
		if j.Tenant != "heavy" {
			mu.Lock()
			waits = append(waits, float64(time.Since(j.Enqueued).Microseconds())/1000)
			mu.Unlock()
		}
		select {
		case <-time.After(time.Duration(j.Ms) * time.Millisecond):
		case <-ctx.Done():
		}
		return nil
	})
	cl := asynq.NewClientFromRedisClient(b.rdb)
	enq := func(tenant string) error {
		body, _ := json.Marshal(job{Tenant: tenant, Ms: 20, Enqueued: time.Now()})
		_, err := cl.EnqueueContext(ctx, asynq.NewTask("sim", body), asynq.Queue(queue), asynq.MaxRetry(0))
		return err
	}
	for range b.o.HeavyTasks {
		if err := enq("heavy"); err != nil {
			return 0, err
		}
	}
	if err := srv.Start(mux); err != nil {
		return 0, err
	}
	defer srv.Shutdown()
	time.Sleep(time.Second)
	if err := poisson(ctx, b.o.Light, enq); err != nil {
		return 0, err
	}
	// the light tasks queued behind the heavy backlog: wait until they have run (or
	// report what the last of them waited so far)
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		n, err := asynq.NewInspectorFromRedisClient(b.rdb).GetQueueInfo(queue)
		if err != nil || n.Pending == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	return math.Round(percentile(waits, 0.99)*10) / 10, nil
}

// weights runs three tenants with weights 1, 2, 4 and tasks of 10, 40, 20 ms, and
// measures their shares of worker time while all three are backlogged.
func (b *fairBench) weights(ctx context.Context, shards int) (map[string]float64, float64, float64, error) {
	e, err := b.start(ctx, shards)
	if err != nil {
		return nil, 0, 0, err
	}
	defer e.close()
	type spec struct {
		name       string
		weight, ms int
	}
	specs := []spec{{"w1", 1, 10}, {"w2", 2, 40}, {"w4", 4, 20}}
	names := []string{"w1", "w2", "w4"}
	for _, s := range specs {
		if err := e.tenant(ctx, s.name, s.weight, b.o.Concurrency); err != nil {
			return nil, 0, 0, err
		}
	}
	// Submit all three backlogs before dispatch can favour whichever came first: hold
	// the workers off by submitting from a paused dispatcher.
	e.dispatcher.Stop()
	for _, s := range specs {
		if err := e.submit(ctx, s.name, s.weight, b.o.Concurrency, b.o.WeightTasks, s.ms); err != nil {
			return nil, 0, 0, err
		}
	}
	if err := e.dispatcher.Start(context.WithoutCancel(ctx)); err != nil {
		return nil, 0, 0, err
	}
	// run until one tenant's backlog is empty
	var ts []store.TaskTiming
	deadline := time.Now().Add(5 * time.Minute)
	for {
		time.Sleep(250 * time.Millisecond)
		if ts, err = e.store.UnscopedTaskTimings(ctx, names); err != nil {
			return nil, 0, 0, err
		}
		left := map[string]int{}
		for _, t := range ts {
			if t.StartedAt == nil {
				left[t.TenantID]++
			}
		}
		if len(left) < 3 || time.Now().After(deadline) {
			break
		}
	}
	// window: from the first start to the moment the first backlog emptied
	var from, until time.Time
	lastStart := map[string]time.Time{}
	for _, t := range ts {
		if t.StartedAt == nil {
			continue
		}
		if from.IsZero() || t.StartedAt.Before(from) {
			from = *t.StartedAt
		}
		if t.StartedAt.After(lastStart[t.TenantID]) {
			lastStart[t.TenantID] = *t.StartedAt
		}
	}
	for _, n := range names {
		if until.IsZero() || lastStart[n].Before(until) {
			until = lastStart[n]
		}
	}
	spent := map[string]float64{}
	total := 0.0
	for _, t := range ts {
		if t.StartedAt == nil {
			continue
		}
		end := until
		if t.FinishedAt != nil && t.FinishedAt.Before(until) {
			end = *t.FinishedAt
		}
		start := *t.StartedAt
		if end.After(start) {
			spent[t.TenantID] += end.Sub(start).Seconds()
			total += end.Sub(start).Seconds()
		}
	}
	shares := map[string]float64{}
	maxErr, sumX, sumX2 := 0.0, 0.0, 0.0
	for _, s := range specs {
		share := spent[s.name] / total
		shares[s.name] = math.Round(share*1000) / 1000
		want := float64(s.weight) / 7
		maxErr = math.Max(maxErr, math.Abs(share-want))
		x := share / want
		sumX += x
		sumX2 += x * x
	}
	jain := sumX * sumX / (3 * sumX2)
	return shares, math.Round(maxErr*1000) / 1000, math.Round(jain*10000) / 10000, nil
}

// shallow runs a tenant of weight 1 that keeps exactly one task queued against a
// backlogged tenant of weight deepWeight, and returns the shallow tenant's measured
// share of worker time, the share its weight entitles it to, and how many of its tasks
// ran. The shallow tenant submits its next task as soon as its previous one was
// dispatched, so every dispatch of it empties its queue (the path where a tenant leaves
// the ready set): the next task's row is written to Postgres ahead, and only the push
// to its queue waits for the dispatch, seen by polling the queue's length.
func (b *fairBench) shallow(ctx context.Context, deepWeight int) (float64, float64, int, error) {
	e, err := b.start(ctx, 1)
	if err != nil {
		return 0, 0, 0, err
	}
	defer e.close()
	const shallowMs, deepMs = 150, 100
	for _, t := range []struct {
		name   string
		weight int
	}{{"shallow", 1}, {"deep", deepWeight}} {
		if err := e.tenant(ctx, t.name, t.weight, b.o.Concurrency); err != nil {
			return 0, 0, 0, err
		}
	}
	// enough backlog that the deep tenant never runs dry, even with every worker
	deep := int(b.o.Shallow.Seconds()*1000/deepMs)*b.o.Concurrency + 500
	e.dispatcher.Stop()
	if err := e.submit(ctx, "deep", deepWeight, b.o.Concurrency, deep, deepMs); err != nil {
		return 0, 0, 0, err
	}
	input := json.RawMessage(fmt.Sprintf(`{"steps":1,"step_ms":%d}`, shallowMs))
	write := func() (store.Task, error) {
		t, _, err := e.store.InsertTask(ctx, store.InsertTaskParams{ID: uuid.Must(uuid.NewV7()), TenantID: "shallow",
			Kid: "bench", Agent: "sim", Input: input, Budget: json.RawMessage(`{}`), Priority: scheduler.DefaultPriority,
			RequestHash: []byte{0}})
		return t, err
	}
	push := func(t store.Task) error {
		return e.sched.Enqueue(ctx, scheduler.EnqueueParams{TenantID: "shallow", TaskID: t.ID, Priority: t.Priority,
			CreatedAt: time.Now(), Weight: 1, RunningCap: b.o.Concurrency})
	}
	next, err := write()
	if err != nil {
		return 0, 0, 0, err
	}
	if err := push(next); err != nil {
		return 0, 0, 0, err
	}
	if next, err = write(); err != nil {
		return 0, 0, 0, err
	}
	if err := e.dispatcher.Start(context.WithoutCancel(ctx)); err != nil {
		return 0, 0, 0, err
	}
	start := time.Now()
	end := start.Add(b.o.Shallow)
	for time.Now().Before(end) {
		n, err := e.sched.QueueLen(ctx, "shallow")
		if err != nil {
			return 0, 0, 0, err
		}
		if n > 0 {
			time.Sleep(200 * time.Microsecond)
			continue
		}
		if err := push(next); err != nil {
			return 0, 0, 0, err
		}
		if next, err = write(); err != nil {
			return 0, 0, 0, err
		}
	}
	// Worker time in [start+1 s, end]: the first second fills the pool and settles
	// the shallow tenant's cost estimate.
	from := start.Add(time.Second)
	ts, err := e.store.UnscopedTaskTimings(ctx, []string{"shallow", "deep"})
	if err != nil {
		return 0, 0, 0, err
	}
	spent := map[string]float64{}
	ran := 0
	for _, t := range ts {
		if t.StartedAt == nil {
			continue
		}
		if t.TenantID == "shallow" {
			ran++
		}
		s, f := *t.StartedAt, end
		if t.FinishedAt != nil && t.FinishedAt.Before(end) {
			f = *t.FinishedAt
		}
		if s.Before(from) {
			s = from
		}
		if f.After(s) {
			spent[t.TenantID] += f.Sub(s).Seconds()
		}
	}
	total := spent["shallow"] + spent["deep"]
	if total == 0 {
		return 0, 0, 0, fmt.Errorf("no worker time measured")
	}
	return spent["shallow"] / total, 1 / float64(1+deepWeight), ran, nil
}

// scale measures the scheduler alone (no asynq, no Postgres): the cost of one dispatch
// with 10 and with 10,000 backlogged tenants, and Redis memory per queued task and per
// idle tenant.
func (b *fairBench) scale(ctx context.Context, out *Fairness) error {
	measure := func(tenants int) (float64, float64, float64, error) {
		prefix := "benchscale" + uuid.NewString()[:8] + ":"
		keys := rkeys.New(prefix, 1)
		defer redisx.DeletePrefix(context.Background(), b.rdb, prefix)
		s := scheduler.New(b.rdb, keys, scheduler.Options{})
		if err := s.Heartbeat(ctx, "bench", 1<<30, time.Hour); err != nil {
			return 0, 0, 0, err
		}
		perTenant := max(3, 30000/tenants)
		if tenants >= 10000 {
			perTenant = 3
		}
		now := time.Now()
		pipe := b.rdb.Pipeline()
		n := 0
		for t := range tenants {
			for i := range perTenant {
				scheduler.EnqueueInPipeline(ctx, pipe, keys, scheduler.EnqueueParams{TenantID: fmt.Sprint("t", t),
					TaskID: uuid.Must(uuid.NewV7()), Priority: 5, CreatedAt: now.Add(time.Duration(i) * time.Millisecond), Weight: 1 + t%4})
				n++
			}
			if n >= 5000 {
				if _, err := pipe.Exec(ctx); err != nil {
					return 0, 0, 0, err
				}
				n = 0
			}
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return 0, 0, 0, err
		}
		queued := tenants * perTenant
		bytes, err := memoryOf(ctx, b.rdb, prefix+"*")
		if err != nil {
			return 0, 0, 0, err
		}
		perTask := float64(bytes) / float64(queued)
		const samples = 3000
		var spent time.Duration
		for range samples {
			t0 := time.Now()
			d, err := s.Take(ctx)
			spent += time.Since(t0)
			if err != nil {
				return 0, 0, 0, err
			}
			if err := s.Done(ctx, d, 20*time.Millisecond); err != nil {
				return 0, 0, 0, err
			}
		}
		// drain everything; what is left of idle tenants is what they cost
		for {
			d, err := s.Take(ctx)
			if err != nil {
				break
			}
			if err := s.Done(ctx, d, 20*time.Millisecond); err != nil {
				return 0, 0, 0, err
			}
		}
		idle, err := memoryOf(ctx, b.rdb, keys.TenantKeysPattern(0, "t*"))
		if err != nil {
			return 0, 0, 0, err
		}
		return float64(spent.Microseconds()) / samples, perTask, float64(idle) / float64(tenants), nil
	}
	us10, perTask, _, err := measure(10)
	if err != nil {
		return err
	}
	us10k, _, idle, err := measure(10000)
	if err != nil {
		return err
	}
	out.DispatchUsPerTask10 = math.Round(us10*10) / 10
	out.DispatchUsPerTask10k = math.Round(us10k*10) / 10
	out.RedisBytesPerQueuedTask = math.Round(perTask*10) / 10
	out.RedisBytesPerIdleTenant = math.Round(idle*10) / 10
	return nil
}

func memoryOf(ctx context.Context, rdb *redis.Client, pattern string) (int64, error) {
	var total int64
	iter := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		n, err := rdb.MemoryUsage(ctx, iter.Val()).Result()
		if err == nil {
			total += n
		}
	}
	return total, iter.Err()
}
