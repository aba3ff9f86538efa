package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv/testfactory"
	"github.com/agentq/agentq/quotas"
)

func TestTenants(t *testing.T) {
	t.Parallel()
	ctx, st, _ := setup(t) // acme exists
	w := 3
	b, err := st.CreateTenant(ctx, store.CreateTenantParams{ID: "bravo", Name: "Bravo", Plan: "free", Weight: &w,
		Overrides: map[string]quotas.Limit{"tenant_rate": 5}})
	if err != nil || b.Status != "active" || *b.Weight != 3 || b.Overrides["tenant_rate"] != 5 {
		t.Fatalf("create: %+v, %v", b, err)
	}
	if _, err := st.CreateTenant(ctx, store.CreateTenantParams{ID: "bravo", Name: "again", Plan: "pro"}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("create a taken id: %v, want ErrConflict", err)
	}
	if got, err := st.GetTenant(ctx, "acme"); err != nil || got.Overrides == nil || got.Weight != nil {
		t.Fatalf("get: %+v, %v (overrides must be an empty map, weight unset)", got, err)
	}
	if _, err := st.GetTenant(ctx, "nobody"); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("get a missing tenant: %v", err)
	}
	// Only the given fields change; overrides, when given, replace the whole map.
	suspended, plan := "suspended", "enterprise"
	up, err := st.UpdateTenant(ctx, store.UpdateTenantParams{ID: "bravo", Plan: &plan, Status: &suspended,
		Overrides: map[string]quotas.Limit{}})
	if err != nil || up.Plan != plan || up.Status != suspended || up.Name != "Bravo" || *up.Weight != 3 || len(up.Overrides) != 0 ||
		!up.UpdatedAt.After(b.UpdatedAt) {
		t.Fatalf("update: %+v, %v", up, err)
	}
	if _, err := st.UpdateTenant(ctx, store.UpdateTenantParams{ID: "nobody", Plan: &plan}); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("update a missing tenant: %v", err)
	}
	all, err := st.UnscopedListTenants(ctx)
	if err != nil || len(all) != 2 || all[0].ID != "acme" || all[1].ID != "bravo" {
		t.Fatalf("list: %+v, %v", all, err)
	}
	// The janitor's walk: pages of ids after a cursor.
	for _, id := range []string{"charlie", "delta"} {
		if _, err := st.CreateTenant(ctx, store.CreateTenantParams{ID: id, Name: id, Plan: "pro"}); err != nil {
			t.Fatal(err)
		}
	}
	var walked []string
	for cursor := ""; ; {
		page, err := st.UnscopedTenantIDsAfter(ctx, cursor, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		walked = append(walked, page...)
		cursor = page[len(page)-1]
	}
	if !slices.Equal(walked, []string{"acme", "bravo", "charlie", "delta"}) {
		t.Fatalf("walk: %v", walked)
	}
}

func TestKeys(t *testing.T) {
	t.Parallel()
	ctx, st, _ := setup(t)
	k, err := st.CreateKey(ctx, store.CreateKeyParams{Kid: "acme-00000001", TenantID: "acme", SecretHash: []byte{1},
		Scopes: store.Scopes{Agents: []string{"sim"}}})
	if err != nil || k.TenantID != "acme" || !slices.Equal(k.Scopes.Agents, []string{"sim"}) || k.RevokedAt != nil {
		t.Fatalf("create: %+v, %v", k, err)
	}
	if _, err := st.CreateKey(ctx, store.CreateKeyParams{Kid: "acme-00000001", TenantID: "acme", SecretHash: []byte{1}}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("create a taken kid: %v, want ErrConflict", err)
	}
	if _, err := st.CreateKey(ctx, store.CreateKeyParams{Kid: "ghost-00000001", TenantID: "ghost", SecretHash: []byte{1}}); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("create for a missing tenant: %v, want agentqtype.ErrNotFound", err)
	}
	if _, err := st.CreateKey(ctx, store.CreateKeyParams{Kid: "acme-00000002", TenantID: "acme", SecretHash: []byte{2}}); err != nil {
		t.Fatal(err)
	}
	rot, err := st.RotateKey(ctx, store.RotateKeyParams{TenantID: "acme", Kid: k.Kid, SecretHash: []byte{9}})
	if err != nil || rot.RotatedAt == nil || !slices.Equal(rot.SecretHash, []byte{9}) {
		t.Fatalf("rotate: %+v, %v", rot, err)
	}
	if err := st.RevokeKey(ctx, store.RevokeKeyParams{TenantID: "acme", Kid: k.Kid}); err != nil {
		t.Fatal(err)
	}
	// A revoked key is no live key: neither rotated nor revoked again.
	if err := st.RevokeKey(ctx, store.RevokeKeyParams{TenantID: "acme", Kid: k.Kid}); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("revoke twice: %v, want agentqtype.ErrNotFound", err)
	}
	if _, err := st.RotateKey(ctx, store.RotateKeyParams{TenantID: "acme", Kid: k.Kid, SecretHash: []byte{8}}); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("rotate a revoked key: %v, want agentqtype.ErrNotFound", err)
	}
	// Authentication still finds it, revoked, by its kid.
	got, err := st.UnscopedGetKey(ctx, k.Kid)
	if err != nil || got.RevokedAt == nil || !slices.Equal(got.SecretHash, []byte{9}) {
		t.Fatalf("get: %+v, %v", got, err)
	}
	if _, err := st.UnscopedGetKey(ctx, "acme-ffffffff"); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("get a missing kid: %v", err)
	}
	ks, err := st.ListKeys(ctx, store.ListKeysParams{TenantID: "acme"})
	if err != nil || len(ks) != 2 || ks[0].Kid != k.Kid || ks[1].Kid != "acme-00000002" {
		t.Fatalf("list (oldest first, revoked included): %+v, %v", ks, err)
	}
}

func insertTask(t *testing.T, ctx context.Context, st *store.Store, p store.InsertTaskParams) (store.Task, bool) {
	t.Helper()
	if p.ID == uuid.Nil {
		p.ID = uuid.Must(uuid.NewV7())
	}
	p.Kid, p.Agent, p.Input, p.Budget, p.RequestHash = "k", "sim", json.RawMessage(`{"steps":1}`), json.RawMessage(`{}`), []byte{1}
	task, created, err := st.InsertTask(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	return task, created
}

func TestTasks(t *testing.T) {
	t.Parallel()
	ctx, st, _ := setup(t)
	first, created := insertTask(t, ctx, st, store.InsertTaskParams{TenantID: "acme", User: "u1", Priority: 7, IdempotencyKey: "k1"})
	if !created || first.State != agentqtype.TaskStateQueued || first.Priority != 7 || first.User != "u1" || first.Attempt != 0 ||
		string(first.Input) != `{"steps": 1}` || first.IdempotencyKey == nil || *first.IdempotencyKey != "k1" {
		t.Fatalf("insert: %+v", first)
	}
	// The same idempotency key gives back the first task and writes nothing.
	again, created := insertTask(t, ctx, st, store.InsertTaskParams{TenantID: "acme", IdempotencyKey: "k1"})
	if created || again.ID != first.ID {
		t.Fatalf("replay: created %v, %s (first %s)", created, again.ID, first.ID)
	}
	if got, err := st.GetTaskByIdempotencyKey(ctx, store.GetTaskByIdempotencyKeyParams{TenantID: "acme", Key: "k1"}); err != nil || got.ID != first.ID {
		t.Fatalf("by key: %v", err)
	}
	if _, err := st.GetTaskByIdempotencyKey(ctx, store.GetTaskByIdempotencyKeyParams{TenantID: "acme", Key: "k2"}); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("by an unused key: %v", err)
	}
	if _, err := st.GetTask(ctx, store.GetTaskParams{TenantID: "acme", ID: uuid.Must(uuid.NewV7())}); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("get a missing task: %v", err)
	}
	var bulk []store.InsertTaskParams
	for range 4 {
		bulk = append(bulk, store.InsertTaskParams{ID: uuid.Must(uuid.NewV7()), TenantID: "acme", Kid: "k", Agent: "sim",
			Input: json.RawMessage(`{}`), Budget: json.RawMessage(`{}`), RequestHash: []byte{1}})
	}
	if n, err := st.BulkInsertQueued(ctx, bulk); err != nil || n != 4 {
		t.Fatalf("bulk: %d, %v", n, err)
	}
	if n, err := st.CountTasks(ctx, store.CountTasksParams{TenantID: "acme"}); err != nil || n != 5 {
		t.Fatalf("count: %d, %v", n, err)
	}
	// Pages, newest first, by cursor; and a state filter.
	if _, _, err := st.UnscopedStartTask(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	var seen []uuid.UUID
	for before := uuid.Nil; ; {
		page, err := st.ListTasks(ctx, store.ListTasksParams{TenantID: "acme", Before: before, Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, tk := range page {
			seen = append(seen, tk.ID)
		}
		before = page[len(page)-1].ID
	}
	want := []uuid.UUID{bulk[3].ID, bulk[2].ID, bulk[1].ID, bulk[0].ID, first.ID}
	if !slices.Equal(seen, want) {
		t.Fatalf("pages: %v, want %v", seen, want)
	}
	running, err := st.ListTasks(ctx, store.ListTasksParams{TenantID: "acme", State: agentqtype.TaskStateRunning, Limit: 10})
	if err != nil || len(running) != 1 || running[0].ID != first.ID {
		t.Fatalf("running: %+v, %v", running, err)
	}
	// A tenant's cancel wins once, from the states it names.
	killed, ok, err := st.FinishTask(ctx, store.FinishTaskParams{TenantID: "acme", ID: first.ID,
		From: []store.TaskState{agentqtype.TaskStateQueued, agentqtype.TaskStateRunning}, To: agentqtype.TaskStateKilled, Error: "cancelled"})
	if err != nil || !ok || killed.State != agentqtype.TaskStateKilled || killed.FinishedAt == nil || *killed.Error != "cancelled" {
		t.Fatalf("cancel: %v %v %+v", ok, err, killed)
	}
	if _, ok, err := st.FinishTask(ctx, store.FinishTaskParams{TenantID: "acme", ID: first.ID,
		From: []store.TaskState{agentqtype.TaskStateQueued, agentqtype.TaskStateRunning}, To: agentqtype.TaskStateKilled}); ok || err != nil {
		t.Fatalf("second cancel: %v %v", ok, err)
	}
	if _, _, err := st.FinishTask(ctx, store.FinishTaskParams{TenantID: "acme", ID: bulk[0].ID,
		From: []store.TaskState{agentqtype.TaskStateQueued}, To: agentqtype.TaskStateRunning}); err == nil {
		t.Fatal("a finish to a state that is not terminal was accepted")
	}
}

// The task states are the client's, and the schema accepts exactly them.
func TestTaskStatesMatchClientAndSchema(t *testing.T) {
	t.Parallel()
	ctx, st, pool := setup(t)
	id := newTask(t, ctx, st, "acme")
	for _, s := range store.TaskStates {
		if s.Terminal() != client.IsTerminal(string(s)) || !s.Valid() {
			t.Errorf("state %s: terminal %v, valid %v", s, s.Terminal(), s.Valid())
		}
		if err := testfactory.SetTaskState(ctx, pool, id, string(s)); err != nil {
			t.Errorf("the schema refuses state %s: %v", s, err)
		}
	}
	if store.TaskState("sleeping").Valid() || agentqtype.TaskState(agentqtype.TaskStatePaused).Terminal() || agentqtype.TaskState(agentqtype.TaskStateRunning).Terminal() || !agentqtype.TaskState(agentqtype.TaskStateAbandoned).Terminal() {
		t.Error("Valid or Terminal misjudge a state")
	}
	if err := testfactory.SetTaskState(ctx, pool, id, "sleeping"); err == nil {
		t.Error("the schema accepts a state the store does not know")
	}
}

func TestAgents(t *testing.T) {
	t.Parallel()
	ctx, st, _ := setup(t)
	if l, err := st.ListAgents(ctx); err != nil || l == nil || len(l) != 0 {
		t.Fatalf("empty list: %v, %v (want an empty, non-nil list)", l, err)
	}
	a, created, err := st.PutAgent(ctx, store.PutAgentParams{Name: "echo", URL: "http://a", StepTimeoutS: 5,
		Headers: map[string]string{"X": "1"}, SigningSecret: "s1"})
	if err != nil || !created || a.SigningSecret != "s1" || a.SigningSecretCreatedAt == nil || a.Headers["X"] != "1" {
		t.Fatalf("create: %+v %v %v", a, created, err)
	}
	// Replacing keeps the agent's secret.
	b, created, err := st.PutAgent(ctx, store.PutAgentParams{Name: "echo", URL: "http://b", StepTimeoutS: 9, SigningSecret: "other"})
	if err != nil || created || b.URL != "http://b" || b.SigningSecret != "s1" || len(b.Headers) != 0 {
		t.Fatalf("replace: %+v %v %v", b, created, err)
	}
	r, err := st.RotateAgentSecret(ctx, "echo", "s2")
	if err != nil || r.SigningSecret != "s2" || !r.SigningSecretCreatedAt.After(*a.SigningSecretCreatedAt) {
		t.Fatalf("rotate: %+v, %v", r, err)
	}
	if _, err := st.RotateAgentSecret(ctx, "nobody", "s"); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("rotate a missing agent: %v", err)
	}
	if got, err := st.GetAgent(ctx, "echo"); err != nil || got.SigningSecret != "s2" || got.StepTimeoutS != 9 {
		t.Fatalf("get: %+v, %v", got, err)
	}
	if err := st.DeleteAgent(ctx, "echo"); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteAgent(ctx, "echo"); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	if _, err := st.GetAgent(ctx, "echo"); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("get a deleted agent: %v", err)
	}
}

// The maintenance passes' reads and sweeps, across tenants.
func TestUnscopedSweeps(t *testing.T) {
	t.Parallel()
	ctx, st, pool := setup(t)
	if some, err := st.UnscopedAnyTask(ctx); err != nil || some {
		t.Fatalf("any task on an empty database: %v %v", some, err)
	}
	if _, err := st.CreateTenant(ctx, store.CreateTenantParams{ID: "globex", Name: "Globex", Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	old, _ := insertTask(t, ctx, st, store.InsertTaskParams{TenantID: "acme", Priority: 3})
	other, _ := insertTask(t, ctx, st, store.InsertTaskParams{TenantID: "globex"})
	run, _ := insertTask(t, ctx, st, store.InsertTaskParams{TenantID: "acme"})
	done, _ := insertTask(t, ctx, st, store.InsertTaskParams{TenantID: "acme"})
	testfactory.TasksCreatedAgo(t, pool, time.Hour, old.ID, other.ID)
	started, _, _ := st.UnscopedStartTask(ctx, run.ID)
	if _, _, err := st.UnscopedStartTask(ctx, done.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.FinishTask(ctx, store.FinishTaskParams{TenantID: "acme", ID: done.ID,
		From: []store.TaskState{agentqtype.TaskStateRunning}, To: agentqtype.TaskStateCompleted}); err != nil {
		t.Fatal(err)
	}
	if some, err := st.UnscopedAnyTask(ctx); err != nil || !some {
		t.Fatalf("any task: %v %v", some, err)
	}
	if n, err := st.UnscopedCountTasks(ctx); err != nil || n != 4 {
		t.Fatalf("count all: %d %v", n, err)
	}

	// Queued tasks older than MinAge, every tenant's, in admission order, by pages.
	q, err := st.UnscopedListQueued(ctx, store.ListQueuedParams{MinAge: time.Minute, Limit: 1})
	if err != nil || len(q) != 1 || q[0].ID != old.ID || q[0].Priority != 3 || q[0].TenantID != "acme" {
		t.Fatalf("queued, first page: %+v, %v", q, err)
	}
	q, err = st.UnscopedListQueued(ctx, store.ListQueuedParams{MinAge: time.Minute, After: q[0].ID, Limit: 10})
	if err != nil || len(q) != 1 || q[0].ID != other.ID {
		t.Fatalf("queued, second page: %+v, %v", q, err)
	}

	live, err := st.UnscopedLiveTasksOf(ctx, []string{"acme", "globex"})
	if err != nil || len(live["acme"]) != 2 || len(live["globex"]) != 1 {
		t.Fatalf("live: %+v, %v", live, err)
	}
	states, err := st.UnscopedTaskStates(ctx, []uuid.UUID{run.ID, done.ID, other.ID, uuid.Must(uuid.NewV7())})
	if err != nil || len(states) != 3 || states[run.ID] != agentqtype.TaskStateRunning || states[done.ID] != agentqtype.TaskStateCompleted ||
		states[other.ID] != agentqtype.TaskStateQueued {
		t.Fatalf("states: %v, %v", states, err)
	}

	// A running task is stale once its heartbeat is older than staleAfter; a sweep
	// re-queues it once.
	if s, err := st.UnscopedListStaleRunning(ctx, 30*time.Second, 10); err != nil || len(s) != 0 {
		t.Fatalf("stale while heartbeating: %+v, %v", s, err)
	}
	if _, ok, err := st.UnscopedRequeueStale(ctx, run.ID, 30*time.Second); ok || err != nil {
		t.Fatalf("requeue a live task: %v %v", ok, err)
	}
	testfactory.TaskHeartbeatAgo(t, pool, run.ID, time.Minute)
	s, err := st.UnscopedListStaleRunning(ctx, 30*time.Second, 10)
	if err != nil || len(s) != 1 || s[0].ID != run.ID || s[0].Attempt != started.Attempt || s[0].TenantID != "acme" {
		t.Fatalf("stale: %+v, %v", s, err)
	}
	re, ok, err := st.UnscopedRequeueStale(ctx, run.ID, 30*time.Second)
	if err != nil || !ok || re.State != agentqtype.TaskStateQueued || !re.CreatedAt.Equal(run.CreatedAt) {
		t.Fatalf("requeue stale: %v %v %+v", ok, err, re)
	}
	if _, ok, _ := st.UnscopedRequeueStale(ctx, run.ID, 30*time.Second); ok {
		t.Fatal("a stale task was re-queued twice")
	}
	timings, err := st.UnscopedTaskTimings(ctx, []string{"acme"})
	if err != nil || len(timings) != 3 {
		t.Fatalf("timings: %d, %v", len(timings), err)
	}
}

// InTx commits its calls together, or none of them; a nested InTx is a savepoint.
func TestInTx(t *testing.T) {
	t.Parallel()
	ctx, st, _ := setup(t)
	boom := errors.New("boom")
	err := st.InTx(ctx, func(tx *store.Store) error {
		if _, err := tx.CreateTenant(ctx, store.CreateTenantParams{ID: "rolled", Name: "r", Plan: "pro"}); err != nil {
			return err
		}
		// Visible inside the transaction, not outside it.
		if _, err := tx.GetTenant(ctx, "rolled"); err != nil {
			return err
		}
		if _, err := st.GetTenant(ctx, "rolled"); !errors.Is(err, agentqtype.ErrNotFound) {
			t.Errorf("an uncommitted tenant is visible outside its transaction: %v", err)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTx: %v, want fn's error", err)
	}
	if _, err := st.GetTenant(ctx, "rolled"); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("a rolled-back tenant exists: %v", err)
	}
	err = st.InTx(ctx, func(tx *store.Store) error {
		if _, err := tx.CreateTenant(ctx, store.CreateTenantParams{ID: "kept", Name: "k", Plan: "pro"}); err != nil {
			return err
		}
		inner := tx.InTx(ctx, func(tx *store.Store) error {
			if _, err := tx.CreateTenant(ctx, store.CreateTenantParams{ID: "inner", Name: "i", Plan: "pro"}); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(inner, boom) {
			return inner
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetTenant(ctx, "kept"); err != nil {
		t.Fatalf("the committed tenant: %v", err)
	}
	if _, err := st.GetTenant(ctx, "inner"); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("the rolled-back savepoint's tenant exists: %v", err)
	}
}
