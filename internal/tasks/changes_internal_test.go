package tasks

import (
	"testing"

	"github.com/google/uuid"

	"github.com/agentq/agentq/internal/store"
)

// A shared write's changes come back per task in the order they were noted, a task
// noted in two places with both; appending to one task's changes leaves the next
// task's alone.
func TestChangesByID(t *testing.T) {
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	ch := func(id uuid.UUID, step int) Change {
		return Change{Kind: ChangeStep, Task: store.Task{ID: id}, Step: step}
	}
	made := []Change{ch(a, 1), ch(a, 2), ch(b, 1), ch(c, 1), ch(b, 2)}
	byID := changesByID(made)
	steps := func(id uuid.UUID) (out []int) {
		for _, c := range byID[id] {
			if c.Task.ID != id {
				t.Fatalf("task %v got a change of %v", id, c.Task.ID)
			}
			out = append(out, c.Step)
		}
		return out
	}
	if got := steps(a); len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("a's steps %v", got)
	}
	if got := steps(b); len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("b's steps %v", got)
	}
	if got := steps(c); len(got) != 1 || got[0] != 1 {
		t.Fatalf("c's steps %v", got)
	}
	_ = append(byID[a], ch(a, 3))
	if made[2].Task.ID != b || byID[b][0].Task.ID != b {
		t.Fatal("appending to a's changes overwrote b's")
	}
	if len(changesByID(nil)) != 0 {
		t.Fatal("no changes, yet some task has some")
	}
}
