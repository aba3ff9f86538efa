package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentq/agentq/client"
)

// A tenant capped at one running task starts its queued tasks one after the other:
// their wait_reason gives each its place in the queue, 1..n in submission order, and
// once two of them started, an expected start derived from the measured start rate:
// later for each later place, by the same step (1 / rate), and near when the task
// actually starts (the tolerance is wide: the machine may be loaded).
func TestWaitReasonPositionAndExpectedStart(t *testing.T) {
	t.Parallel()
	h := start(t)
	ctx := context.Background()
	c, _ := h.tenantClient("eta", "pro", map[string]client.Limit{"running": 1})
	const n = 6
	ids := make([]string, n)
	for i := range ids {
		task, err := c.SubmitTask(ctx, sim(2, 300))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = task.ID
	}

	// Until two tasks started there is no rate: a place, but no expected start.
	var queued []client.Task
	deadline := time.Now().Add(30 * time.Second)
	for {
		page, err := c.ListTasks(ctx, client.ListTasksParams{State: client.StateQueued})
		if err != nil {
			t.Fatal(err)
		}
		queued = page.Tasks
		if len(queued) < 2 {
			t.Fatalf("only %d tasks still queued when the rate was first measured", len(queued))
		}
		if w := queued[0].WaitReason; w != nil && w.ExpectedStart != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no expected start after 30 s: %+v", queued[0].WaitReason)
		}
		time.Sleep(50 * time.Millisecond)
	}
	at := time.Now()

	// The listing is newest first; the queue is oldest first. The oldest may have
	// left the queue already, handed to the worker but not started: it has no place.
	places := make(map[string]int, len(queued))
	var expected []time.Time
	for i := len(queued) - 1; i >= 0; i-- {
		w := queued[i].WaitReason
		if w == nil || w.Until != nil {
			t.Fatalf("queued task %s: wait reason %+v", queued[i].ID, w)
		}
		if w.Position == 0 && len(places) == 0 {
			continue
		}
		if want := len(places) + 1; w.Position != want || w.ExpectedStart == nil {
			t.Fatalf("task %s at position %d (%+v), want %d", queued[i].ID, w.Position, w, want)
		}
		places[queued[i].ID] = w.Position
		expected = append(expected, *w.ExpectedStart)
	}
	if len(expected) < 2 {
		t.Fatalf("%d tasks in the queue when the rate was first measured, want 2 or more", len(expected))
	}
	step := expected[1].Sub(expected[0])
	if step <= 0 {
		t.Fatalf("expected starts %v do not grow with the position", expected)
	}
	for k := 1; k < len(expected); k++ {
		if d := expected[k].Sub(expected[k-1]) - step; d < -2*time.Millisecond || d > 2*time.Millisecond {
			t.Fatalf("expected starts %v: not one step (%v) apart", expected, step)
		}
	}
	// At one start per step, position 1 starts one step from the read.
	if first := expected[0].Sub(at); first > step+time.Second || first < -time.Second {
		t.Fatalf("position 1 expected %v after the read, one step is %v", first, step)
	}

	for id, place := range places {
		task := waitState(t, c, id, client.StateCompleted, 60*time.Second)
		want := expected[place-1]
		slack := 3*time.Second + want.Sub(at)/2
		if got := *task.StartedAt; got.Before(want.Add(-slack)) || got.After(want.Add(slack)) {
			t.Errorf("task at position %d started at %v, expected %v (±%v)", place, got, want, slack)
		}
	}
}
