package e2e_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/client"
)

// A task submitted with start_within_s that no worker takes in time expires within
// about a second of its deadline, while the only worker slot stays busy: nothing is
// charged, its session lease goes back and its queue is empty. A task of the same
// tenant whose deadline is far off waits and then runs as any other.
func TestStartDeadlineExpiresAWaitingTask(t *testing.T) {
	t.Parallel()
	h := start(t, func(o *agentq.Options) { o.Config.WorkerConcurrency = 1; o.Config.Prefetch = 0 })
	ctx := context.Background()
	c, _ := h.tenantClient("late", "pro", nil)
	long, err := c.SubmitTask(ctx, sim(200, 100))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, c, long.ID, "running", 10*time.Second)

	req := sim(1, 1)
	req.StartWithinS = ptr(1.0)
	doomed, err := c.SubmitTask(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if doomed.StartDeadline == nil || !doomed.StartDeadline.Equal(doomed.CreatedAt.Add(time.Second)) {
		t.Fatalf("start deadline %v, created %v", doomed.StartDeadline, doomed.CreatedAt)
	}
	patient := sim(1, 1)
	patient.StartWithinS = ptr(600.0)
	timely, err := c.SubmitTask(ctx, patient)
	if err != nil {
		t.Fatal(err)
	}

	got := waitState(t, c, doomed.ID, client.StateExpired, 15*time.Second)
	if got.StartedAt != nil || got.Attempt != 0 || got.Usage.Steps != 0 || got.Usage.CostUSD != 0 || got.Error == nil || got.WaitReason != nil {
		t.Fatalf("expired task %+v", got)
	}
	if !client.IsTerminal(got.State) {
		t.Fatal("expired is not terminal for the client")
	}
	queued, err := h.app.Scheduler().QueueLen(ctx, "late")
	if err != nil || queued != 1 {
		t.Fatalf("the tenant's queue holds %d (%v), want the timely task alone", queued, err)
	}
	sessions, _, err := h.app.Quotas().LeaseMembers(ctx, []string{"late"})
	if err != nil || slices.Contains(sessions[0], doomed.ID) || !slices.Contains(sessions[0], timely.ID) {
		t.Fatalf("leases %v (%v): the expired task's must be gone, the timely one's kept", sessions, err)
	}
	if _, err := c.CancelTask(ctx, doomed.ID); err == nil {
		t.Fatal("cancelled an expired task")
	}
	if v, ok := sample(h.scrape(), "agentq_tasks_finished_total", map[string]string{"state": "expired"}); !ok || v != 1 {
		t.Fatalf("agentq_tasks_finished_total{state=expired} = %v (present %v), want 1", v, ok)
	}

	if _, err := c.CancelTask(ctx, long.ID); err != nil {
		t.Fatal(err)
	}
	if done := waitState(t, c, timely.ID, client.StateCompleted, 15*time.Second); done.StartDeadline == nil {
		t.Fatalf("the timely task lost its deadline: %+v", done)
	}
	page, err := c.ListTasks(ctx, client.ListTasksParams{State: client.StateExpired})
	if err != nil || len(page.Tasks) != 1 || page.Tasks[0].ID != doomed.ID {
		t.Fatalf("listing expired tasks: %+v %v", page, err)
	}
}
