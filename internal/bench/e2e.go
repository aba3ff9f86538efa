package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/internal/pg"
	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/migrations"
)

// E2E is the result of `agentq bench e2e`: the load shape of internal/bench/loadgen
// (C producers submit N one-step tasks of 0 ms one at a time over HTTP, W workers run
// them, the clock stops when the last has ended), through one agentq process with
// every role, and the same load through plain asynq on the same Redis: the ceiling of
// a queue with no durable store, no HTTP and no admission.
type E2E struct {
	AgentqTasksPerS  float64 `json:"agentq_tasks_per_s"`
	AgentqSubmitPerS float64 `json:"agentq_submit_per_s"`
	AsynqTasksPerS   float64 `json:"asynq_tasks_per_s"`
	Ratio            float64 `json:"ratio_vs_asynq"`
	// P50/P99LatencyMs: a task's submission to its end, as Postgres recorded them.
	P50LatencyMs float64 `json:"p50_latency_ms"`
	P99LatencyMs float64 `json:"p99_latency_ms"`
	Tasks        int     `json:"tasks"`
	Concurrency  int     `json:"concurrency"` // producers
	Workers      int     `json:"workers"`
	Tenants      int     `json:"tenants"`
	Errors       int64   `json:"errors"`
	// FirstError says what the first failed submission got.
	FirstError string `json:"first_error,omitempty"`
}

// E2EOptions configure the benchmark; zero fields take loadgen's defaults.
type E2EOptions struct {
	DatabaseURL string
	RedisURL    string
	Tasks       int // 4,000
	Concurrency int // producers, 32
	Workers     int // 20
	Tenants     int // 4
	Progress    io.Writer
	// RedisTimeout is the App's admission timeout (0: the default); a test on a
	// loaded machine raises it, so that a slow moment is not answered as an outage.
	RedisTimeout time.Duration
}

// RunE2E runs the agentq phase on a fresh Postgres schema and Redis prefix, then the
// asynq phase on its own queue, and drops both.
func RunE2E(ctx context.Context, o E2EOptions) (E2E, error) {
	o.Tasks = orInt(o.Tasks, 4000)
	o.Concurrency = orInt(o.Concurrency, 32)
	o.Workers = orInt(o.Workers, 20)
	o.Tenants = orInt(o.Tenants, 4)
	log := func(f string, a ...any) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, f+"\n", a...)
		}
	}
	out := E2E{Tasks: o.Tasks, Concurrency: o.Concurrency, Workers: o.Workers, Tenants: o.Tenants}
	rdb, err := redisx.Connect(ctx, o.RedisURL)
	if err != nil {
		return out, err
	}
	defer rdb.Close()

	log("agentq: %d one-step tasks from %d producers over HTTP, %d workers, %d tenants…", o.Tasks, o.Concurrency, o.Workers, o.Tenants)
	if err := runAgentqE2E(ctx, o, rdb, &out); err != nil {
		return out, fmt.Errorf("agentq: %w", err)
	}
	log("plain asynq: the same load on its own queue…")
	per, err := runAsynqE2E(ctx, o, rdb)
	if err != nil {
		return out, fmt.Errorf("asynq: %w", err)
	}
	out.AsynqTasksPerS = round1(per)
	if per > 0 {
		out.Ratio = math.Round(out.AgentqTasksPerS/per*1000) / 1000
	}
	return out, nil
}

func orInt(v, d int) int {
	if v <= 0 {
		return d
	}
	return v
}

func round1(f float64) float64 { return math.Round(f*10) / 10 }

// produce runs n submissions from c goroutines, one at a time each. It returns how
// long they took, how many failed and the first failure.
func produce(n, c int, submit func(i int) error) (time.Duration, int64, error) {
	var next, errs atomic.Int64
	var first sync.Once
	var firstErr error
	start := time.Now()
	var wg sync.WaitGroup
	for range c {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				if err := submit(int(i)); err != nil {
					errs.Add(1)
					first.Do(func() { firstErr = err })
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), errs.Load(), firstErr
}

// benchApp is one agentq process with every role, on a fresh Postgres schema and
// Redis prefix: what the end-to-end scenarios drive over HTTP.
type benchApp struct {
	app   *agentq.App
	pool  *pgxpool.Pool
	base  string // the API's URL
	admin string // its admin token
	// prefix and shards name its Redis keys.
	prefix string
	shards int
	stop   func() // shuts it down and drops its schema and keys
}

// startBenchApp starts a benchApp with workers worker slots.
func startBenchApp(ctx context.Context, databaseURL string, rdb redis.UniversalClient, workers int, redisTimeout time.Duration) (*benchApp, error) {
	return startBenchAppWith(ctx, databaseURL, rdb, workers, redisTimeout, "")
}

// startBenchAppWith is startBenchApp with the plan catalogue of plansFile ("": the
// built-in one).
func startBenchAppWith(ctx context.Context, databaseURL string, rdb redis.UniversalClient, workers int, redisTimeout time.Duration,
	plansFile string) (*benchApp, error) {
	id := strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	schema := "bench_e2e_" + id
	admin, err := pg.Connect(ctx, databaseURL, "")
	if err != nil {
		return nil, err
	}
	var undo []func()
	stop := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	undo = append(undo, admin.Close)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		stop()
		return nil, err
	}
	undo = append(undo, func() { _, _ = admin.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+schema+" CASCADE") })
	pool, err := pg.Connect(ctx, databaseURL, schema)
	if err != nil {
		stop()
		return nil, err
	}
	undo = append(undo, pool.Close)
	if _, err := migrations.Up(ctx, pool); err != nil {
		stop()
		return nil, err
	}
	cfg := agentq.DefaultConfig()
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.AdminToken = "bench-" + id
	cfg.RedisPrefix = "benche2e" + id + ":"
	cfg.WorkerConcurrency = workers
	cfg.ShutdownTimeout = 5 * time.Second
	cfg.PlansFile = plansFile
	if redisTimeout > 0 {
		cfg.RedisTimeout = redisTimeout
	}
	app, err := agentq.New(ctx, agentq.Options{Config: cfg, Redis: rdb, Pool: pool, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		stop()
		return nil, err
	}
	if err := app.Start(ctx); err != nil {
		stop()
		return nil, err
	}
	undo = append(undo, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = app.Shutdown(sctx)
		redisx.DeletePrefix(sctx, rdb, cfg.RedisPrefix)
		redisx.DeletePrefix(sctx, rdb, "asynq:{"+cfg.RedisPrefix)
	})
	return &benchApp{app: app, pool: pool, base: "http://" + app.Addr().String(), admin: cfg.AdminToken,
		prefix: cfg.RedisPrefix, shards: cfg.Shards, stop: stop}, nil
}

func runAgentqE2E(ctx context.Context, o E2EOptions, rdb redis.UniversalClient, out *E2E) error {
	b, err := startBenchApp(ctx, o.DatabaseURL, rdb, o.Workers, o.RedisTimeout)
	if err != nil {
		return err
	}
	defer b.stop()
	pool := b.pool
	var keys []string
	for t := range o.Tenants {
		k, err := b.tenantKey(ctx, fmt.Sprintf("load%d", t), "pro", nil)
		if err != nil {
			return err
		}
		keys = append(keys, k)
	}
	base := b.base
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	body := []byte(`{"agent":"sim","input":{"steps":1,"step_ms":0}}`)
	start := time.Now()
	took, errs, firstErr := produce(o.Tasks, o.Concurrency, func(i int) error {
		return submitTask(ctx, hc, base, keys[i%len(keys)], body)
	})
	out.Errors = errs
	if firstErr != nil {
		out.FirstError = firstErr.Error()
	}
	out.AgentqSubmitPerS = round1(float64(o.Tasks) / took.Seconds())
	// Done when Postgres, the system of record, has every accepted task ended.
	want := int64(o.Tasks) - errs
	for deadline := time.Now().Add(10 * time.Minute); ; time.Sleep(5 * time.Millisecond) {
		var ended int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE finished_at IS NOT NULL`).Scan(&ended); err != nil {
			return err
		}
		if ended >= want {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d tasks ended within 10 minutes", ended, want)
		}
	}
	elapsed := time.Since(start)
	out.AgentqTasksPerS = round1(float64(want) / elapsed.Seconds())
	var states int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE state <> 'completed'`).Scan(&states); err != nil {
		return err
	} else if states > 0 {
		return fmt.Errorf("%d tasks did not complete", states)
	}
	var p50, p99 float64
	if err := pool.QueryRow(ctx, `
		SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)
		FROM (SELECT extract(epoch FROM finished_at - created_at) * 1000 AS ms FROM tasks) t`).Scan(&p50, &p99); err != nil {
		return err
	}
	out.P50LatencyMs, out.P99LatencyMs = round1(p50), round1(p99)
	return nil
}

// submitTask posts one task (body, JSON) with key and wants its 202.
func submitTask(ctx context.Context, hc *http.Client, base, key string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/tasks", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusAccepted {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return fmt.Errorf("status %d: %s", resp.StatusCode, msg)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return nil
}

// runAsynqE2E is the same load through plain asynq: producers enqueue no-op tasks on a
// queue of its own, a server of Workers runs them, the clock stops at the last one.
func runAsynqE2E(ctx context.Context, o E2EOptions, rdb redis.UniversalClient) (float64, error) {
	queue := "benche2e-" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	defer redisx.DeletePrefix(context.WithoutCancel(ctx), rdb, "asynq:{"+queue+"}")
	var done atomic.Int64
	all := make(chan struct{})
	mux := asynq.NewServeMux()
	mux.HandleFunc("noop", func(context.Context, *asynq.Task) error {
		if done.Add(1) == int64(o.Tasks) {
			close(all)
		}
		return nil
	})
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency: o.Workers, Queues: map[string]int{queue: 1}, TaskCheckInterval: 10 * time.Millisecond,
		Logger: quietAsynq{}, LogLevel: asynq.FatalLevel,
	})
	if err := srv.Start(mux); err != nil {
		return 0, err
	}
	defer srv.Shutdown()
	client := asynq.NewClientFromRedisClient(rdb)
	start := time.Now()
	_, errs, _ := produce(o.Tasks, o.Concurrency, func(int) error {
		_, err := client.EnqueueContext(ctx, asynq.NewTask("noop", nil), asynq.Queue(queue), asynq.MaxRetry(0))
		return err
	})
	if errs > 0 {
		return 0, fmt.Errorf("%d enqueues failed", errs)
	}
	select {
	case <-all:
	case <-time.After(10 * time.Minute):
		return 0, errors.New("plain asynq did not run every task within 10 minutes")
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return float64(o.Tasks) / time.Since(start).Seconds(), nil
}

// quietAsynq drops asynq's own log lines.
type quietAsynq struct{}

func (quietAsynq) Debug(...any) {}
func (quietAsynq) Info(...any)  {}
func (quietAsynq) Warn(...any)  {}
func (quietAsynq) Error(...any) {}
func (quietAsynq) Fatal(...any) {}
