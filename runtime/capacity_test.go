package runtime_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
	"github.com/agentq/agentq/quotas/capacity"
	"github.com/agentq/agentq/runtime"
)

// setOverrides replaces the rig tenant's overrides.
func (r *rig) setOverrides(ov map[string]quotas.Limit) {
	r.t.Helper()
	if _, err := r.st.UpdateTenant(r.ctx, store.UpdateTenantParams{ID: tenant, Overrides: ov}); err != nil {
		r.t.Fatal(err)
	}
}

// A step that cannot get its tenant's tokens per minute parks the task: the task goes
// back to queued with wait_reason tokens_per_minute, holds no running slot while it
// waits, keeps its session lease, and resumes at its next step with its state. The
// wait is not charged to its wall-clock budget, and the task reports it.
func TestStepWaitsForTokensPerMinuteWithoutAWorker(t *testing.T) {
	t.Parallel()
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	limits := func(tn store.Tenant) (quotas.Limits, error) {
		p, err := tenants.PolicyOf(plans, tn)
		return p.Limits, err
	}
	r := newRig(t, tasks.LifecycleOptions{Subscribers: []tasks.Subscriber{
		&outbox.Subscriber{Waits: outbox.Waits{Events: outbox.Events{}, Limits: limits}}}})
	// 1,000 tokens a second, a burst of 1,000: each 1,000-token step after the first
	// waits about a second.
	r.setOverrides(map[string]quotas.Limit{quotas.AITokensPerMinute: 60_000, quotas.AITokensPerMinute + "_burst": 1000})
	var mu sync.Mutex
	var stepped []time.Time
	count := counter(t)
	r.agents.Register("llm", stepFunc(func(ctx context.Context, req runtime.StepRequest) (runtime.StepResult, error) {
		mu.Lock()
		stepped = append(stepped, time.Now())
		mu.Unlock()
		res, err := count(ctx, req)
		res.NextStepTokens = 1000
		return res, err
	}))
	r.start()
	// Three steps take about two seconds of waiting; the wall clock allows 1.5 s.
	id := r.submit("llm", `{"steps":3,"tokens":1000}`, &tasks.BudgetRequest{MaxWallclockS: ptr(1.5)})

	// While it waits it is queued, says for what and until when, and holds no slot.
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := r.task(id)
		if got.State == agentqtype.TaskStateQueued && got.Usage.Steps >= 1 && got.Wait.Reason != nil {
			if agentqtype.WaitReason(*got.Wait.Reason) != agentqtype.WaitTokensPerMinute || got.Wait.Until == nil {
				t.Fatalf("parked task waits for %q until %v; want tokens_per_minute and a time", *got.Wait.Reason, got.Wait.Until)
			}
			// Postgres says queued first; the slots go back as the delivery returns.
			for held := time.Now().Add(2 * time.Second); r.slotHeld(id); time.Sleep(time.Millisecond) {
				if time.Now().After(held) {
					t.Fatal("a parked task holds its running slot")
				}
			}
			if !r.leaseHeld(id) {
				t.Fatal("a parked task lost its session lease")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the task never parked: %s, %d steps; log:\n%s", got.State, got.Usage.Steps, r.log)
		}
		time.Sleep(5 * time.Millisecond)
	}

	got := r.waitState(id, agentqtype.TaskStateCompleted)
	if got.Usage != (store.Usage{Steps: 3, Tokens: 3000}) || got.Error != nil {
		t.Fatalf("completed task: usage %+v, error %v", got.Usage, deref(got.Error))
	}
	var out struct{ N int }
	if err := json.Unmarshal(got.Output, &out); err != nil || out.N != 3 {
		t.Fatalf("output %s: the state did not survive the waits", got.Output)
	}
	if got.WaitedMs < 1500 {
		t.Fatalf("waited %d ms; want the two waits of about a second each", got.WaitedMs)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(stepped); i++ {
		// 1,000 tokens at 1,000 a second: never sooner than the bucket allows.
		if gap := stepped[i].Sub(stepped[i-1]); gap < 900*time.Millisecond {
			t.Fatalf("step %d ran %v after the previous one; the bucket allows one a second", i+1, gap)
		}
	}
	r.wantReleased(id)

	// The waits on the tenant's own limit are one usage.limit_hit, "delayed", per
	// minute (both waits fell in one minute, or in two).
	evs, err := r.st.ListEvents(r.ctx, store.ListEventsParams{TenantID: tenant, Type: outbox.TypeLimitHit, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) < 1 || len(evs) > 2 {
		t.Fatalf("%d limit_hit events for two waits; want one a minute", len(evs))
	}
	var ev struct {
		Data struct {
			LimitType   string `json:"limit_type"`
			Enforcement string `json:"enforcement"`
			LimitValue  int64  `json:"limit_value"`
		} `json:"data"`
	}
	if err := json.Unmarshal(evs[0].Payload, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Data.LimitType != quotas.AITokensPerMinute || ev.Data.Enforcement != "delayed" || ev.Data.LimitValue != 60_000 {
		t.Fatalf("limit_hit %s; want ai_tokens_per_minute, delayed, limit 60000", evs[0].Payload)
	}
}

// A throttled answer does not count: no step, no usage, nothing of the budget; the
// task waits the retry time without a worker and runs the step again.
func TestThrottledStepDoesNotCountAndWaits(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	count := counter(t)
	var mu sync.Mutex
	calls := map[int]int{}
	r.agents.Register("flaky", stepFunc(func(ctx context.Context, req runtime.StepRequest) (runtime.StepResult, error) {
		mu.Lock()
		calls[req.Step]++
		first := calls[req.Step] == 1
		mu.Unlock()
		if req.Step == 2 && first {
			return runtime.StepResult{Throttled: &runtime.Throttle{RetryAfterS: 0.3}, Usage: runtime.StepUsage{Tokens: 999}}, nil
		}
		return count(ctx, req)
	}))
	r.start()
	began := time.Now()
	id := r.submit("flaky", `{"steps":2,"tokens":10}`, &tasks.BudgetRequest{MaxSteps: ptr(2)})
	got := r.waitState(id, agentqtype.TaskStateCompleted)
	if got.Usage != (store.Usage{Steps: 2, Tokens: 20}) {
		t.Fatalf("usage %+v; want the two steps that ran, and not the throttled one", got.Usage)
	}
	if n := r.ledgerRows(id); n != 6 {
		t.Fatalf("ledger: %d rows, want 3 meters for each of 2 steps", n)
	}
	if took := time.Since(began); took < 300*time.Millisecond {
		t.Fatalf("finished %v after submission; the throttled step waited less than its retry time", took)
	}
	if got.WaitedMs != 0 {
		t.Fatalf("waited %d ms uncharged; a wait after a throttled answer counts toward the wall clock", got.WaitedMs)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls[2] != 2 {
		t.Fatalf("step 2 was called %d times, want 2 (throttled, then run)", calls[2])
	}
}

// A task cancelled while parked ends killed and releases everything: its lease, and
// its place in the parked set, so it is never dispatched again.
func TestCancelWhileParkedReleasesEverything(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.setOverrides(map[string]quotas.Limit{quotas.AITokensPerMinute: 60, quotas.AITokensPerMinute + "_burst": 100})
	var mu sync.Mutex
	steps := 0
	count := counter(t)
	r.agents.Register("llm", stepFunc(func(ctx context.Context, req runtime.StepRequest) (runtime.StepResult, error) {
		mu.Lock()
		steps++
		mu.Unlock()
		res, err := count(ctx, req)
		res.NextStepTokens = 100
		return res, err
	}))
	r.start()
	id := r.submit("llm", `{"steps":3,"tokens":100}`, nil)
	deadline := time.Now().Add(5 * time.Second)
	for {
		// Parked in both stores: Postgres records the wait before Redis's parked set
		// takes the task, and the cancel is to find it in both.
		if got := r.task(id); got.State == agentqtype.TaskStateQueued && got.Wait.Reason != nil {
			if parked, err := r.sched.IsParked(r.ctx, tenant, id.String()); err == nil && parked {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the task never parked; log:\n%s", r.log)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := r.svc.Cancel(r.ctx, tenant, id); err != nil {
		t.Fatal(err)
	}
	got := r.waitState(id, agentqtype.TaskStateKilled)
	if got.Usage.Steps != 1 {
		t.Fatalf("usage %+v; want the one step before the wait", got.Usage)
	}
	r.wantReleased(id)
	if parked, err := r.sched.IsParked(r.ctx, tenant, id.String()); err != nil || parked {
		t.Fatalf("IsParked = %v, %v after the cancel", parked, err)
	}
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if steps != 1 {
		t.Fatalf("%d steps ran; a cancelled parked task ran again", steps)
	}
}

// staticPools binds agents to pools from a map.
type staticPools map[string]quotas.PoolBinding

func (p staticPools) Binding(_ context.Context, agent string) (quotas.PoolBinding, bool, error) {
	b, ok := p[agent]
	return b, ok, nil
}

// With the quota store unreachable no step runs unreserved: a step of an agent bound
// to a pool, and one of an agent bound to none, both send the task back to queued
// without calling the agent.
func TestNoStepRunsUnreservedWhenRedisIsDown(t *testing.T) {
	t.Parallel()
	for _, bound := range []bool{true, false} {
		t.Run(map[bool]string{true: "pool", false: "no pool"}[bound], func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			var mu sync.Mutex
			called := 0
			r.agents.Register("llm", stepFunc(func(context.Context, runtime.StepRequest) (runtime.StepResult, error) {
				mu.Lock()
				called++
				mu.Unlock()
				return runtime.StepResult{Done: true}, nil
			}))
			// A Redis nobody listens on, for the limits alone.
			dead := testenv.DeadRedis(t)
			pools := staticPools{}
			if bound {
				pools["llm"] = quotas.PoolBinding{Pool: quotas.PoolConfig{Name: "llm", TokensPerMinute: 60_000}, TokensPerStep: 100}
			}
			w := runtime.NewWorker(r.lc, r.st, r.agents, r.sched, limits{admission.New(dead, r.keys, nil), capacity.NewPools(dead, r.keys, nil)}, r.rdb, runtime.WorkerOptions{
				Concurrency: 1, Pools: pools, ShutdownTimeout: time.Second,
			})
			id := r.submit("llm", `{}`, nil)
			if err := w.ProcessTask(r.ctx, r.take()); err == nil {
				t.Fatal("the delivery succeeded with the quota store down; want it handed back")
			}
			if got := r.task(id); got.State != agentqtype.TaskStateQueued || got.Usage.Steps != 0 {
				t.Fatalf("task %s with %d steps; want queued with none", got.State, got.Usage.Steps)
			}
			mu.Lock()
			defer mu.Unlock()
			if called != 0 {
				t.Fatalf("the agent ran %d steps without a reservation", called)
			}
		})
	}
}

// bindPools rebuilds the rig's worker (before start) with its agents bound to pools.
func (r *rig) bindPools(pools staticPools) {
	r.t.Helper()
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		r.t.Fatal(err)
	}
	queues := map[string]int{r.keys.TaskQueue(): 1}
	logger := slog.New(slog.NewTextHandler(r.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r.w = runtime.NewWorker(r.lc, r.st, r.agents, r.sched, r.q, r.rdb, runtime.WorkerOptions{
		Concurrency: 2, Fetchers: 2, Queues: queues, CancelChannel: r.keys.CancelChannel(),
		ShutdownTimeout: time.Second, TaskCheckInterval: 10 * time.Millisecond, Pools: pools,
		Archetype: &baseservice.Archetype{Logger: logger}, Policies: tenants.NewPolicies(plans, 16), Events: r.keys.TaskEvents,
	})
}

// A task whose agent's upstream refuses every step ends at its wall clock: the waits
// after throttled answers count toward it (they are not capacity waits), and a wait
// that would end past it stops (here: pauses, as the plan says) the task at once,
// saying why. While it waits, its
// wait_reason names the pool it was throttled on.
func TestThrottledForeverEndsAtItsWallClock(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.bindPools(staticPools{"noisy": {Pool: quotas.PoolConfig{Name: "shared", TokensPerMinute: 60_000, BurstTokens: 3000}, TokensPerStep: 1000}})
	var mu sync.Mutex
	calls := 0
	r.agents.Register("noisy", stepFunc(func(context.Context, runtime.StepRequest) (runtime.StepResult, error) {
		mu.Lock()
		calls++
		mu.Unlock()
		return runtime.StepResult{Throttled: &runtime.Throttle{RetryAfterS: 0.2}}, nil
	}))
	r.start()
	began := time.Now()
	id := r.submit("noisy", `{}`, &tasks.BudgetRequest{MaxWallclockS: ptr(1.0)})
	sawReason := ""
	deadline := time.Now().Add(8 * time.Second)
	for {
		got := r.task(id)
		if got.Wait.Reason != nil && sawReason == "" {
			sawReason = *got.Wait.Reason
		}
		if got.State == agentqtype.TaskStatePaused { // the plan pauses at the wall clock
			if got.Pause.Reason == nil || *got.Pause.Reason != string(quotas.TaskMaxWallclock) {
				t.Fatalf("paused for %q; want the wall clock", deref(got.Pause.Reason))
			}
			// The wall clock runs out either where a throttled answer's wait would pass
			// it, or, under load, at the check before the next step. The worker says
			// which once the pause has committed: wait for its line.
			saysWhy := func(l string) bool {
				return strings.Contains(l, "the agent's upstream throttled step 1") || strings.Contains(l, "max_wallclock_s 1 reached")
			}
			for l := r.log.String(); !saysWhy(l); l = r.log.String() {
				if time.Now().After(deadline) {
					t.Fatalf("nothing says the wall clock ran out; log:\n%s", l)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if got.WaitedMs != 0 {
				t.Fatalf("waited %d ms uncharged; the waits after throttled answers count toward the wall clock", got.WaitedMs)
			}
			break
		}
		if time.Now().After(deadline) {
			mu.Lock()
			n := calls
			mu.Unlock()
			t.Fatalf("after %v the task is %s (waited %d ms, %d calls), want paused at its 1 s wall clock", time.Since(began), got.State, got.WaitedMs, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if agentqtype.WaitReason(sawReason) != agentqtype.WaitThrottled("shared") {
		t.Fatalf("wait_reason while throttled %q, want throttled:shared", sawReason)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("ended %v after submission, want about its 1 s wall clock", took)
	}
	r.wantReleased(id)
}
