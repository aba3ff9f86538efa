package maintenance

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/scheduler"
)

// deps builds the services on a fresh schema and Redis prefix, with one tenant.
func deps(t *testing.T) Deps {
	t.Helper()
	pool := testenv.Postgres(t)
	rdb, keys := testenv.Redis(t, 1)
	plans, err := tenants.LoadCatalogue(config.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(pool)
	if _, err := st.CreateTenant(context.Background(), store.CreateTenantParams{ID: "m", Name: "m", Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	return Deps{
		Store: st, Pool: pool, Redis: rdb, Keys: keys, Plans: plans,
		Scheduler: scheduler.New(rdb, keys, scheduler.Options{}), Quotas: quotas.New(rdb, keys, nil),
	}
}

// queued writes a queued task to Postgres only, as if its push to Redis was lost.
func queued(t *testing.T, d Deps) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	_, _, err := d.Store.(*store.Store).InsertTask(context.Background(), store.InsertTaskParams{ID: id, TenantID: "m", Kid: "test",
		Agent: "sim", Input: json.RawMessage(`{"steps":1}`), Budget: json.RawMessage(`{}`), Priority: scheduler.DefaultPriority,
		RequestHash: []byte{0}})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestRecoveryRunOnceRepushesWhatRedisLost(t *testing.T) {
	t.Parallel()
	d := deps(t)
	ctx := context.Background()
	id := queued(t, d)
	r := NewRecovery(d, RecoveryConfig{})
	if n, err := r.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("first sweep: %d, %v; want 1 pushed", n, err)
	}
	if err := d.Redis.ZScore(ctx, d.Keys.TenantQueue("m"), id.String()).Err(); err != nil {
		t.Fatalf("the task is not back on its queue: %v", err)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("second sweep: %d, %v; want nothing to push", n, err)
	}
	if n, err := NewRecovery(d, RecoveryConfig{MinAge: time.Hour}).RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("a sweep sparing young tasks: %d, %v", n, err)
	}
}

func TestJanitorRunOnceRunsEveryPass(t *testing.T) {
	t.Parallel()
	d := deps(t)
	ctx := context.Background()
	queued(t, d)
	d.Redis.Set(ctx, d.Keys.PoolInflight(), 4, time.Hour) // no task holds a slot
	j := NewJanitor(d, JanitorConfig{})
	rep, err := j.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range rep.Passes {
		names = append(names, p.Name)
		if !p.Done || p.Err != "" {
			t.Errorf("pass %s: %+v", p.Name, p)
		}
	}
	if want := []string{passStale, passLeases, passRunning, passRepush, passPool}; !slices.Equal(names, want) {
		t.Fatalf("passes %v, want %v", names, want)
	}
	if rep.Repushed != 1 || rep.PoolCorrected == 0 || rep.TenantsReviewed != 1 {
		t.Fatalf("report %+v: want one task re-pushed, the pool corrected, one tenant reviewed", rep)
	}
	if j.Leader() {
		t.Fatal("RunOnce took the leader lock")
	}
	rep, err = j.RunOnce(ctx)
	if err != nil || rep.drifted() {
		t.Fatalf("a second run found drift: %+v, %v", rep, err)
	}
}
