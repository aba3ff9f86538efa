package store_test

import (
	"slices"
	"testing"

	"github.com/google/uuid"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv/testfactory"
)

// The usage report's live tasks: both counts, and the first of them, running before
// queued and oldest first within each, from one tenant only, finished ones left out.
func TestListLiveTasks(t *testing.T) {
	t.Parallel()
	ctx, st, pool := setup(t)
	if _, err := st.CreateTenant(ctx, store.CreateTenantParams{ID: "other", Name: "Other", Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	empty, err := st.ListLiveTasks(ctx, store.LiveTasksParams{TenantID: "acme", Limit: 3})
	if err != nil || empty.Running != 0 || empty.Queued != 0 || len(empty.Tasks) != 0 {
		t.Fatalf("no tasks: %+v %v", empty, err)
	}
	var ids []uuid.UUID
	for range 6 {
		ids = append(ids, newTask(t, ctx, st, "acme"))
	}
	newTask(t, ctx, st, "other")
	// ids[4] and ids[2] run, ids[5] has ended; ids[0], ids[1], ids[3] are queued.
	for _, i := range []int{4, 2, 5} {
		if _, ok, err := st.UnscopedStartTask(ctx, ids[i]); err != nil || !ok {
			t.Fatalf("start %d: %v %v", i, ok, err)
		}
	}
	testfactory.TaskEnded(t, pool, ids[5], "completed")

	for _, tc := range []struct {
		limit int
		want  []int
	}{
		{10, []int{2, 4, 0, 1, 3}},
		{3, []int{2, 4, 0}},
		{1, []int{2}},
	} {
		live, err := st.ListLiveTasks(ctx, store.LiveTasksParams{TenantID: "acme", Limit: tc.limit})
		if err != nil {
			t.Fatal(err)
		}
		if live.Running != 2 || live.Queued != 3 {
			t.Errorf("limit %d: running %d queued %d, want 2 and 3", tc.limit, live.Running, live.Queued)
		}
		var got []int
		for _, lt := range live.Tasks {
			got = append(got, slices.Index(ids, lt.ID))
			if lt.TenantID != "acme" || lt.Agent != "sim" || lt.CreatedAt.IsZero() {
				t.Errorf("task %v: %+v", lt.ID, lt)
			}
			if running := lt.State == agentqtype.TaskStateRunning; running != (lt.StartedAt != nil) {
				t.Errorf("task %v: state %s, started at %v", lt.ID, lt.State, lt.StartedAt)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("limit %d: tasks %v, want %v", tc.limit, got, tc.want)
		}
	}
	if _, err := st.ListLiveTasks(ctx, store.LiveTasksParams{TenantID: "acme"}); err == nil {
		t.Error("limit 0 accepted")
	}
}
