package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/quotas"
)

// TokensE2E is the part of `agentq bench tokens` that needs the whole server: a
// tenant parked on its own tokens per minute beside another tenant, and the cost of
// an uncontended pool on the task path.
type TokensE2E struct {
	// WorkerSlotsHeldByParked is the most worker slots that tasks waiting for their
	// tenant's tokens per minute held at once, over the other tenant's run: a task
	// counts when it is queued with a wait reason in Postgres and still in its
	// tenant's running set in Redis at two samples 100 ms apart.
	WorkerSlotsHeldByParked int `json:"worker_slots_held_by_parked"`
	// The other tenant's throughput (tasks of one 200 ms step on ParkedWorkers
	// workers) beside the parked tenant, alone, and their ratio.
	OtherTasksPerSBeside float64 `json:"other_tasks_per_s_beside_parked"`
	OtherTasksPerSAlone  float64 `json:"other_tasks_per_s_alone"`
	OtherThroughputRatio float64 `json:"other_throughput_ratio"`
	ParkedWorkers        int     `json:"parked_workers"`
	// PoolOverheadRatio is end-to-end throughput with sim bound to an uncontended
	// pool against the same load with no pool: the median of OverheadPairs pairs.
	PoolOverheadRatio float64   `json:"pool_overhead_ratio"`
	PoolTasksPerS     []float64 `json:"pool_tasks_per_s"`
	NoPoolTasksPerS   []float64 `json:"no_pool_tasks_per_s"`
}

// TokensE2EOptions configure the server scenarios; zero fields take the defaults.
type TokensE2EOptions struct {
	DatabaseURL, RedisURL string
	OtherTasks            int // 60 tasks of one 200 ms step
	OverheadTasks         int // 2,000 one-step tasks a run
	OverheadPairs         int // 8
	Progress              io.Writer
}

// liftedLimits lifts every admission limit and period quota, as loadgen does: the
// scenarios measure the path (and the token limits they name), not the others.
var liftedLimits = map[string]quotas.Limit{"concurrent_sessions": 1e6, "user_tasks_hourly": 1e8, "queue_backlog": 1e6,
	"agent_steps_daily": 1e8, "tenant_rate": 1e6, "tenant_rate_burst": 1e6, "running": 1000,
	"long_running_inflight": 1e6, "key_rate": 1e6, "key_rate_burst": 1e6, "ai_tokens_monthly": quotas.Unlimited,
	"usd_monthly": quotas.Unlimited}

// RunTokensE2E runs the parked-tenant scenario, then the pool-overhead pairs, each on
// a server of its own.
func RunTokensE2E(ctx context.Context, o TokensE2EOptions) (TokensE2E, error) {
	o.OtherTasks = orInt(o.OtherTasks, 60)
	o.OverheadTasks = orInt(o.OverheadTasks, 2000)
	o.OverheadPairs = orInt(o.OverheadPairs, 8)
	var out TokensE2E
	rdb, err := redisx.Connect(ctx, o.RedisURL)
	if err != nil {
		return out, err
	}
	defer rdb.Close()
	progress(o.Progress, "tokens: a tenant parked on its tokens per minute beside another, 4 workers…")
	if err := runParked(ctx, o, rdb, &out); err != nil {
		return out, fmt.Errorf("parked tenant: %w", err)
	}
	progress(o.Progress, "tokens: an uncontended pool against none, %d pairs of %d tasks…", o.OverheadPairs, o.OverheadTasks)
	if err := runPoolOverhead(ctx, o, rdb, &out); err != nil {
		return out, fmt.Errorf("pool overhead: %w", err)
	}
	return out, nil
}

func progress(w io.Writer, f string, a ...any) {
	if w != nil {
		fmt.Fprintf(w, f+"\n", a...)
	}
}

// tenantKey creates a tenant on plan with the lifted limits plus extra, and returns
// its key.
func (b *benchApp) tenantKey(ctx context.Context, id, plan string, extra map[string]quotas.Limit) (string, error) {
	ov := maps.Clone(liftedLimits)
	maps.Copy(ov, extra)
	if _, err := b.app.CreateTenant(ctx, agentq.NewTenant{ID: id, Plan: plan, Overrides: ov}); err != nil {
		return "", err
	}
	k, err := b.app.CreateAPIKey(ctx, agentq.NewAPIKey{TenantID: id})
	return k.Token, err
}

// call sends a JSON request with token and returns the status and body.
func (b *benchApp) call(ctx context.Context, method, path, token, body string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, b.base+path, bytes.NewReader([]byte(body)))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

// submitN submits n copies of task with key and fails on any refusal.
func (b *benchApp) submitN(ctx context.Context, key, task string, n int) error {
	for range n {
		st, body, err := b.call(ctx, http.MethodPost, "/v1/tasks", key, task)
		if err != nil {
			return err
		}
		if st != http.StatusAccepted {
			return fmt.Errorf("submit: %d %s", st, body)
		}
	}
	return nil
}

// waitEnded waits until tenant has n tasks ended, calling sample meanwhile.
func (b *benchApp) waitEnded(ctx context.Context, tenant string, n int, sample func() error) error {
	for deadline := time.Now().Add(5 * time.Minute); ; {
		var ended int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE tenant_id = $1 AND finished_at IS NOT NULL`, tenant).Scan(&ended); err != nil {
			return err
		}
		if ended >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d tasks of %s ended in 5 minutes", ended, n, tenant)
		}
		if sample != nil {
			if err := sample(); err != nil {
				return err
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

const parkedWorkers = 4

// runParked measures the other tenant's throughput alone, then beside a tenant whose
// tasks wait for its tokens per minute, sampling the worker slots those hold.
func runParked(ctx context.Context, o TokensE2EOptions, rdb redis.UniversalClient, out *TokensE2E) error {
	b, err := startBenchApp(ctx, o.DatabaseURL, rdb, parkedWorkers, 0)
	if err != nil {
		return err
	}
	defer b.stop()
	out.ParkedWorkers = parkedWorkers
	other, err := b.tenantKey(ctx, "other", "enterprise", nil)
	if err != nil {
		return err
	}
	parked, err := b.tenantKey(ctx, "parked", "enterprise", map[string]quotas.Limit{quotas.AITokensPerMinute: 3000, quotas.AITokensPerMinute + "_burst": 3000})
	if err != nil {
		return err
	}
	const otherTask = `{"agent":"sim","input":{"steps":1,"step_ms":200,"tokens_per_step":10}}`
	run := func(sample func() error) (float64, error) {
		var before int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE tenant_id = 'other'`).Scan(&before); err != nil {
			return 0, err
		}
		start := time.Now()
		if err := b.submitN(ctx, other, otherTask, o.OtherTasks); err != nil {
			return 0, err
		}
		if err := b.waitEnded(ctx, "other", before+o.OtherTasks, sample); err != nil {
			return 0, err
		}
		return float64(o.OtherTasks) / time.Since(start).Seconds(), nil
	}
	if out.OtherTasksPerSAlone, err = run(nil); err != nil {
		return err
	}
	// 8 tasks of 3 steps of 1,000 tokens against 3,000 a minute: three steps go, the
	// rest wait.
	if err := b.submitN(ctx, parked, `{"agent":"sim","input":{"steps":3,"step_ms":5,"tokens_per_step":1000}}`, 8); err != nil {
		return err
	}
	time.Sleep(3 * time.Second)
	held := newHeldSampler(b, rdb)
	if out.OtherTasksPerSBeside, err = run(held.sample); err != nil {
		return err
	}
	out.WorkerSlotsHeldByParked = held.max
	out.OtherTasksPerSAlone, out.OtherTasksPerSBeside = round1(out.OtherTasksPerSAlone), round1(out.OtherTasksPerSBeside)
	if out.OtherTasksPerSAlone > 0 {
		out.OtherThroughputRatio = roundTo(out.OtherTasksPerSBeside/out.OtherTasksPerSAlone, 3)
	}
	return nil
}

// heldSampler counts the parked tenant's tasks that wait for capacity while still
// holding a running slot, at two samples at least 100 ms apart.
type heldSampler struct {
	b      *benchApp
	rdb    redis.UniversalClient
	key    string
	last   map[string]bool
	lastAt time.Time
	max    int
}

func newHeldSampler(b *benchApp, rdb redis.UniversalClient) *heldSampler {
	keys := rkeys.New(b.prefix, b.shards)
	return &heldSampler{b: b, rdb: rdb, key: keys.TenantRunning("parked"), last: map[string]bool{}}
}

func (h *heldSampler) sample() error {
	if time.Since(h.lastAt) < 100*time.Millisecond {
		return nil
	}
	ctx := context.Background()
	rows, err := h.b.pool.Query(ctx, `SELECT id::text FROM tasks WHERE tenant_id = 'parked' AND state = 'queued' AND wait_reason IS NOT NULL`)
	if err != nil {
		return err
	}
	var waiting []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		waiting = append(waiting, id)
	}
	rows.Close()
	running, err := h.rdb.SMembers(ctx, h.key).Result()
	if err != nil {
		return err
	}
	now := map[string]bool{}
	n := 0
	for _, id := range waiting {
		if slices.Contains(running, id) {
			now[id] = true
			if h.last[id] {
				n++
			}
		}
	}
	h.last, h.lastAt, h.max = now, time.Now(), max(h.max, n)
	return nil
}

// runPoolOverhead runs the end-to-end load with sim bound to an uncontended pool and
// with no pool, alternately, on one server.
func runPoolOverhead(ctx context.Context, o TokensE2EOptions, rdb redis.UniversalClient, out *TokensE2E) error {
	b, err := startBenchApp(ctx, o.DatabaseURL, rdb, 20, 0)
	if err != nil {
		return err
	}
	defer b.stop()
	var keys []string
	for t := range 4 {
		k, err := b.tenantKey(ctx, fmt.Sprintf("load%d", t), "enterprise", nil)
		if err != nil {
			return err
		}
		keys = append(keys, k)
	}
	if st, body, err := b.call(ctx, http.MethodPut, "/v1/admin/pools/bench", b.admin, `{"tokens_per_minute":100000000000}`); err != nil || st/100 != 2 {
		return fmt.Errorf("PUT pool: %d %s %v", st, body, err)
	}
	load := func() (float64, error) {
		body := []byte(`{"agent":"sim","input":{"steps":1,"step_ms":0,"tokens_per_step":10}}`)
		start := time.Now()
		_, errs, firstErr := produce(o.OverheadTasks, 32, func(i int) error {
			st, resp, err := b.call(ctx, http.MethodPost, "/v1/tasks", keys[i%len(keys)], string(body))
			if err == nil && st != http.StatusAccepted {
				err = fmt.Errorf("status %d: %s", st, resp)
			}
			return err
		})
		if errs > 0 {
			return 0, fmt.Errorf("%d submissions failed: %w", errs, firstErr)
		}
		// Done when none is live: the count reads the live tasks' index, not the
		// table, which grows with every run.
		for {
			var live int
			if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE state IN ('queued', 'running')`).Scan(&live); err != nil {
				return 0, err
			}
			if live == 0 {
				return float64(o.OverheadTasks) / time.Since(start).Seconds(), nil
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	bound := false
	bind := func(on bool) error {
		if on == bound {
			return nil
		}
		method, body := http.MethodDelete, ""
		if on {
			method, body = http.MethodPut, `{"pool":"bench","tokens_per_step":10}`
		}
		st, resp, err := b.call(ctx, method, "/v1/admin/agents/sim/pool", b.admin, body)
		if err != nil || st/100 != 2 {
			return fmt.Errorf("%s binding: %d %s %v", method, st, resp, err)
		}
		bound = on
		time.Sleep(1500 * time.Millisecond) // every process's binding cache has it
		return nil
	}
	// One run of each side first, not counted: the first loads pay for the scripts'
	// loading, the connections' opening and the tables' first pages, and the first
	// of a pair would be charged for them. Then pairs alternate their order (none then
	// pool, pool then none), so a drift of the machine over the runs does not favour
	// either side; the median of many pairs keeps one disturbed run from deciding.
	for _, withPool := range []bool{false, true} {
		if err := bind(withPool); err != nil {
			return err
		}
		if _, err := load(); err != nil {
			return err
		}
	}
	var ratios []float64
	for i := range o.OverheadPairs {
		order := []bool{false, true}
		if i%2 == 1 {
			order = []bool{true, false}
		}
		got := map[bool]float64{}
		for _, withPool := range order {
			if err := bind(withPool); err != nil {
				return err
			}
			if got[withPool], err = load(); err != nil {
				return err
			}
		}
		out.NoPoolTasksPerS = append(out.NoPoolTasksPerS, round1(got[false]))
		out.PoolTasksPerS = append(out.PoolTasksPerS, round1(got[true]))
		ratios = append(ratios, got[true]/got[false])
	}
	out.PoolOverheadRatio = roundTo(median(ratios), 3)
	return nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func roundTo(f float64, places int) float64 {
	p := math.Pow(10, float64(places))
	return math.Round(f*p) / p
}
