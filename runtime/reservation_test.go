package runtime_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/runtime"
)

// reservationTrips counts the round trips to Redis that carry a call on any of keys.
type reservationTrips struct {
	keys  []string
	mu    sync.Mutex
	trips int
}

func (h *reservationTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *reservationTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}
func (h *reservationTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.count(cmds)
		return next(ctx, cmds)
	}
}

func (h *reservationTrips) count(cmds []redis.Cmder) {
	for _, c := range cmds {
		for _, k := range h.keys {
			if slices.Contains(c.Args(), any(k)) {
				h.mu.Lock()
				h.trips++
				h.mu.Unlock()
				return
			}
		}
	}
}

func (h *reservationTrips) n() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.trips
}

// A step of an agent bound to an uncontended model pool reserves its quotas and its
// pool in one round trip and settles both in one; the last step settles its pool at once and its
// quotas with the task's end, in the round trip of its "done" report. Every step here
// settles something: its tokens differ from its estimate and its cost from the
// previous step's.
func TestStepReservationRoundTrips(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	pool := quotas.PoolConfig{Name: "llm", TokensPerMinute: 6_000_000, BurstTokens: 1_000_000}
	r.agents.Register("llm", stepFunc(func(_ context.Context, req runtime.StepRequest) (runtime.StepResult, error) {
		return runtime.StepResult{Done: req.Step == 3, NextStepTokens: 1,
			Usage: runtime.StepUsage{Tokens: int64(7 + 100*req.Step), CostUSD: 0.001 * float64(req.Step)}}, nil
	}))
	w := r.pooledWorker(pool, 100)
	// A first task loads the scripts, so that no reload is counted.
	r.submit("llm", `{}`, nil)
	r.deliver(w)
	id := r.submit("llm", `{}`, nil)
	hook := &reservationTrips{keys: []string{r.keys.AdmissionState(tenant), r.keys.PoolState(pool.Name)}}
	r.rdb.AddHook(hook)
	r.deliver(w)
	if got := r.task(id); got.State != agentqtype.TaskStateCompleted || got.Usage.Steps != 3 {
		t.Fatalf("task %s after %d steps; want completed after 3", got.State, got.Usage.Steps)
	}
	// Per step: the reservation of the quotas with the pool's try, and their
	// settlement (the last step's pool alone); then the end's settlement of the last
	// step's quotas.
	if n := hook.n(); n != 3*2+1 {
		t.Fatalf("%d round trips on the tenant's quotas and the pool for 3 steps; want %d", n, 3*2+1)
	}
}
