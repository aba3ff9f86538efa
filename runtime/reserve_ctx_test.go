package runtime_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/runtime"
)

// answerCut is the worker's quota store with a delivery cancelled while a step's
// reservation is on its way back: Redis has taken the step when the delivery ends,
// and a call made on the delivery's context loses the answer, as go-redis does for a
// context that ends during its read.
type answerCut struct {
	limits
	cancel context.CancelFunc
}

func (a answerCut) ReserveStep(ctx context.Context, p quotas.StepParams, along ...func(redis.Pipeliner)) error {
	err := a.limits.ReserveStep(context.WithoutCancel(ctx), p, along...)
	a.cancel()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// A delivery cancelled while its step's reservation is in flight still reads the
// answer, so what the reservation took goes back: the tenant's step quota counts
// only the steps that ran.
func TestReservationOutlivesItsDeliveryCancel(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.agents.Register("a", counter(t))
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	w := runtime.NewWorker(r.lc, r.st, r.agents, r.sched, answerCut{limits: r.q, cancel: cancel}, r.rdb, runtime.WorkerOptions{
		Concurrency: 1, ShutdownTimeout: time.Second, Policies: tenants.NewPolicies(plans, 16),
		Archetype: &baseservice.Archetype{Logger: slog.New(slog.NewTextHandler(r.log, nil))},
	})
	id := r.submit("a", `{"tokens":3}`, nil)
	_ = w.ProcessTask(ctx, r.take()) // the delivery ends cancelled: its error is not under test
	if err := w.Flush(r.ctx); err != nil {
		t.Fatal(err)
	}
	got := r.task(id)
	if got.State == agentqtype.TaskStateCompleted {
		t.Fatalf("the cancelled delivery completed the task")
	}
	if counted := r.stepsCounted(); counted != got.Usage.Steps {
		t.Fatalf("the tenant's step quota counts %d steps after a delivery cancelled mid-reservation, want %d (the steps that ran); log:\n%s",
			counted, got.Usage.Steps, r.log)
	}
}
