package runtime_test

import (
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/runtime"
)

// pooledWorker is a worker of the rig whose agent "llm" draws on pool, with the
// plans' policies (the tenant's limits and weight): it runs one delivery at a time
// (ProcessTask).
func (r *rig) pooledWorker(pool quotas.PoolConfig, perStep int64, mp ...metric.MeterProvider) *runtime.Worker {
	r.t.Helper()
	arch := &baseservice.Archetype{Logger: slog.New(slog.NewTextHandler(r.log, nil))}
	if len(mp) > 0 {
		arch.MeterProvider = mp[0]
	}
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		r.t.Fatal(err)
	}
	return runtime.NewWorker(r.lc, r.st, r.agents, r.sched, r.q, r.rdb, runtime.WorkerOptions{
		Concurrency: 1, ShutdownTimeout: time.Second, Policies: tenants.NewPolicies(plans, 16),
		Pools:     staticPools{"llm": {Pool: pool, TokensPerStep: perStep}},
		Archetype: arch,
	})
}

// deliver runs one delivery of the next dispatched task on w.
func (r *rig) deliver(w *runtime.Worker) {
	r.t.Helper()
	if err := w.ProcessTask(r.ctx, r.take()); err != nil {
		r.t.Fatalf("delivery: %v", err)
	}
	if err := w.Flush(r.ctx); err != nil {
		r.t.Fatal(err)
	}
}

// poolOf reads a field of the pool's state hash and whether the tenant has a place
// in its line.
func (r *rig) poolOf(pool, field string) (string, bool) {
	r.t.Helper()
	v, _ := r.rdb.HGet(r.ctx, r.keys.PoolState(pool), field).Result()
	_, err := r.rdb.ZScore(r.ctx, r.keys.PoolWaiters(pool), tenant).Result()
	return v, err == nil
}

// drainPool takes debt tokens off a pool's bucket, as another tenant's steps that used
// more than they reserved: the pool refuses the rig tenant's next ask for about
// (debt − the level) ÷ its rate.
func (r *rig) drainPool(pool quotas.PoolConfig, debt int64) {
	r.t.Helper()
	if _, err := r.q.SettlePool(r.ctx, nil, quotas.PoolSettleParams{Pool: pool, Tenant: "other", Tokens: debt}); err != nil {
		r.t.Fatal(err)
	}
}

// A step its tenant's own tokens per minute holds back keeps nothing of the pool: it
// takes no place in the pool's line, and the request and tokens its try was granted in
// the same round trip go back at once (the level differs from step 1's by the refill
// alone); it parks on the longer of the two waits (here its own, 100 s, not the
// pool's 10 s).
func TestStepHeldByItsOwnLimitLeavesThePoolAlone(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.setOverrides(map[string]quotas.Limit{quotas.AITokensPerMinute: 60, quotas.AITokensPerMinute + "_burst": 100})
	count := counter(t)
	r.agents.Register("llm", stepFunc(func(ctx context.Context, req runtime.StepRequest) (runtime.StepResult, error) {
		res, err := count(ctx, req)
		res.NextStepTokens = 100
		return res, err
	}))
	pool := quotas.PoolConfig{Name: "llm", TokensPerMinute: 60_000, BurstTokens: 1000, RequestsPerMinute: 60}
	w := r.pooledWorker(pool, 100)
	id := r.submit("llm", `{"steps":3,"tokens":100}`, nil)
	began := time.Now()
	r.deliver(w) // step 1 runs; step 2 waits 100 s for the tenant's own bucket
	got := r.task(id)
	if got.State != agentqtype.TaskStateQueued || got.Usage.Steps != 1 || got.Wait.Reason == nil || agentqtype.WaitReason(*got.Wait.Reason) != agentqtype.WaitTokensPerMinute {
		t.Fatalf("task %s, %d steps, wait %v; want queued after one step, waiting for tokens_per_minute", got.State, got.Usage.Steps, got.Wait.Reason)
	}
	// The level refills 1 a second from step 1's request on: at most what the time
	// since the delivery began gives. Had step 2 kept its request, the level would be
	// a whole request lower (58 and the refill), which tells the two apart while the
	// refill is under a request.
	reqs, placed := r.poolOf("llm", "r")
	refill := time.Since(began).Seconds()
	low := 58.95
	if refill >= 0.9 {
		low = 58 // too slow a run to tell them apart: the line alone is checked
	}
	if !within(reqs, low, 59.05+refill) || placed {
		t.Fatalf("the pool's requests level %q %.2f s after the delivery began, tenant in its line %v; want 59 (step 1's request alone) plus at most the refill since, and no place", reqs, refill, placed)
	}
	if vt, _ := r.poolOf("llm", "v"); vt != "0" {
		t.Fatalf("the pool's virtual time %q after a step that never asked it; want 0", vt)
	}

	// Both hold it back: it parks on the longer wait, its own, and takes no place in line.
	r.drainPool(pool, 9000) // the pool expects 10 s
	id2 := r.submit("llm", `{"steps":1,"tokens":100}`, nil)
	r.deliver(w)
	got = r.task(id2)
	if got.Wait.Reason == nil || agentqtype.WaitReason(*got.Wait.Reason) != agentqtype.WaitTokensPerMinute || got.Wait.Until == nil || time.Until(*got.Wait.Until) < 60*time.Second {
		t.Fatalf("task waits for %v until %v; want tokens_per_minute, about 100 s from now", deref(got.Wait.Reason), got.Wait.Until)
	}
	if _, placed := r.poolOf("llm", "r"); placed {
		t.Fatal("a step held back by its own limit took a place in the pool's line")
	}
}

// A step a quota refuses stops or pauses its task at once (its plan's on_limit),
// whatever the pool says: it does not park on the pool first.
func TestStepAtAQuotaPausesWithoutWaitingForThePool(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.setOverrides(map[string]quotas.Limit{quotas.AITokensMonthly: 150})
	count := counter(t)
	pool := quotas.PoolConfig{Name: "llm", TokensPerMinute: 60_000, BurstTokens: 1000}
	r.agents.Register("llm", stepFunc(func(ctx context.Context, req runtime.StepRequest) (runtime.StepResult, error) {
		res, err := count(ctx, req)
		res.NextStepTokens = 100
		r.drainPool(pool, 9000) // the pool would hold step 2 back 10 s
		return res, err
	}))
	w := r.pooledWorker(pool, 100)
	id := r.submit("llm", `{"steps":3,"tokens":100}`, nil)
	r.deliver(w) // step 1 runs; step 2 would go past ai_tokens_monthly
	got := r.task(id)
	if got.State != agentqtype.TaskStatePaused || got.Usage.Steps != 1 {
		t.Fatalf("task %s with %d steps, wait %v; want paused at ai_tokens_monthly after one step", got.State, got.Usage.Steps, deref(got.Wait.Reason))
	}
	if _, placed := r.poolOf("llm", "r"); placed {
		t.Fatal("a step refused by a quota took a place in the pool's line")
	}
}

// within reports whether the number s is in [lo, hi].
func within(s string, lo, hi float64) bool {
	f, err := strconv.ParseFloat(s, 64)
	return err == nil && f >= lo && f <= hi
}

// unparkNext waits until a parked task is due and queues it again.
func (r *rig) unparkNext() {
	r.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n, _, err := r.sched.Unpark(r.ctx)
		if err != nil {
			r.t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatal("no parked task came due")
		}
	}
}

// Each step that runs is metered with the times it parked before it ran
// (agentq.step_parks): here a step the pool sent back twice.
func TestStepParksAreMetered(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.agents.Register("llm", counter(t))
	reader := sdkmetric.NewManualReader()
	pool := quotas.PoolConfig{Name: "llm", TokensPerMinute: 60_000, BurstTokens: 1000}
	w := r.pooledWorker(pool, 100, sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	id := r.submit("llm", `{"steps":1,"tokens":100}`, nil)
	for range 2 {
		r.drainPool(pool, 1100) // the pool holds the step back 200 ms or more
		r.deliver(w)
		if got := r.task(id); got.State != agentqtype.TaskStateQueued || got.Wait.Reason == nil {
			t.Fatalf("task %s, waiting for %v; want parked for the pool", got.State, deref(got.Wait.Reason))
		}
		r.unparkNext()
	}
	r.deliver(w)
	if got := r.task(id); got.State != agentqtype.TaskStateCompleted {
		t.Fatalf("task %s; want completed", got.State)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(r.ctx, &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "agentq.step_parks" {
				continue
			}
			dps := m.Data.(metricdata.Histogram[int64]).DataPoints
			if len(dps) != 1 || dps[0].Count != 1 || dps[0].Sum != 2 {
				t.Fatalf("agentq.step_parks %+v; want one step that parked twice", dps)
			}
			return
		}
	}
	t.Fatal("agentq.step_parks is not exported")
}

// A task cancelled while it waits for a pool takes its tenant's place in the pool's
// line with it: the tenants behind need not wait for the place to lapse.
func TestCancelWhileWaitingForAPoolLeavesItsLine(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.agents.Register("llm", counter(t))
	pool := quotas.PoolConfig{Name: "llm", TokensPerMinute: 60_000, BurstTokens: 1000}
	w := r.pooledWorker(pool, 100)
	r.drainPool(pool, 9000) // the pool expects the step's tokens in about 8 s
	id := r.submit("llm", `{"steps":1,"tokens":100}`, nil)
	r.deliver(w)
	if _, placed := r.poolOf(pool.Name, "l"); !placed {
		t.Fatalf("the task waiting for the pool has no place in its line; task %+v", r.task(id).Wait)
	}
	if _, err := r.svc.Cancel(r.ctx, tenant, id); err != nil {
		t.Fatal(err)
	}
	if _, placed := r.poolOf(pool.Name, "l"); placed {
		t.Fatal("the cancelled task's tenant keeps its place in the pool's line")
	}
}
