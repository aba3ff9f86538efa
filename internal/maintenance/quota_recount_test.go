package maintenance

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/agentq/agentq/billing/usage"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv/testfactory"
	"github.com/agentq/agentq/quotas"
)

// recountFixture is a fixture whose limits rebuild from, and whose recount reads, the
// real ledger.
func recountFixture(t *testing.T) (*fixture, *QuotaRecount) {
	t.Helper()
	f := newFixture(t)
	ledger := usage.NewLedger(store.New(f.Pool))
	f.q.SetUsageSource(ledger, nil)
	f.Usage = ledger
	return f, NewQuotaRecount(f.Deps, NewElector(f.Deps, ElectorConfig{}), QuotaRecountConfig{})
}

// running writes a running task of tenant under attempt 1.
func (f *fixture) running(tenant string) uuid.UUID {
	f.t.Helper()
	id := f.task(tenant)
	testfactory.TaskRunning(f.t, f.Pool, id)
	return id
}

// record writes step n of a running task to the ledger, as the worker does.
func (f *fixture) record(task uuid.UUID, n int, tokens, costMicro int64) {
	f.t.Helper()
	if _, _, err := store.New(f.Pool).UnscopedRecordStep(f.ctx, store.RecordStepParams{ID: task, Attempt: 1, Step: n, Tokens: tokens, CostMicro: costMicro}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) period(tenant string) quotas.Period {
	f.t.Helper()
	tn, err := f.Store.GetTenant(f.ctx, tenant)
	if err != nil {
		f.t.Fatal(err)
	}
	return quotas.PeriodAt(tn.CreatedAt, time.Now())
}

// counters reads a tenant's period counters as /v1/usage does.
func (f *fixture) counters(tenant string) (steps, tokens, usd float64) {
	f.t.Helper()
	l := quotas.NoLimits()
	d, err := f.q.Admit(f.ctx, quotas.AdmitParams{Mode: quotas.ModePeek, TenantID: tenant, Kid: "k", Limits: l, Period: f.period(tenant)})
	if err != nil {
		f.t.Fatal(err)
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

func (f *fixture) step(tenant string, p quotas.StepParams) {
	f.t.Helper()
	p.TenantID, p.Period, p.Limits = tenant, f.period(tenant), quotas.NoLimits()
	if err := f.q.ReserveStep(f.ctx, p); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) settle(tenant string, p quotas.StepParams) {
	f.t.Helper()
	p.TenantID, p.Period = tenant, f.period(tenant)
	if err := f.q.SettleStep(f.ctx, nil, p); err != nil {
		f.t.Fatal(err)
	}
}

// The recount brings inflated counters (reservations a dead worker never settled)
// down to the ledger, and deflated ones (a refund of a reservation Redis had lost)
// up to it; counters in line are left alone.
func TestQuotaRecountCorrectsInflatedAndDeflatedCounters(t *testing.T) {
	t.Parallel()
	f, p := recountFixture(t)
	f.tenant("m")
	task := f.running("m")
	f.record(task, 1, 10, 100)
	f.record(task, 2, 20, 200)
	testfactory.TaskInState(t, f.Pool, task, "completed")
	if s, tok, usd := f.counters("m"); s != 2 || tok != 30 || usd != 300 { // rebuilt from the ledger
		t.Fatalf("counters before any drift: %v %v %v", s, tok, usd)
	}
	if res, err := p.runOnce(f.ctx); err != nil || res.Corrected != 0 || !res.Stats.Done {
		t.Fatalf("a run over counters in line: %+v %v", res, err)
	}

	// inflated: two steps reserved, their worker died
	f.step("m", quotas.StepParams{Tokens: 20, CostMicro: 200})
	f.step("m", quotas.StepParams{Tokens: 20, CostMicro: 200})
	res, err := p.runOnce(f.ctx)
	if err != nil || res.Corrected != 1 || res.Steps != 2 || res.Tokens != 40 || res.CostMicro != 400 {
		t.Fatalf("recount of inflated counters: %+v %v", res, err)
	}
	if s, tok, usd := f.counters("m"); s != 2 || tok != 30 || usd != 300 {
		t.Fatalf("inflated counters after the recount: %v %v %v, want the ledger's 2, 30, 300", s, tok, usd)
	}

	// deflated: a refund of more than the counters hold
	f.settle("m", quotas.StepParams{Steps: -1, Tokens: -25, CostMicro: -250})
	if s, tok, _ := f.counters("m"); s != 1 || tok != 5 {
		t.Fatalf("the refund did not deflate the counters: %v %v", s, tok)
	}
	res, err = p.runOnce(f.ctx)
	if err != nil || res.Corrected != 1 || res.Steps != 1 || res.Tokens != 25 || res.CostMicro != 250 {
		t.Fatalf("recount of deflated counters: %+v %v", res, err)
	}
	if s, tok, usd := f.counters("m"); s != 2 || tok != 30 || usd != 300 {
		t.Fatalf("deflated counters after the recount: %v %v %v, want 2, 30, 300", s, tok, usd)
	}
	if res, err := p.runOnce(f.ctx); err != nil || res.Corrected != 0 {
		t.Fatalf("a run after the corrections: %+v %v", res, err)
	}
}

// A running task's reservation is in the counters and not yet in the ledger: the
// recount leaves it (one step, at most the task's last step's use), and lowers only
// what is beyond it.
func TestQuotaRecountLeavesInFlightReservations(t *testing.T) {
	t.Parallel()
	f, p := recountFixture(t)
	f.tenant("m")
	task := f.running("m")
	f.record(task, 1, 10, 100)
	f.step("m", quotas.StepParams{Tokens: 10, CostMicro: 100}) // step 2 runs
	if res, err := p.runOnce(f.ctx); err != nil || res.Corrected != 0 {
		t.Fatalf("a run with a step in flight: %+v %v", res, err)
	}
	if s, tok, usd := f.counters("m"); s != 2 || tok != 20 || usd != 200 {
		t.Fatalf("counters with a step in flight: %v %v %v, want 2, 20, 200", s, tok, usd)
	}
	// a reservation leaked by an earlier attempt of the task comes on top
	f.step("m", quotas.StepParams{Tokens: 50, CostMicro: 500})
	res, err := p.runOnce(f.ctx)
	if err != nil || res.Corrected != 1 {
		t.Fatalf("a run with more reserved than the running task may hold: %+v %v", res, err)
	}
	if s, tok, usd := f.counters("m"); s != 2 || tok != 20 || usd != 200 {
		t.Fatalf("counters after the recount: %v %v %v, want the ledger plus one step in flight: 2, 20, 200", s, tok, usd)
	}
	// the step ends and is settled: in line with the ledger
	f.record(task, 2, 10, 100)
	if res, err := p.runOnce(f.ctx); err != nil || res.Corrected != 0 {
		t.Fatalf("a run after the step was recorded: %+v %v", res, err)
	}
}

// A task that has recorded no step yet reserves its first step from what its tenant's
// steps used before (the worker's running average): the recount leaves that
// reservation in flight, so once the step is recorded the counters are not below the
// ledger.
func TestQuotaRecountLeavesAFirstStepInFlight(t *testing.T) {
	t.Parallel()
	f, p := recountFixture(t)
	f.tenant("m")
	done := f.running("m")
	f.record(done, 1, 10, 100)
	testfactory.TaskInState(t, f.Pool, done, "completed")
	f.counters("m")                                              // seeded from the ledger: 1, 10, 100
	f.step("m", quotas.StepParams{Tokens: 500, CostMicro: 5000}) // the leak: never recorded
	fresh := f.running("m")
	f.step("m", quotas.StepParams{Tokens: 10, CostMicro: 100}) // its first step, in flight
	res, err := p.runOnce(f.ctx)
	if err != nil || res.Corrected != 1 || res.Tokens != 500 || res.CostMicro != 5000 {
		t.Fatalf("a run with a leak and a first step in flight: %+v %v", res, err)
	}
	f.record(fresh, 1, 10, 100)
	if s, tok, usd := f.counters("m"); s != 2 || tok != 20 || usd != 200 {
		t.Fatalf("counters after the first step was recorded: %v %v %v, want the ledger's 2, 20, 200", s, tok, usd)
	}
}

// Tenants whose counters Redis lost are left to admission: the recount creates no
// state for them.
func TestQuotaRecountSkipsUnseededTenants(t *testing.T) {
	t.Parallel()
	f, p := recountFixture(t)
	f.tenant("idle")
	task := f.running("idle")
	f.record(task, 1, 10, 100)
	res, err := p.runOnce(f.ctx)
	if err != nil || res.Corrected != 0 || res.Stats.Rows != 1 || !res.Stats.Done {
		t.Fatalf("a run over an unseeded tenant: %+v %v", res, err)
	}
	if n, _ := f.Redis.Exists(f.ctx, f.Keys.AdmissionState("idle"), f.Keys.StepsDaily("idle")).Result(); n != 0 {
		t.Fatalf("the recount created %d keys for an unseeded tenant", n)
	}
}

// The pass runs on its interval while its elector leads.
func TestQuotaRecountRunsOnItsInterval(t *testing.T) {
	t.Parallel()
	f, _ := recountFixture(t)
	e := NewElector(f.Deps, ElectorConfig{})
	p := NewQuotaRecount(f.Deps, e, QuotaRecountConfig{Interval: 20 * time.Millisecond})
	p.TestSignals.Init(t)
	f.tenant("m")
	task := f.running("m")
	f.record(task, 1, 10, 100)
	testfactory.TaskInState(t, f.Pool, task, "completed")
	f.counters("m")
	f.step("m", quotas.StepParams{Tokens: 5})
	if err := e.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	if err := p.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	for {
		if res := p.TestSignals.Ran.WaitOrTimeout(); res.Corrected == 1 {
			break
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	if s, tok, _ := f.counters("m"); s != 1 || tok != 10 {
		t.Fatalf("counters after the pass ran: %v %v", s, tok)
	}
}

// A tenant that always has a step in flight still has its drifted counters corrected:
// four workers run steps back to back (reserve, record, settle), so the counters move
// all the time, while a reservation leaked long ago inflates the tokens by 5,000.
func TestQuotaRecountCorrectsATenantAlwaysBusy(t *testing.T) {
	t.Parallel()
	f, p := recountFixture(t)
	f.tenant("busy")
	f.step("busy", quotas.StepParams{Tokens: 5000}) // the leak: never recorded, never settled
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var steps atomic.Int64
	for range 4 {
		task := f.running("busy")
		wg.Go(func() {
			st := store.New(f.Pool)
			for n := 1; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				f.step("busy", quotas.StepParams{Tokens: 10})
				if _, _, err := st.UnscopedRecordStep(f.ctx, store.RecordStepParams{ID: task, Attempt: 1, Step: n, Tokens: 10}); err != nil {
					t.Error(err)
					return
				}
				steps.Add(1)
			}
		})
	}
	for steps.Load() < 20 { // the workers are under way
		time.Sleep(time.Millisecond)
	}
	res, err := p.runOnce(f.ctx)
	close(stop)
	wg.Wait()
	if err != nil || res.Corrected != 1 || res.Busy != 0 {
		t.Fatalf("a run over a tenant always busy: %+v %v", res, err)
	}
	// With the workers stopped, nothing is in flight: the counters are the ledger's,
	// but for what the recount had to leave as possibly reserved (four steps of 10).
	ledger := 10 * steps.Load()
	if _, tok, _ := f.counters("busy"); tok < float64(ledger) || tok > float64(ledger+40) {
		t.Fatalf("tokens after the recount: %v, the ledger holds %d (the leak of 5,000 not corrected?)", tok, ledger)
	}
}

// A tenant whose ledger cannot be held still (a step's record holds its rollups past
// usage.HoldWait) is left uncorrected, and counted on agentq.quotas.recount_skipped;
// the next run corrects it.
func TestQuotaRecountCountsTenantsLeftUncorrected(t *testing.T) {
	t.Parallel()
	f, _ := recountFixture(t)
	reader := sdkmetric.NewManualReader()
	f.Archetype = &baseservice.Archetype{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}
	p := NewQuotaRecount(f.Deps, NewElector(f.Deps, ElectorConfig{}), QuotaRecountConfig{Budget: time.Minute})
	f.tenant("held")
	f.step("held", quotas.StepParams{Tokens: 500}) // drift: never recorded
	skipped := func() int64 {
		t.Helper()
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(f.ctx, &rm); err != nil {
			t.Fatal(err)
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name == "agentq.quotas.recount_skipped" {
					var n int64
					for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
						n += dp.Value
					}
					return n
				}
			}
		}
		t.Fatal("agentq.quotas.recount_skipped is not exported")
		return 0
	}
	if n := skipped(); n != 0 {
		t.Fatalf("recount_skipped before any run: %d", n)
	}
	// A step's record holds the tenant's rollups (shared) longer than the recount waits.
	tx, err := f.Pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(f.ctx, `SELECT pg_advisory_xact_lock_shared(hashtextextended(current_schema() || '|rollups|' || 'held', 0))`); err != nil {
		t.Fatal(err)
	}
	res, err := p.runOnce(f.ctx)
	if rerr := tx.Rollback(f.ctx); rerr != nil {
		t.Fatal(rerr)
	}
	if err != nil || res.Busy != 1 || res.Corrected != 0 {
		t.Fatalf("a run with the tenant's ledger held off: %+v %v", res, err)
	}
	if n := skipped(); n != 1 {
		t.Fatalf("recount_skipped after a tenant was left uncorrected: %d, want 1", n)
	}
	if res, err := p.runOnce(f.ctx); err != nil || res.Corrected != 1 || res.Tokens != 500 {
		t.Fatalf("the next run: %+v %v", res, err)
	}
}
