package maintenance

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas/admission"
	"github.com/agentq/agentq/scheduler"
)

// fixture is the services on a fresh schema and Redis prefix. Tests seed drift with
// SQL and the owners' Redis calls, as a crash or a data loss leaves it.
type fixture struct {
	Deps
	t     *testing.T
	ctx   context.Context
	sched *scheduler.Scheduler
	q     *admission.Store
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool := testenv.Postgres(t)
	rdb, keys := testenv.Redis(t, 1)
	plans, err := tenants.LoadCatalogue(config.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, ctx: context.Background(), sched: scheduler.New(rdb, keys, scheduler.Options{}), q: admission.New(rdb, keys, nil)}
	f.Deps = Deps{Store: store.New(pool), Pool: pool, Redis: rdb, Keys: keys, Plans: plans, Scheduler: f.sched, Quotas: f.q}
	return f
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.Pool.Exec(f.ctx, sql, args...); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) tenant(id string) {
	f.t.Helper()
	f.exec(`INSERT INTO tenants (id, name, plan) VALUES ($1, $1, 'pro')`, id)
}

// task writes a queued task to Postgres only, as if its push to Redis was lost.
func (f *fixture) task(tenant string) uuid.UUID {
	f.t.Helper()
	id := uuid.Must(uuid.NewV7())
	f.exec(`INSERT INTO tasks (id, tenant_id, kid, agent, input, request_hash) VALUES ($1, $2, 'k', 'sim', '{"steps":1}', '\x01')`, id, tenant)
	return id
}

// submit writes a queued task as an admission does: its row, its session lease and
// its queue entry.
func (f *fixture) submit(tenant string) uuid.UUID {
	f.t.Helper()
	id := f.task(tenant)
	if err := f.q.AddLease(f.ctx, tenant, id.String(), false); err != nil {
		f.t.Fatal(err)
	}
	if err := newPusher(f.Deps).requeue(f.ctx, tenant, id, scheduler.DefaultPriority, time.Now()); err != nil {
		f.t.Fatal(err)
	}
	return id
}

func (f *fixture) state(id uuid.UUID) string {
	f.t.Helper()
	var s string
	if err := f.Pool.QueryRow(f.ctx, `SELECT state FROM tasks WHERE id = $1`, id).Scan(&s); err != nil {
		f.t.Fatal(err)
	}
	return s
}

func (f *fixture) queued(tenant string, id uuid.UUID) bool {
	return f.Redis.ZScore(f.ctx, f.Keys.TenantQueue(tenant), id.String()).Err() == nil
}

func TestRecoveryRunOnceRepushesWhatRedisLost(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("m")
	id := f.task("m")
	r := NewRecovery(f.Deps, RecoveryConfig{})
	if n, err := r.runOnce(f.ctx); err != nil || n != 1 {
		t.Fatalf("first sweep: %d, %v; want 1 pushed", n, err)
	}
	if !f.queued("m", id) {
		t.Fatal("the task is not back on its queue")
	}
	if n, err := r.runOnce(f.ctx); err != nil || n != 0 {
		t.Fatalf("second sweep: %d, %v; want nothing to push", n, err)
	}
	f.Redis.ZRem(f.ctx, f.Keys.TenantQueue("m"), id.String())
	if n, err := NewRecovery(f.Deps, RecoveryConfig{MinAge: time.Hour}).runOnce(f.ctx); err != nil || n != 0 {
		t.Fatalf("a sweep sparing young tasks: %d, %v", n, err)
	}
}

// The service sweeps at Start and then every Interval.
func TestRecoverySweepsOnItsInterval(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("m")
	r := NewRecovery(f.Deps, RecoveryConfig{Interval: 20 * time.Millisecond})
	r.TestSignals.Init(t)
	f.task("m")
	if err := r.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	if n := r.TestSignals.Swept.WaitOrTimeout(); n != 1 {
		t.Fatalf("the first sweep pushed %d, want 1", n)
	}
	id := f.task("m")
	for !f.queued("m", id) {
		r.TestSignals.Swept.WaitOrTimeout()
		if t.Failed() {
			t.FailNow()
		}
	}
}
