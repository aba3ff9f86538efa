package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/agentq/agentq/internal/redisx"
)

// Trees is the result of `agentq bench trees`: what a task tree costs per child
// against plain submissions of the same tasks, and whether a tree keeps to its
// tenant's fair share beside a flood of other tenants.
//
// A tree here is three levels: a root spawning Mids children, each spawning Leaves
// leaves, all sim steps of StepMs, every parent waiting for its children. Its
// baseline is the same number of one-step tasks submitted over HTTP by the tenant.
// The machine's busy time (every process: agentq, Redis, Postgres, this one) is
// measured over each, alone; then each runs again beside two flood tenants of the
// same weight, and the flood's share of the tasks started while the tree tenant had
// work is compared.
type Trees struct {
	Leaves int `json:"leaves"`
	Tasks  int `json:"tasks"` // the tree's tasks, its root and middle level included
	// PlainMsPerTask and TreeMsPerTask are the machine's busy ms per task, alone.
	PlainMsPerTask float64 `json:"plain_ms_per_task"`
	TreeMsPerTask  float64 `json:"tree_ms_per_task"`
	// OverheadPerChild is TreeMsPerTask / PlainMsPerTask: what a child costs against a
	// plain submission (its HTTP request included on the plain side).
	OverheadPerChild float64 `json:"overhead_per_child"`
	PlainSeconds     float64 `json:"plain_s"`
	TreeSeconds      float64 `json:"tree_s"`
	// FloodShareBeside… is the flood tenants' share of the tasks started while the
	// tree tenant had work: beside its plain tasks, and beside its tree's leaves.
	FloodShareBesidePlain float64 `json:"flood_share_beside_plain"`
	FloodShareBesideTree  float64 `json:"flood_share_beside_tree"`
	// ShareChange is the difference of the two (|tree − plain|).
	ShareChange float64 `json:"share_change"`
}

// TreesOptions configure the benchmark; zero fields take the defaults.
type TreesOptions struct {
	DatabaseURL string
	RedisURL    string
	Mids        int // children of the root (20)
	Leaves      int // leaves of each middle task (50: at most a step's spawns)
	StepMs      int // each task's one step (2)
	Workers     int // 20
	Progress    io.Writer
	// RedisTimeout: as E2EOptions'.
	RedisTimeout time.Duration
}

// benchPlans is the catalogue of the benchmark's process: one plan whose limits let
// the load through and whose tree ceiling holds the tree (the built-in ones bound a
// tree's steps at ten times a task's).
const benchPlans = `plans:
  bench:
    weight: 1
    limits: {key_rate: unlimited, tenant_rate: unlimited, key_agent_rate: unlimited, user_tasks_hourly: unlimited,
      concurrent_sessions: unlimited, inflight_requests: 1000, long_running_inflight: unlimited, queue_backlog: unlimited,
      running: unlimited, agent_steps_daily: unlimited, ai_tokens_monthly: unlimited, usd_monthly: unlimited,
      webhook_endpoints: 0, paused_tasks: 0}
    budget:
      default: {max_steps: 2, max_wallclock_s: 300, max_cost_usd: 1}
      ceiling: {max_steps: 2, max_wallclock_s: 300, max_cost_usd: 1}
    tree:
      default: {max_tasks: 5000, max_depth: 4, max_steps: 20000, max_tokens: 1000000, max_cost_usd: 10000}
      ceiling: {max_tasks: 5000, max_depth: 4, max_steps: 20000, max_tokens: 1000000, max_cost_usd: 10000}
`

// RunTrees runs the four phases on one agentq process with every role, on a fresh
// Postgres schema and Redis prefix, and drops both.
func RunTrees(ctx context.Context, o TreesOptions) (Trees, error) {
	o.Mids, o.Leaves = orInt(o.Mids, 20), orInt(o.Leaves, 50)
	o.StepMs, o.Workers = orInt(o.StepMs, 2), orInt(o.Workers, 20)
	log := func(f string, a ...any) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, f+"\n", a...)
		}
	}
	out := Trees{Leaves: o.Mids * o.Leaves, Tasks: 1 + o.Mids + o.Mids*o.Leaves}
	dir, err := os.MkdirTemp("", "agentq-bench-trees")
	if err != nil {
		return out, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	plans := filepath.Join(dir, "plans.yaml")
	if err := os.WriteFile(plans, []byte(benchPlans), 0o600); err != nil {
		return out, err
	}
	rdb, err := redisx.Connect(ctx, o.RedisURL)
	if err != nil {
		return out, err
	}
	defer rdb.Close()
	b, err := startBenchAppWith(ctx, o.DatabaseURL, rdb, o.Workers, o.RedisTimeout, plans)
	if err != nil {
		return out, err
	}
	defer b.stop()
	t := &treeBench{b: b, o: o, hc: &http.Client{Timeout: 30 * time.Second}}
	for _, name := range []string{"tree", "flood-a", "flood-b"} {
		k, err := b.tenantKey(ctx, name, "bench", nil)
		if err != nil {
			return out, err
		}
		t.keys = append(t.keys, k)
	}
	log("alone: %d plain tasks, then a tree of %d tasks (%d leaves)…", out.Tasks, out.Tasks, out.Leaves)
	plainBusy, plainTook, err := t.alone(ctx, t.plain)
	if err != nil {
		return out, fmt.Errorf("plain tasks: %w", err)
	}
	treeBusy, treeTook, err := t.alone(ctx, t.tree)
	if err != nil {
		return out, fmt.Errorf("the tree: %w", err)
	}
	out.PlainSeconds, out.TreeSeconds = round3(plainTook.Seconds()), round3(treeTook.Seconds())
	out.PlainMsPerTask, out.TreeMsPerTask = round3(plainBusy/float64(out.Tasks)), round3(treeBusy/float64(out.Tasks))
	if out.PlainMsPerTask > 0 {
		out.OverheadPerChild = round3(out.TreeMsPerTask / out.PlainMsPerTask)
	}
	log("beside a flood of two tenants: plain tasks, then the tree…")
	if out.FloodShareBesidePlain, err = t.beside(ctx, t.plain); err != nil {
		return out, fmt.Errorf("plain tasks beside the flood: %w", err)
	}
	if out.FloodShareBesideTree, err = t.beside(ctx, t.tree); err != nil {
		return out, fmt.Errorf("the tree beside the flood: %w", err)
	}
	out.ShareChange = round3(math.Abs(out.FloodShareBesideTree - out.FloodShareBesidePlain))
	return out, nil
}

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

// treeBench drives one benchmark process: keys[0] is the tree tenant's, the others
// the flood's.
type treeBench struct {
	b    *benchApp
	o    TreesOptions
	hc   *http.Client
	keys []string
}

// alone runs load on its own and returns the machine's busy ms and the time until
// every task ended.
func (t *treeBench) alone(ctx context.Context, load func(context.Context) error) (busyMs float64, took time.Duration, err error) {
	if err := t.drained(ctx); err != nil {
		return 0, 0, err
	}
	b0, err := machineBusyMs()
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	if err := load(ctx); err != nil {
		return 0, 0, err
	}
	if err := t.drained(ctx); err != nil {
		return 0, 0, err
	}
	took = time.Since(start)
	b1, err := machineBusyMs()
	return b1 - b0, took, err
}

// beside runs load while the flood tenants keep a backlog, and returns the flood's
// share of the tasks started while the tree tenant's deepest tasks were all queued
// or running.
func (t *treeBench) beside(ctx context.Context, load func(context.Context) error) (float64, error) {
	if err := t.drained(ctx); err != nil {
		return 0, err
	}
	flood := t.o.Mids * t.o.Leaves * 2 // each flood tenant outlasts the tree tenant's work
	for _, k := range t.keys[1:] {
		if err := t.submitMany(ctx, k, flood); err != nil {
			return 0, err
		}
	}
	if err := load(ctx); err != nil {
		return 0, err
	}
	// The window: from the last creation to the last end of the tree tenant's deepest
	// tasks (the leaves; every task of a plain load): while all of them are queued or
	// running, the tenant has its whole backlog, as a plain load has from the start.
	// Before it the tree's root and middle level run, spawning, and after the leaves
	// the middle level ends, tasks a plain load has no counterpart of.
	for deadline := time.Now().Add(10 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		var live int
		if err := t.b.pool.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE tenant_id = 'tree' AND finished_at IS NULL`).Scan(&live); err != nil {
			return 0, err
		}
		if live == 0 {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the tree tenant's tasks did not end within 10 minutes")
		}
	}
	var from, to time.Time
	if err := t.b.pool.QueryRow(ctx, `SELECT max(created_at), max(finished_at) FROM tasks
		WHERE tenant_id = 'tree' AND depth = (SELECT max(depth) FROM tasks WHERE tenant_id = 'tree')`).Scan(&from, &to); err != nil {
		return 0, err
	}
	// The tasks started in the window: the flood's, and the tree tenant's deepest
	// (the leaves; every plain task), all one step of the same time, so that counts
	// are worker time. A tree's other tasks differ in theirs (a spawning step makes
	// 50 children; a parent parked for its children holds no worker) and ran before
	// the window, but for the middle level's second steps, few and short.
	var mine, theirs float64
	err := t.b.pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE tenant_id = 'tree'), count(*) FILTER (WHERE tenant_id <> 'tree') FROM tasks
		WHERE started_at >= $1 AND started_at <= $2
			AND (tenant_id <> 'tree' OR depth = (SELECT max(depth) FROM tasks WHERE tenant_id = 'tree'))`,
		from, to).Scan(&mine, &theirs)
	if err != nil {
		return 0, err
	}
	// The flood's backlog is left to end before the next phase.
	if mine+theirs == 0 {
		return 0, fmt.Errorf("no task started in the window")
	}
	return round3(theirs / (mine + theirs)), nil
}

// drained waits until no task is live, then clears the ended ones so that each phase
// counts its own.
func (t *treeBench) drained(ctx context.Context) error {
	for deadline := time.Now().Add(10 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		var live int
		if err := t.b.pool.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE finished_at IS NULL`).Scan(&live); err != nil {
			return err
		}
		if live == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d tasks still live after 10 minutes", live)
		}
	}
	var failed int
	if err := t.b.pool.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE state <> 'completed'`).Scan(&failed); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d tasks did not complete", failed)
	}
	_, err := t.b.pool.Exec(ctx, `DELETE FROM tasks`)
	return err
}

// plain submits the tree's number of one-step tasks for the tree tenant, from 32
// producers.
func (t *treeBench) plain(ctx context.Context) error {
	return t.submitMany(ctx, t.keys[0], 1+t.o.Mids+t.o.Mids*t.o.Leaves)
}

// tree submits one root whose Mids children spawn Leaves leaves each.
func (t *treeBench) tree(ctx context.Context) error {
	leaf := map[string]any{"agent": "sim", "input": map[string]any{"step_ms": t.o.StepMs}}
	leaves := make([]any, t.o.Leaves)
	for i := range leaves {
		leaves[i] = leaf
	}
	mid := map[string]any{"agent": "sim", "input": map[string]any{"steps": 2, "step_ms": t.o.StepMs, "wait_children": true, "spawn": leaves}}
	// The middle tasks share one input: a loop is a spawn repeating an ancestor's
	// agent and input, not a sibling's.
	mids := make([]any, t.o.Mids)
	for i := range mids {
		mids[i] = mid
	}
	root := map[string]any{"agent": "sim", "input": map[string]any{"steps": 2, "step_ms": t.o.StepMs + 2, "wait_children": true, "spawn": mids}}
	return t.submit(ctx, t.keys[0], root)
}

func (t *treeBench) submitMany(ctx context.Context, key string, n int) error {
	task := map[string]any{"agent": "sim", "input": map[string]any{"step_ms": t.o.StepMs}}
	_, errs, first := produce(n, 32, func(int) error { return t.submit(ctx, key, task) })
	if errs > 0 {
		return fmt.Errorf("%d submissions failed, the first: %w", errs, first)
	}
	return nil
}

func (t *treeBench) submit(ctx context.Context, key string, task any) error {
	body, err := json.Marshal(task)
	if err != nil {
		return err
	}
	return submitTask(ctx, t.hc, t.b.base, key, body)
}

// machineBusyMs is the machine's busy time so far (/proc/stat: user, nice, system,
// irq, softirq), in ms: every process on it, Redis and Postgres included.
func machineBusyMs() (float64, error) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, fmt.Errorf("the machine's busy time: %w", err)
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("the machine's busy time: /proc/stat begins %q", line)
	}
	var jiffies float64
	for _, i := range []int{1, 2, 3, 6, 7} {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return 0, err
		}
		jiffies += v
	}
	return jiffies * 1000 / clockTicks, nil
}

// clockTicks is the kernel's USER_HZ, 100 on Linux.
const clockTicks = 100
