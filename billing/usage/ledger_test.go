package usage_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/billing/usage"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/internal/testenv/testfactory"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
)

type fixture struct {
	t      *testing.T
	ctx    context.Context
	st     *store.Store
	rdb    *redis.Client
	keys   rkeys.Keys
	ledger *usage.Ledger
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	rdb, keys := testenv.Redis(t, 1)
	st := store.New(testenv.Postgres(t))
	return &fixture{t: t, ctx: context.Background(), st: st, rdb: rdb, keys: keys, ledger: usage.NewLedger(st)}
}

// replica is one process's limits, rebuilding lost counters from src.
func (f *fixture) replica(src quotas.UsageSource) *admission.Store {
	q := admission.New(f.rdb, f.keys, nil)
	q.SetUsageSource(src, nil)
	return q
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.st.Pool().Exec(f.ctx, sql, args...); err != nil {
		f.t.Fatal(err)
	}
}

// running writes a tenant (if new) and a task of it running under attempt 1.
func (f *fixture) running(tenant string) uuid.UUID {
	f.t.Helper()
	f.exec(`INSERT INTO tenants (id, name, plan) VALUES ($1, $1, 'pro') ON CONFLICT DO NOTHING`, tenant)
	id := uuid.Must(uuid.NewV7())
	f.exec(`INSERT INTO tasks (id, tenant_id, kid, agent, request_hash, state, attempt, started_at, heartbeat_at)
		VALUES ($1, $2, 'k', 'sim', '\x01', 'running', 1, now(), now())`, id, tenant)
	return id
}

// record writes step n of a running task to the ledger, as the worker does.
func (f *fixture) record(task uuid.UUID, n int, tokens, costMicro int64) {
	f.t.Helper()
	if _, _, err := f.st.UnscopedRecordStep(f.ctx, store.RecordStepParams{ID: task, Attempt: 1, Step: n, Tokens: tokens, CostMicro: costMicro}); err != nil {
		f.t.Fatal(err)
	}
}

// lose deletes every key of the test's prefix: a FLUSHDB of this test's Redis state.
func (f *fixture) lose() { testenv.DeletePrefix(f.ctx, f.rdb, f.keys.Prefix()) }

func period() quotas.Period { return quotas.PeriodAt(time.Now().Add(-time.Hour), time.Now()) }

func limits() quotas.Limits {
	l := quotas.NoLimits()
	l.StepsDaily, l.TokensMonthly, l.USDMonthlyMicro = 1000, 1_000_000, 1_000_000_000
	return l
}

// used reads the counters as /v1/usage does.
func used(t *testing.T, q *admission.Store, tenant string) (steps, tokens, usd float64) {
	t.Helper()
	d, err := q.Admit(context.Background(), quotas.AdmitParams{Mode: quotas.ModePeek, TenantID: tenant, Kid: "k", Limits: limits(), Period: period()})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range d.Scopes {
		switch s.Name {
		case quotas.AgentStepsDaily:
			steps = s.Used
		case quotas.AITokensMonthly:
			tokens = s.Used
		case quotas.USDMonthly:
			usd = s.Used
		}
	}
	return steps, tokens, usd
}

func admitParams(tenant string, i int) quotas.AdmitParams {
	return quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: tenant, Kid: "k", TaskID: uuid.NewString(), InScope: true,
		Limits: limits(), Period: period()}
}

// The ledger's view of a tenant: steps of the last day by the hour, the period's
// tokens and cost; other tenants and earlier periods are not in it.
func TestPeriodUsageSumsTheLedger(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.running("a"), f.running("b")
	f.record(a, 1, 10, 100)
	f.record(a, 2, 20, 200)
	f.record(b, 1, 99, 999)
	old := f.running("a")
	f.record(old, 1, 1000, 1000)
	f.exec(`UPDATE usage_ledger SET recorded_at = now() - interval '40 days' WHERE task_id = $1`, old)
	u, err := f.ledger.PeriodUsage(f.ctx, "a", period(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var steps int64
	for _, n := range u.StepsByHour {
		steps += n
	}
	if steps != 2 || u.Tokens != 30 || u.CostMicro != 300 {
		t.Fatalf("usage %+v: want 2 steps, 30 tokens, 300 micro-dollars", u)
	}
	if _, err := f.ledger.PeriodUsage(f.ctx, "", period(), time.Now()); err == nil {
		t.Fatal("a usage read without a tenant was not refused")
	}
}

// After Redis lost its data, the first admission rebuilds the counters from the
// ledger: they equal it, and a tenant under its quotas is admitted.
func TestCountersAreRebuiltFromTheLedgerAfterALoss(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q := f.replica(f.ledger)
	task := f.running("acme")
	f.record(task, 1, 40, 4000)
	f.record(task, 2, 2, 200)
	f.lose()
	d, err := q.Admit(f.ctx, admitParams("acme", 0))
	if err != nil || !d.Allowed {
		t.Fatalf("admission after the loss: %+v %v", d, err)
	}
	if s, tok, usd := used(t, q, "acme"); s != 2 || tok != 42 || usd != 4200 {
		t.Fatalf("rebuilt counters: steps %v tokens %v usd %v, want the ledger's 2, 42, 4200", s, tok, usd)
	}
	// a brand-new tenant rebuilds to zero
	if d, err := q.Admit(f.ctx, admitParams("fresh", 0)); err != nil || !d.Allowed {
		t.Fatalf("a new tenant: %+v %v", d, err)
	}
	if s, tok, usd := used(t, q, "fresh"); s != 0 || tok != 0 || usd != 0 {
		t.Fatalf("a new tenant's counters: %v %v %v", s, tok, usd)
	}
}

// counting counts the ledger reads a replica makes; each takes delay (a slow ledger:
// every concurrent admission finds the counters unseeded).
type counting struct {
	src   quotas.UsageSource
	delay time.Duration
	reads atomic.Int64
	// began, when set, is closed at the first read; after, when set, is waited for
	// (at most 10 s) before a read answers.
	began, after chan struct{}
	once         sync.Once
}

func (c *counting) PeriodUsage(ctx context.Context, tenant string, p quotas.Period, now time.Time) (quotas.Usage, error) {
	c.reads.Add(1)
	if c.began != nil {
		c.once.Do(func() { close(c.began) })
	}
	if c.after != nil {
		select {
		case <-c.after:
		case <-time.After(10 * time.Second):
		}
	}
	time.Sleep(c.delay)
	return c.src.PeriodUsage(ctx, tenant, p, now)
}

// Admissions on two replicas at once, right after a loss, rebuild the counters once:
// each replica reads the ledger once, and the slower replica's rebuild, landing after
// the faster one's and after steps were reserved on it, writes nothing: the counters
// are the ledger plus those steps, not the ledger again.
func TestConcurrentAdmissionsAfterALossSeedOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	task := f.running("acme")
	for n := 1; n <= 5; n++ {
		f.record(task, n, 10, 100)
	}
	f.lose()
	// The fast replica's rebuild lands only once the slow one is reading too: on a
	// loaded machine the slow replica's admissions could otherwise start after the
	// fast rebuild, find the counters seeded and never read.
	slowReading := make(chan struct{})
	srcs := []*counting{{src: f.ledger, delay: 20 * time.Millisecond, after: slowReading}, {src: f.ledger, delay: 400 * time.Millisecond, began: slowReading}}
	reps := []*admission.Store{f.replica(srcs[0]), f.replica(srcs[1])}
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			q := reps[i%2]
			d, err := q.Admit(f.ctx, admitParams("acme", i))
			if err != nil || !d.Allowed {
				t.Errorf("admission %d: %+v %v", i, d, err)
			}
			if i%2 == 0 { // the fast replica's tasks run a step before the slow rebuild ends
				if err := q.ReserveStep(f.ctx, quotas.StepParams{TenantID: "acme", Period: period(), Limits: limits(), Tokens: 1, CostMicro: 1}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if s, tok, usd := used(t, reps[1], "acme"); s != 5+20 || tok != 50+20 || usd != 500+20 {
		t.Fatalf("counters after concurrent rebuilds: steps %v tokens %v usd %v, want 25, 70, 520", s, tok, usd)
	}
	for i, c := range srcs {
		if n := c.reads.Load(); n != 1 {
			t.Errorf("replica %d read the ledger %d times, want once", i, n)
		}
	}
}

// racing runs a step's record and settlement between the rebuild's ledger read and
// its write, the window where a settlement could corrupt a rebuild.
type racing struct {
	src  quotas.UsageSource
	once sync.Once
	step func()
}

func (r *racing) PeriodUsage(ctx context.Context, tenant string, p quotas.Period, now time.Time) (quotas.Usage, error) {
	u, err := r.src.PeriodUsage(ctx, tenant, p, now)
	r.once.Do(r.step)
	return u, err
}

// A settlement that lands between a rebuild's ledger read and its write leaves the
// unseeded counters alone (no partial counter for the seed to overwrite or add to);
// the rebuild writes what it read, and the step it missed (in flight at the loss) is
// in the ledger, where the recount finds it.
func TestASettlementRacingARebuildWritesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	task := f.running("acme")
	f.record(task, 1, 10, 100)
	var seenUnmarked bool
	race := &racing{src: f.ledger, step: func() {
		// step 2 was reserved before the loss (estimate 10 tokens, 100 µ$) and ends now
		f.record(task, 2, 30, 300)
		if err := admission.New(f.rdb, f.keys, nil).SettleStep(f.ctx, nil, quotas.StepParams{TenantID: "acme", Period: period(),
			Tokens: 30 - 10, CostMicro: 300 - 100}); err != nil {
			t.Error(err)
		}
		all, _ := f.rdb.HGetAll(f.ctx, f.keys.AdmissionState("acme")).Result()
		steps, _ := f.rdb.Exists(f.ctx, f.keys.StepsDaily("acme")).Result()
		seenUnmarked = len(all) == 0 && steps == 0
	}}
	q := f.replica(race)
	f.lose()
	if d, err := q.Admit(f.ctx, admitParams("acme", 0)); err != nil || !d.Allowed {
		t.Fatalf("admission: %+v %v", d, err)
	}
	if !seenUnmarked {
		t.Fatal("the settlement on unseeded counters wrote to Redis")
	}
	if s, tok, usd := used(t, q, "acme"); s != 1 || tok != 10 || usd != 100 {
		t.Fatalf("rebuilt counters: steps %v tokens %v usd %v, want what the rebuild read: 1, 10, 100", s, tok, usd)
	}
	// a settlement after the rebuild books its difference as usual
	if err := q.SettleStep(f.ctx, nil, quotas.StepParams{TenantID: "acme", Period: period(), Tokens: 5}); err != nil {
		t.Fatal(err)
	}
	if _, tok, _ := used(t, q, "acme"); tok != 15 {
		t.Fatalf("tokens after a settlement on the rebuilt counters: %v, want 15", tok)
	}
}

// The recount's basis: each tenant's ledger in its own billing period, and what its
// running tasks may hold reserved (one step each, and each one's last step's use; one
// that has recorded none, the most its tenant's latest steps used).
func TestRecountBasis(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a := f.running("a")
	f.record(a, 1, 10, 100)
	f.record(a, 2, 20, 200)
	f.running("a") // running, nothing recorded yet
	done := f.running("b")
	f.record(done, 1, 5, 50)
	testfactory.TaskEnded(t, f.st.Pool(), done, "completed")
	got, err := f.ledger.RecountBasis(f.ctx, []string{"a", "b", "nobody"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("basis for %d tenants, want 2: %+v", len(got), got)
	}
	if l := got["a"]; l.Usage.Tokens != 30 || l.Usage.CostMicro != 300 || l.InFlight != (quotas.InFlight{Steps: 2, Tokens: 40, CostMicro: 400}) {
		t.Fatalf("tenant a: %+v", l)
	}
	if l := got["b"]; l.Usage.Tokens != 5 || l.InFlight != (quotas.InFlight{}) || l.Period.ID == "" {
		t.Fatalf("tenant b: %+v", l)
	}
}
