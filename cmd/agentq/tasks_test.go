package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv/testfactory"
)

// agentq admin task-resume resumes a paused task through the tasks service: a raise
// past the plan's ceiling is refused as the API refuses it, and nothing changes; one
// within it queues the task with its new budget; a task that is not paused is refused.
func TestCLIResumesAPausedTask(t *testing.T) {
	ctx := context.Background()
	h := newAdminHarness(t)
	if _, err := h.cli("tenant-create", "--id", "cli-pause", "--plan", "pro"); err != nil {
		t.Fatal(err)
	}
	id := uuid.Must(uuid.NewV7())
	if _, _, err := h.store.InsertTask(ctx, store.InsertTaskParams{ID: id, TenantID: "cli-pause", Kid: "k", Agent: "sim",
		Input: json.RawMessage(`{}`), Budget: json.RawMessage(`{"max_steps":2,"max_wallclock_s":60,"max_cost_usd":1}`), RequestHash: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.cli("task-resume", id.String(), "--tenant", "cli-pause"); err == nil || !strings.Contains(err.Error(), "not paused") {
		t.Fatalf("resume of a queued task: %v", err)
	}
	running, _, err := h.store.UnscopedStartTask(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.store.UnscopedPauseTask(ctx, store.UnscopedPauseTaskParams{Claim: store.Claim{ID: id, Attempt: running.Attempt},
		Reason: "task_max_steps", Limit: 2, Used: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.cli("task-resume", id.String(), "--tenant", "cli-pause", "--max-steps", "21"); err == nil || !strings.Contains(err.Error(), "ceiling of 20") {
		t.Fatalf("a raise past the ceiling: %v", err)
	}
	out, err := h.cli("task-resume", id.String(), "--tenant", "cli-pause", "--max-steps", "5")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		State  string
		Budget struct {
			MaxSteps int `json:"max_steps"`
		}
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.State != "queued" || got.Budget.MaxSteps != 5 {
		t.Fatalf("resumed: %s (%v)", out, err)
	}
	if t2, err := h.store.GetTask(ctx, store.GetTaskParams{TenantID: "cli-pause", ID: id}); err != nil || t2.State != agentqtype.TaskStateQueued || t2.Pause.Reason != nil {
		t.Fatalf("stored: %+v %v", t2, err)
	}
}

// agentq admin task-tree prints a task's whole tree, from the task or any of its
// descendants, as the API shows it.
func TestCLIPrintsATaskTree(t *testing.T) {
	ctx := context.Background()
	h := newAdminHarness(t)
	if _, err := h.cli("tenant-create", "--id", "cli-tree", "--plan", "pro"); err != nil {
		t.Fatal(err)
	}
	root, kid := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	for _, id := range []uuid.UUID{root, kid} {
		if _, _, err := h.store.InsertTask(ctx, store.InsertTaskParams{ID: id, TenantID: "cli-tree", Kid: "k", Agent: "sim",
			Input: json.RawMessage(`{}`), Budget: json.RawMessage(`{"max_steps":2,"max_wallclock_s":60,"max_cost_usd":1}`), RequestHash: []byte{1}}); err != nil {
			t.Fatal(err)
		}
	}
	testfactory.TaskChildOf(t, h.store.Pool(), kid, root, 0)
	out, err := h.cli("task-tree", kid.String(), "--tenant", "cli-tree")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		RootID string `json:"root_id"`
		Nodes  []struct {
			ID    string `json:"id"`
			Depth int    `json:"depth"`
		} `json:"nodes"`
		Remaining struct {
			Tasks int `json:"tasks"`
		} `json:"remaining"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.RootID != root.String() || len(got.Nodes) != 2 ||
		got.Nodes[1].ID != kid.String() || got.Nodes[1].Depth != 1 || got.Remaining.Tasks != 48 {
		t.Fatalf("task-tree: %s (%v)", out, err)
	}
	if _, err := h.cli("task-tree", kid.String(), "--tenant", "someone-else"); err == nil {
		t.Fatal("task-tree of another tenant's task answered")
	}
}
