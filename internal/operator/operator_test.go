package operator

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/billing/webhooks"
	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/pools"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/capacity"
	"github.com/agentq/agentq/runtime"
	"github.com/agentq/agentq/scheduler"
)

type fixture struct {
	t     *testing.T
	ctx   context.Context
	pool  *pgxpool.Pool
	sched *scheduler.Scheduler
	svc   *Service
	pools *pools.Service
	q     *capacity.Pools
	now   time.Time
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool := testenv.Postgres(t)
	rdb, keys := testenv.Redis(t, 1)
	plans, err := tenants.LoadCatalogue(config.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(pool)
	f := &fixture{t: t, ctx: context.Background(), pool: pool, sched: scheduler.New(rdb, keys, scheduler.Options{}),
		now: time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC)}
	f.q = capacity.NewPools(rdb, keys, func() int64 { return f.now.UnixMilli() })
	f.pools = pools.New(pools.Deps{Store: st, Capacity: f.q, Agents: runtime.NewRegistry()})
	f.svc = New(Deps{
		Store: st, Scheduler: f.sched, Tenants: tenants.New(st, plans, tenants.Options{}),
		Webhooks: webhooks.NewWebhooks(st, webhooks.WebhooksOptions{}), Archetype: &baseservice.Archetype{Clock: func() time.Time { return f.now }},
		Pools: f.pools,
	})
	return f
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(f.ctx, sql, args...); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) tenant(id string, weight int) {
	f.t.Helper()
	f.exec(`INSERT INTO tenants (id, name, plan, weight) VALUES ($1, $1, 'pro', $2)`, id, weight)
}

// task writes a task in state with its times, each an offset from f.now (nil: NULL).
func (f *fixture) task(tenant, state string, created time.Duration, started, finished *time.Duration) {
	f.t.Helper()
	at := func(d *time.Duration) *time.Time {
		if d == nil {
			return nil
		}
		v := f.now.Add(*d)
		return &v
	}
	f.exec(`INSERT INTO tasks (id, tenant_id, kid, agent, request_hash, state, created_at, started_at, finished_at)
		VALUES ($1, $2, 'k', 'sim', '\x01', $3, $4, $5, $6)`,
		uuid.Must(uuid.NewV7()), tenant, state, f.now.Add(created), at(started), at(finished))
}

func ago(d time.Duration) *time.Duration { v := -d; return &v }

func near(got, want float64) bool { return math.Abs(got-want) < 1e-6 }

func rowOf(t *testing.T, ov Overview, id string) Tenant {
	t.Helper()
	for _, r := range ov.Tenants {
		if r.ID == id {
			return r
		}
	}
	t.Fatalf("tenant %s not in the view %+v", id, ov.Tenants)
	return Tenant{}
}

// Shares are worker-seconds clipped to the window over every tenant's; entitlements
// are weights over the weights of the tenants active in the window.
func TestSharesAndEntitlements(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for id, w := range map[string]int{"a": 3, "b": 1, "c": 2, "d": 4, "e": 1} {
		f.tenant(id, w)
	}
	// a: 60 s of a task that began before the window, 60 s of one still running.
	f.task("a", "completed", -11*time.Minute, ago(10*time.Minute), ago(4*time.Minute))
	f.task("a", "running", -61*time.Second, ago(time.Minute), nil)
	// b: one 60 s task that waited 10 s, and a task queued now.
	f.task("b", "completed", -3*time.Minute-10*time.Second, ago(3*time.Minute), ago(2*time.Minute))
	f.task("b", "queued", -30*time.Second, nil, nil)
	// c: done before the window: inactive.
	f.task("c", "completed", -8*time.Minute, ago(7*time.Minute), ago(6*time.Minute))
	// d: a task handed back to its queue: waiting, no worker time while it waits; and
	// one parked for its tokens per minute.
	f.task("d", "queued", -4*time.Minute, ago(2*time.Minute), nil)
	f.exec(`INSERT INTO tasks (id, tenant_id, kid, agent, request_hash, state, created_at, started_at, wait_reason, wait_until)
		VALUES ($1, 'd', 'k', 'sim', '\x01', 'queued', $2, $3, 'tokens_per_minute', $4)`,
		uuid.Must(uuid.NewV7()), f.now.Add(-3*time.Minute), f.now.Add(-2*time.Minute), f.now.Add(10*time.Second))
	// e: nothing in Postgres's window, but a task in its Redis queue.
	if err := f.sched.Enqueue(f.ctx, scheduler.EnqueueParams{TenantID: "e", TaskID: uuid.Must(uuid.NewV7()), Priority: 5, CreatedAt: f.now, Weight: 1}); err != nil {
		t.Fatal(err)
	}

	ov, err := f.svc.Overview(f.ctx, Query{})
	if err != nil {
		t.Fatal(err)
	}
	if !near(ov.TotalWorkerSeconds, 180) || ov.TotalWeightActive != 3+1+4+1 {
		t.Fatalf("total worker-seconds %v (want 180), active weight %d (want 9)", ov.TotalWorkerSeconds, ov.TotalWeightActive)
	}
	want := map[string]struct {
		ws, share, ent float64
		active         bool
	}{
		"a": {120, 120.0 / 180, 3.0 / 9, true},
		"b": {60, 60.0 / 180, 1.0 / 9, true},
		"c": {0, 0, 0, false},
		"d": {0, 0, 4.0 / 9, true},
		"e": {0, 0, 1.0 / 9, true},
	}
	for id, w := range want {
		r := rowOf(t, ov, id)
		if !near(r.WorkerSeconds, w.ws) || !near(r.Share, w.share) || !near(r.Entitlement, w.ent) || r.Active != w.active {
			t.Errorf("%s: worker-s %v share %v entitlement %v active %v; want %+v", id, r.WorkerSeconds, r.Share, r.Entitlement, r.Active, w)
		}
	}
	if b := rowOf(t, ov, "b"); b.Started != 1 || b.P99Wait != 10*time.Second {
		t.Errorf("b: %d started, p99 wait %v; want 1 and 10s", b.Started, b.P99Wait)
	}
	if d := rowOf(t, ov, "d"); d.CapacityWaits != 1 {
		t.Errorf("d: %d tasks waiting for token capacity, want 1", d.CapacityWaits)
	}
	if e := rowOf(t, ov, "e"); e.Queued != 1 {
		t.Errorf("e: queued %d, want 1 (from Redis)", e.Queued)
	}
	// Default order: share, descending.
	if ov.Tenants[0].ID != "a" || ov.Tenants[1].ID != "b" {
		t.Errorf("default order %v, want a then b first", ids(ov.Tenants))
	}
}

func ids(rows []Tenant) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

func TestSortAndFilter(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("acme", 5)
	f.tenant("acme-labs", 1)
	f.tenant("globex", 3)
	q, err := ParseQuery("weight", "", "ACME")
	if err != nil || !q.Desc {
		t.Fatalf("ParseQuery: %+v, %v; numbers sort descending by default", q, err)
	}
	ov, err := f.svc.Overview(f.ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(ov.Tenants); len(got) != 2 || got[0] != "acme" || got[1] != "acme-labs" || ov.TenantsTotal != 3 {
		t.Fatalf("filtered by acme, by weight desc: %v of %d", got, ov.TenantsTotal)
	}
	q, _ = ParseQuery("tenant", "desc", "")
	ov, _ = f.svc.Overview(f.ctx, q)
	if got := ids(ov.Tenants); got[0] != "globex" || got[2] != "acme" {
		t.Fatalf("by tenant desc: %v", got)
	}
	for _, bad := range [][2]string{{"secret", ""}, {"share", "up"}} {
		if _, err := ParseQuery(bad[0], bad[1], ""); !errors.Is(err, ErrBadQuery) {
			t.Errorf("ParseQuery(%q, %q) = %v, want ErrBadQuery", bad[0], bad[1], err)
		}
	}
}

// Limit hits count the last 24 h of limit_hit events and refusals; the endpoints show
// their failing deliveries without the credentials of their URL.
func TestLimitHitsAndWebhooks(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("b", 1)
	for _, age := range []time.Duration{time.Hour, 25 * time.Hour} {
		f.exec(`INSERT INTO events (id, tenant_id, type, dedupe_key, payload, created_at) VALUES ($1, 'b', $2, $1, '\x7b7d', $3)`,
			uuid.NewString(), outbox.TypeLimitHit, f.now.Add(-age))
	}
	f.exec(`INSERT INTO limit_rejections (tenant_id, limit_type, minute, count) VALUES ('b', 'tenant_rate', $1, 7), ('b', 'tenant_rate', $2, 100)`,
		f.now.Add(-10*time.Minute), f.now.Add(-30*time.Hour))

	ep := uuid.New()
	f.exec(`INSERT INTO webhook_endpoints (id, url, types, secret) VALUES ($1, 'https://user:pw@hooks.example/in?token=s3cret', '{usage.limit_hit}', 'whsec_x')`, ep)
	var seq int64
	if err := f.pool.QueryRow(f.ctx, `SELECT seq FROM events ORDER BY seq LIMIT 1`).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	var failed, retrying, ok int64
	for _, p := range []struct {
		state    string
		attempts int
		out      *int64
	}{{"failed", 8, &failed}, {"pending", 2, &retrying}, {"succeeded", 1, &ok}} {
		if err := f.pool.QueryRow(f.ctx, `INSERT INTO webhook_deliveries (endpoint_id, event_seq, event_id, state, attempts, next_attempt_at)
			VALUES ($1, $2, $3, $4, $5, now()) RETURNING id`, ep, seq, uuid.NewString(), p.state, p.attempts).Scan(p.out); err != nil {
			t.Fatal(err)
		}
		// one delivery per (endpoint, event): the next one needs another event
		f.exec(`INSERT INTO events (id, tenant_id, type, dedupe_key, payload, created_at) VALUES ($1, 'x', 't', $1, '\x7b7d', now() - interval '30 days')`, uuid.NewString())
		if err := f.pool.QueryRow(f.ctx, `SELECT max(seq) FROM events`).Scan(&seq); err != nil {
			t.Fatal(err)
		}
	}
	f.exec(`INSERT INTO webhook_attempts (delivery_id, endpoint_id, event_id, attempt, attempted_at, status_code, error, duration_ms, result)
		VALUES ($1, $2, 'e1', 8, now() - interval '1 minute', 500, NULL, 12, 'failed'),
		       ($3, $2, 'e2', 2, now(), NULL, 'connection refused', 3, 'retrying'),
		       ($4, $2, 'e3', 1, now(), 200, NULL, 3, 'succeeded')`, failed, ep, retrying, ok)

	ov, err := f.svc.Overview(f.ctx, Query{})
	if err != nil {
		t.Fatal(err)
	}
	if b := rowOf(t, ov, "b"); b.LimitHits != 1 || b.Refusals != 7 {
		t.Errorf("b: %d limit hits, %d refusals; want 1 and 7 (the last 24 h)", b.LimitHits, b.Refusals)
	}
	if len(ov.Endpoints) != 1 {
		t.Fatalf("endpoints %+v", ov.Endpoints)
	}
	e := ov.Endpoints[0]
	if e.Failed != 1 || e.Retrying != 1 || e.Pending != 1 {
		t.Errorf("endpoint: failed %d retrying %d pending %d; want 1, 1, 1", e.Failed, e.Retrying, e.Pending)
	}
	if e.LastFailure == nil || e.LastFailure.Error != "connection refused" {
		t.Errorf("last failure %+v, want the newest failed attempt (connection refused)", e.LastFailure)
	}
	if e.DisplayURL != "https://hooks.example/in" {
		t.Errorf("display URL %q shows more than scheme, host and path", e.DisplayURL)
	}
}

// The view shows each pool with its configuration, its live state and its agents.
func TestPoolsInOverview(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if ov, err := f.svc.Overview(f.ctx, Query{}); err != nil || len(ov.Pools) != 0 {
		t.Fatalf("no pool: %+v %v", ov.Pools, err)
	}
	cfg := quotas.PoolConfig{Name: "llm", TokensPerMinute: 60000, RequestsPerMinute: 600}
	if _, err := f.pools.Put(f.ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pools.Bind(f.ctx, pools.BindParams{Agent: "sim", Pool: "llm", TokensPerStep: 2000}); err != nil {
		t.Fatal(err)
	}
	if a, err := f.q.ReservePool(f.ctx, quotas.PoolReserveParams{Pool: cfg, Tenant: "a", Weight: 1, Tokens: 60000}); err != nil || !a.Granted {
		t.Fatalf("reserve: %+v %v", a, err)
	}
	for _, w := range []struct {
		tenant string
		weight int
	}{{"b", 3}, {"c", 1}} {
		if a, err := f.q.ReservePool(f.ctx, quotas.PoolReserveParams{Pool: cfg, Tenant: w.tenant, Weight: w.weight, Tokens: 1000}); err != nil || a.Granted {
			t.Fatalf("reserve from an empty pool: %+v %v", a, err)
		}
	}
	// refusals of two other tenants: evidence about the pool, which drops to 70 %
	for _, tn := range []string{"x", "y"} {
		if _, err := f.q.ThrottlePool(f.ctx, quotas.PoolThrottleParams{Pool: cfg, Tenant: tn, Tokens: 1000, RetryAfter: time.Second}); err != nil {
			t.Fatalf("throttle: %v", err)
		}
	}
	ov, err := f.svc.Overview(f.ctx, Query{})
	if err != nil || len(ov.Pools) != 1 {
		t.Fatalf("overview: %+v %v", ov.Pools, err)
	}
	p := ov.Pools[0]
	if p.Config != cfg || p.Status.EffectiveRate != 42000 || !p.Status.Throttled || p.Status.UsedLastMinute != 60000 {
		t.Errorf("pool %+v", p)
	}
	shares := map[string]float64{}
	for _, w := range p.Status.Waiting {
		shares[w.Tenant] = w.Share
	}
	if len(shares) != 2 || shares["b"] != 0.75 || shares["c"] != 0.25 {
		t.Errorf("waiting %+v, want b 0.75 and c 0.25", p.Status.Waiting)
	}
	if len(p.Agents) != 1 || p.Agents[0] != (pools.AgentTokens{Agent: "sim", TokensPerStep: 2000}) {
		t.Errorf("agents %+v", p.Agents)
	}
}

// A change's URL shows as the view shows an endpoint's: no user part, no query.
func TestRecentChangesShowURLsWithoutCredentials(t *testing.T) {
	d := displayDiff([]audit.FieldChange{
		{Field: "url", Before: json.RawMessage(`null`), After: json.RawMessage(`"https://u:p@hooks.example/in?token=secret#f"`)},
		{Field: "types", Before: json.RawMessage(`null`), After: json.RawMessage(`["x?token=kept"]`)},
	})
	if string(d[0].Before) != `null` || string(d[0].After) != `"https://hooks.example/in"` {
		t.Errorf("url change %s → %s, want null → the URL without user part and query", d[0].Before, d[0].After)
	}
	if string(d[1].After) != `["x?token=kept"]` {
		t.Errorf("another field changed to %s", d[1].After)
	}
}
