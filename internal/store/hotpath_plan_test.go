package store_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/agentq/agentq/internal/store"
)

// The start of a batch of tasks reads those tasks by primary key, with the generic
// plan the application runs it with, while the statistics do not know the backlog (a
// backlog that grew since the last analyze): not every queued task to pick the
// batch's out.
func TestStartReadsItsTasksByKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	seedPool, pool, rec := recordedSchema(t)
	for _, q := range []string{
		`INSERT INTO tenants (id, name, plan) VALUES ('acme', 'Acme', 'pro')`,
		// Analyzed with 20,000 ended tasks and 3 queued ones; then 3,000 more queued.
		`INSERT INTO tasks (id, tenant_id, kid, agent, request_hash, state, finished_at)
		 SELECT gen_random_uuid(), 'acme', 'k', 'sim', '\x00', 'completed', now() FROM generate_series(1, 20000)`,
		`INSERT INTO tasks (id, tenant_id, kid, agent, request_hash)
		 SELECT gen_random_uuid(), 'acme', 'k', 'sim', '\x00' FROM generate_series(1, 3)`,
		`ANALYZE tasks`,
		`INSERT INTO tasks (id, tenant_id, kid, agent, request_hash)
		 SELECT gen_random_uuid(), 'acme', 'k', 'sim', '\x00' FROM generate_series(1, 3000)`,
	} {
		if _, err := seedPool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	pick := func(state string) []uuid.UUID {
		rows, err := seedPool.Query(ctx, `SELECT id FROM tasks WHERE state = $1 ORDER BY random() LIMIT 4`, state)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var ids []uuid.UUID
		for rows.Next() {
			var id uuid.UUID
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		return ids
	}
	st := store.New(pool)

	started, err := st.UnscopedStartTasks(ctx, pick("queued"))
	if err != nil || len(started) != 4 {
		t.Fatalf("started %d tasks, %v", len(started), err)
	}
	if read := readOfTasks(explainAsRun(t, ctx, pool, rec.find(t, "started AS"))); read > 10 {
		t.Errorf("starting 4 tasks read %v rows of tasks (want 4)", read)
	}
}

// A page of a tenant's tasks, in every state or in a rare one, reads about a page of
// rows, whatever the tenant's history holds, with the generic plans the application
// runs: the listing has no index of its own (see migration 00029).
// readOfTasks is the most rows a scan of tasks in plan read.
func readOfTasks(plan planNode) float64 {
	var read float64
	plan.walk(func(n planNode) {
		if n.Relation == "tasks" || strings.HasPrefix(n.Index, "tasks_") {
			read = max(read, (n.ActualRows+n.RowsRemoved)*max(n.ActualLoops, 1))
		}
	})
	return read
}

// A young deployment's connections make their generic plans while tasks is nearly
// empty, and keep them while it grows: nothing replaces a cached plan before the next
// analyze. The start and the last step still read their tasks by key then (the last
// step, or the few running tasks: as many as the workers' slots), not every queued or
// ended task once per batch.
func TestHotStatementsPlannedOnAnEmptyTableReadByKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	seedPool, pool, rec := recordedSchema(t)
	if _, err := seedPool.Exec(ctx, `INSERT INTO tenants (id, name, plan) VALUES ('acme', 'Acme', 'pro')`); err != nil {
		t.Fatal(err)
	}
	st := store.New(pool)
	absent := []uuid.UUID{uuid.New(), uuid.New(), uuid.New(), uuid.New()}
	if _, err := st.UnscopedStartTasks(ctx, absent[:1]); err != nil {
		t.Fatal(err)
	}
	start := rec.find(t, "started AS")
	last := make([]store.LastStep, len(absent))
	for i, id := range absent {
		last[i] = store.LastStep{RecordStepParams: store.RecordStepParams{ID: id, Attempt: 1, Step: 1}}
	}
	if _, err := st.UnscopedCompleteLastSteps(ctx, last); err != nil {
		t.Fatal(err)
	}
	end := rec.find(t, "INSERT INTO usage_ledger")

	// Each statement's generic plan is made on the empty table, by its first run.
	type prepared struct {
		name    string
		state   string
		ids     func([]uuid.UUID) any
		explain func([]any) planNode
		args    []any
		within  float64
	}
	var stmts []prepared
	for _, c := range []prepared{
		{name: "start", state: "queued", ids: func(ids []uuid.UUID) any { return ids[0] }, within: 1},
		{name: "last step", state: "running", ids: func(ids []uuid.UUID) any { return ids }, within: 30},
	} {
		s := start
		if c.name == "last step" {
			s = end
		}
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		explain, args, done := prepareAsRun(t, ctx, conn, s)
		t.Cleanup(func() { done(); conn.Release() })
		explain(args)
		c.explain, c.args = explain, args
		stmts = append(stmts, c)
	}
	// 3,000 queued tasks, 3,000 ended, 20 running.
	if _, err := seedPool.Exec(ctx, `INSERT INTO tasks (id, tenant_id, kid, agent, request_hash, state, attempt, finished_at)
		SELECT gen_random_uuid(), 'acme', 'k', 'sim', '\x00', s, CASE WHEN s = 'queued' THEN 0 ELSE 1 END,
			CASE WHEN s = 'completed' THEN now() END
		FROM generate_series(1, 6020) g,
			LATERAL (SELECT CASE WHEN g <= 3000 THEN 'queued' WHEN g <= 6000 THEN 'completed' ELSE 'running' END AS s) x`); err != nil {
		t.Fatal(err)
	}
	for _, p := range stmts {
		var ids []uuid.UUID
		rows, err := seedPool.Query(ctx, `SELECT id FROM tasks WHERE state = $1 ORDER BY random() LIMIT 4`, p.state)
		if err == nil {
			ids, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		}
		if err != nil {
			t.Fatal(err)
		}
		args := slices.Clone(p.args)
		args[0] = p.ids(ids)
		if read := readOfTasks(p.explain(args)); read > p.within {
			t.Errorf("%s, planned on an empty table, read %v rows of tasks (want at most %v)", p.name, read, p.within)
		}
	}
}

func TestListTasksReadsAPage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	seedPool, pool, rec := recordedSchema(t)
	for _, q := range []string{
		`INSERT INTO tenants (id, name, plan) VALUES ('acme', 'Acme', 'pro'), ('other', 'Other', 'pro')`,
		// acme: 20 failed tasks long ago, then 10,000 completed, 30 queued; other: 5,000 completed.
		`INSERT INTO tasks (id, tenant_id, kid, agent, request_hash, state, created_at)
		 SELECT (lpad(to_hex(g), 8, '0') || '-0000-7000-8000-000000000000')::uuid, CASE WHEN g % 3 = 0 THEN 'other' ELSE 'acme' END,
		   'k', 'sim', '\x00',
		   CASE WHEN g <= 20 THEN 'failed' WHEN g > 15000 THEN 'queued' ELSE 'completed' END, now()
		 FROM generate_series(1, 15030) g`,
		`VACUUM ANALYZE tasks`,
	} {
		if _, err := seedPool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	st := store.New(pool)
	read := func(plan planNode) float64 {
		var n float64
		plan.walk(func(p planNode) {
			if p.Relation == "tasks" || strings.HasPrefix(p.Index, "tasks_") {
				n += (p.ActualRows + p.RowsRemoved) * max(p.ActualLoops, 1)
			}
		})
		return n
	}
	for _, c := range []struct {
		state store.TaskState
		want  int
	}{{"", 20}, {"failed", 14}, {"completed", 20}} {
		page, err := st.ListTasks(ctx, store.ListTasksParams{TenantID: "acme", State: c.state, Limit: 20})
		if err != nil || len(page) != c.want {
			t.Fatalf("state %q: %d tasks, %v; want %d", c.state, len(page), err, c.want)
		}
		for i, task := range page {
			if task.TenantID != "acme" || (c.state != "" && task.State != c.state) || (i > 0 && task.ID.String() >= page[i-1].ID.String()) {
				t.Fatalf("state %q: task %d %s %s %s out of place", c.state, i, task.ID, task.TenantID, task.State)
			}
		}
		if n := read(explainAsRun(t, ctx, pool, rec.last(t))); n > 100 {
			t.Errorf("a page of 20 tasks in state %q read %v rows of tasks", c.state, n)
		}
		// The next page starts after the cursor.
		if len(page) == 20 {
			next, err := st.ListTasks(ctx, store.ListTasksParams{TenantID: "acme", State: c.state, Limit: 20, Before: page[19].ID})
			if err != nil || len(next) == 0 || next[0].ID.String() >= page[19].ID.String() {
				t.Fatalf("state %q: next page %d tasks, %v", c.state, len(next), err)
			}
			if n := read(explainAsRun(t, ctx, pool, rec.last(t))); n > 100 {
				t.Errorf("the second page of 20 tasks in state %q read %v rows of tasks", c.state, n)
			}
		}
	}
}
