package rejections_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/billing/rejections"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
)

// rejecting is a fixture of refused admissions under a clock the test moves: one
// tenant (acme, on pro), its limits in Redis, and the flush to Postgres.
type rejecting struct {
	*fixture
	mu  sync.Mutex
	now time.Time
	q   *admission.Store
	rej *rejections.Rejections
	n   int
}

func newRejecting(t *testing.T) *rejecting { return newRejectingOn(t, 1) }

// newRejectingOn is newRejecting on a Redis of shards shards.
func newRejectingOn(t *testing.T, shards int) *rejecting {
	f := &rejecting{fixture: newFixture(t), now: time.Date(2026, 12, 1, 10, 30, 5, 0, time.UTC)}
	if shards != 1 {
		f.rdb, f.keys = testenv.Redis(t, shards)
	}
	f.exec(`INSERT INTO tenants (id, name, plan, created_at) VALUES ('acme', 'Acme', 'pro', '2026-11-15')`)
	f.q = admission.New(f.rdb, f.keys, func() int64 { return f.clock().UnixMilli() })
	f.q.SetUsageSource(f.ledger, nil)
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	f.rej = &rejections.Rejections{Store: f.st, Counts: f.q, Shards: f.keys.Shards(), Plans: plans,
		Events: outbox.Events{UpgradeURL: "https://example.com/upgrade"}, Archetype: &baseservice.Archetype{Clock: f.clock}}
	return f
}

func (f *rejecting) clock() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.now }
func (f *rejecting) advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

// refuse runs n admissions that the limits l refuse.
func (f *rejecting) refuse(n int, l quotas.Limits) {
	f.t.Helper()
	for range n {
		f.n++
		d, err := f.q.Admit(f.ctx, quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: "acme", Kid: "k1", TaskID: string(rune('a' + f.n)),
			InScope: true, Limits: l, Period: quotas.PeriodAt(time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC), f.clock())})
		if err != nil || d.Allowed {
			f.t.Fatalf("admission %+v %v, want refused", d, err)
		}
	}
}

func (f *rejecting) flush() rejections.FlushResult {
	f.t.Helper()
	res, err := f.rej.Flush(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	return res
}

func (f *rejecting) current() map[string]int64 {
	f.t.Helper()
	now := f.clock()
	c, err := f.rej.Current(f.ctx, "acme", quotas.PeriodAt(time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC), now), now)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

// limitHits reads acme's limit_hit events from the table: the feeds hold back what
// other tests' open transactions might still precede.
func (f *rejecting) limitHits() []store.Event {
	f.t.Helper()
	rows, err := f.st.Pool().Query(f.ctx, `SELECT id, payload FROM events WHERE tenant_id = 'acme' AND type = $1 ORDER BY seq`, outbox.TypeLimitHit)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	var evs []store.Event
	for rows.Next() {
		var ev store.Event
		if err := rows.Scan(&ev.ID, &ev.Payload); err != nil {
			f.t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	if err := rows.Err(); err != nil {
		f.t.Fatal(err)
	}
	return evs
}

func backlogZero() quotas.Limits {
	l := quotas.NoLimits()
	l.Backlog = 0
	return l
}

// Refusals in one minute write one limit_hit and are counted; a later minute of a
// rate-like limit is a new window with its own event; counts of ended minutes leave
// Redis once they are in Postgres, and the flush is idempotent.
func TestRefusalsFlushOneEventPerWindowWithCounts(t *testing.T) {
	t.Parallel()
	f := newRejecting(t)
	f.refuse(3, backlogZero())
	if res := f.flush(); res.Rows != 1 || res.Events != 1 {
		t.Fatalf("first flush %+v, want 1 row, 1 event", res)
	}
	f.refuse(2, backlogZero())
	if res := f.flush(); res.Events != 0 {
		t.Fatalf("second flush in the minute wrote %d events", res.Events)
	}
	if res := f.flush(); res.Events != 0 || res.Pruned != 0 {
		t.Fatalf("a flush of nothing new %+v", res)
	}
	if c := f.current(); c[quotas.QueueBacklog] != 5 || len(c) != 1 {
		t.Fatalf("current refusals %v, want queue_backlog 5", c)
	}
	hits := f.limitHits()
	if len(hits) != 1 {
		t.Fatalf("%d limit_hit events, want 1", len(hits))
	}
	_, d := decoded(t, outbox.Event{Payload: hits[0].Payload})
	if d.LimitType != quotas.QueueBacklog || d.LimitValue.N != 1000 || d.Enforcement != outbox.EnforcementRefused ||
		d.SLAClassification != outbox.EnforcedLimit || d.Window == nil || !d.Window.Start.Equal(f.clock().Truncate(time.Minute)) {
		t.Fatalf("limit_hit data %+v", d)
	}

	f.advance(2 * time.Minute)
	f.refuse(1, backlogZero())
	res := f.flush()
	if res.Events != 1 || res.Pruned != 1 {
		t.Fatalf("flush two minutes on %+v, want the new minute's event and the old minute pruned", res)
	}
	if c := f.current(); c[quotas.QueueBacklog] != 1 {
		t.Fatalf("current refusals %v, want this minute's 1", c)
	}
	var total int64
	if err := f.st.Pool().QueryRow(f.ctx, `SELECT sum(count) FROM limit_rejections WHERE tenant_id = 'acme'`).Scan(&total); err != nil || total != 6 {
		t.Fatalf("stored refusals %d %v, want 6", total, err)
	}
}

// A period quota's refusals share the quota's 100 % limit_hit: the step that used the
// quota up wrote it, and the three refusals after it write nothing more, but are
// counted for the whole day, in Redis and, once pruned there, in Postgres.
func TestQuotaRefusalsShareTheHundredPercentEvent(t *testing.T) {
	t.Parallel()
	f := newRejecting(t)
	day := outbox.DaySpan(f.clock())
	crossed, err := outbox.Events{}.Crossings(outbox.Quota{TenantID: "acme", Plan: "pro", LimitType: quotas.AgentStepsDaily,
		Limit: 10, Period: day}, 9, 10, f.clock())
	if err != nil || len(crossed) != 1 {
		t.Fatal(crossed, err)
	}
	if _, err := outbox.WriteEvent(f.ctx, f.st, crossed[0]); err != nil {
		t.Fatal(err)
	}
	l := quotas.NoLimits()
	l.StepsDaily = 0
	f.refuse(3, l)
	if res := f.flush(); res.Events != 0 || res.Rows != 1 {
		t.Fatalf("flush %+v, want the count and no new event", res)
	}
	if hits := f.limitHits(); len(hits) != 1 || hits[0].ID != crossed[0].ID {
		t.Fatalf("limit_hit events %+v, want only the 100 %% one", hits)
	}
	f.advance(5 * time.Minute)
	f.refuse(1, l)
	f.flush()
	if c := f.current(); c[quotas.AgentStepsDaily] != 4 {
		t.Fatalf("current refusals %v, want 4 over the day", c)
	}
	f.advance(24 * time.Hour)
	if c := f.current(); c[quotas.AgentStepsDaily] != 0 {
		t.Fatalf("the next day's refusals %v, want none", c)
	}
}

// Two flushes at once copy each count once and write each event once.
func TestConcurrentFlushesAddNothingTwice(t *testing.T) {
	t.Parallel()
	f := newRejecting(t)
	l := quotas.NoLimits()
	l.TenantRate = 0
	f.refuse(7, l)
	var wg sync.WaitGroup
	events := make([]int, 4)
	for i := range events {
		wg.Go(func() {
			res, err := f.rej.Flush(context.Background())
			if err != nil {
				t.Error(err)
			}
			events[i] = res.Events
		})
	}
	wg.Wait()
	if sum := events[0] + events[1] + events[2] + events[3]; sum != 1 {
		t.Fatalf("%d events written by concurrent flushes, want 1", sum)
	}
	if c := f.current(); c[quotas.TenantRate] != 7 {
		t.Fatalf("current %v, want tenant_rate 7", c)
	}
}

// failEventWrites makes Postgres refuse every write to the events outbox until the
// returned function is called: a flush that copies counts and then fails to write
// their event, as one cut short by its budget, a lost leadership or an error does.
func (f *rejecting) failEventWrites() (heal func()) {
	f.t.Helper()
	f.exec(`CREATE FUNCTION refuse_event() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'event writes are refused'; END $$`)
	f.exec(`CREATE TRIGGER refuse_event BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION refuse_event()`)
	return func() { f.exec(`DROP TRIGGER refuse_event ON events`) }
}

// A flush whose event write fails leaves no count behind that would pass for
// reported: the next flush still writes the window's limit_hit, and only one.
func TestRefusalEventSurvivesAFailedFlush(t *testing.T) {
	t.Parallel()
	f := newRejecting(t)
	f.refuse(3, backlogZero())
	heal := f.failEventWrites()
	if _, err := f.rej.Flush(f.ctx); err == nil {
		t.Fatal("a flush whose event write failed reported no error")
	}
	heal()
	res := f.flush()
	if res.Events != 1 {
		t.Fatalf("the flush after a failed one %+v, want the window's event", res)
	}
	if hits := f.limitHits(); len(hits) != 1 {
		t.Fatalf("%d limit_hit events, want 1", len(hits))
	}
	if c := f.current(); c[quotas.QueueBacklog] != 3 {
		t.Fatalf("current refusals %v, want queue_backlog 3", c)
	}
}

// A flush whose context ends while it writes leaves the next flush to write both the
// counts and the event.
func TestRefusalEventSurvivesACancelledFlush(t *testing.T) {
	t.Parallel()
	f := newRejecting(t)
	f.refuse(2, backlogZero())
	// The event write waits on a lock the test holds, so the flush's context ends
	// after its counts were written and before its event was.
	lock, err := f.st.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(f.ctx, `LOCK TABLE events IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(f.ctx, 300*time.Millisecond)
	_, err = f.rej.Flush(ctx)
	cancel()
	if err := lock.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err == nil {
		t.Fatal("a flush cut short reported no error")
	}
	if res := f.flush(); res.Events != 1 {
		t.Fatalf("the flush after a cut one %+v, want the window's event", res)
	}
	if hits := f.limitHits(); len(hits) != 1 {
		t.Fatalf("%d limit_hit events, want 1", len(hits))
	}
}

// Under a spike of refused tenants each flush is cut short by its budget, yet every
// tenant is flushed: a run resumes where the last one stopped, so the tenants late in
// the order are not starved by a restart at the first one every run.
func TestRefusalFlushResumesWhereTheLastRunStopped(t *testing.T) {
	t.Parallel()
	f := newRejecting(t)
	const tenants = 5000
	f.exec(`INSERT INTO tenants (id, name, plan, created_at)
		SELECT 'ten-' || lpad(i::text, 5, '0'), 'T', 'pro', '2026-11-15' FROM generate_series(1, $1) i`, tenants)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w + 1; i <= tenants; i += 8 {
				d, err := f.q.Admit(f.ctx, quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: fmt.Sprintf("ten-%05d", i), Kid: "k1",
					TaskID: "t", InScope: true, Limits: backlogZero(), Period: quotas.PeriodAt(time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC), f.clock())})
				if err != nil || d.Allowed {
					t.Errorf("admission %+v %v, want refused", d, err)
					return
				}
			}
		})
	}
	wg.Wait()
	f.rej.Page = 25
	flushed := func() (n int) {
		if err := f.st.Pool().QueryRow(f.ctx, `SELECT count(DISTINCT tenant_id) FROM limit_rejections`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	runs, cut, stalled, last := 0, 0, 0, 0
	for last < tenants && stalled < 20 {
		ctx, cancel := context.WithTimeout(f.ctx, 100*time.Millisecond)
		_, err := f.rej.Flush(ctx)
		cancel()
		runs++
		if err != nil {
			if ctx.Err() == nil {
				t.Fatal(err)
			}
			cut++
		}
		if n := flushed(); n > last {
			last, stalled = n, 0
		} else {
			stalled++
		}
	}
	if last != tenants {
		t.Fatalf("%d of %d tenants flushed after %d runs (%d cut short), the last 20 flushing none", last, tenants, runs, cut)
	}
	if cut == 0 {
		t.Fatalf("every one of %d runs finished within its budget: the spike did not test resuming", runs)
	}
	var events int
	if err := f.st.Pool().QueryRow(f.ctx, `SELECT count(DISTINCT tenant_id) FROM events WHERE type = $1`, outbox.TypeLimitHit).Scan(&events); err != nil || events != tenants {
		t.Fatalf("limit_hit events of %d tenants %v, want %d", events, err, tenants)
	}
	t.Logf("%d tenants flushed in %d runs, %d cut short by the budget", tenants, runs, cut)
}

// On several shards too, successive cut runs flush every tenant once round: the
// cursor moves on to the next shard and wraps back to the first.
func TestRefusalFlushResumesAcrossShards(t *testing.T) {
	t.Parallel()
	f := newRejectingOn(t, 4)
	const tenants = 400
	f.exec(`INSERT INTO tenants (id, name, plan, created_at)
		SELECT 'ten-' || lpad(i::text, 5, '0'), 'T', 'pro', '2026-11-15' FROM generate_series(1, $1) i`, tenants)
	for i := 1; i <= tenants; i++ {
		d, err := f.q.Admit(f.ctx, quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: fmt.Sprintf("ten-%05d", i), Kid: "k1",
			TaskID: "t", InScope: true, Limits: backlogZero(), Period: quotas.PeriodAt(time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC), f.clock())})
		if err != nil || d.Allowed {
			t.Fatalf("admission %+v %v, want refused", d, err)
		}
	}
	// A run that stops after each page (its context ends once a page is committed)
	// flushes exactly one page; successive ones must flush everyone, each once.
	f.rej.Page = 7
	seen := map[string]int{}
	for run := 0; run < tenants && len(seen) < tenants; run++ {
		ctx, cancel := context.WithCancel(f.ctx)
		pg := f.rej.Counts
		f.rej.Counts = cancelAfterRead{pg, cancel, new(int)}
		res, err := f.rej.Flush(ctx)
		f.rej.Counts = pg
		cancel()
		if err != nil && ctx.Err() == nil {
			t.Fatal(err)
		}
		if res.Tenants == 0 {
			t.Fatalf("run %d flushed nothing, %d of %d tenants done", run, len(seen), tenants)
		}
		rows, err := f.st.Pool().Query(f.ctx, `SELECT tenant_id FROM limit_rejections`)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			seen[id]++
		}
		f.exec(`DELETE FROM limit_rejections`)
	}
	if len(seen) != tenants {
		t.Fatalf("%d of %d tenants flushed", len(seen), tenants)
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("tenant %s flushed %d times before every tenant was once", id, n)
		}
	}
}

// cancelAfterRead ends a flush's context when it reads its second page of counts:
// the flush has committed its first page and stops there.
type cancelAfterRead struct {
	rejections.RejectionCounts
	cancel func()
	reads  *int
}

func (c cancelAfterRead) Rejections(ctx context.Context, tenants []string) ([]quotas.TenantRejections, error) {
	if *c.reads++; *c.reads > 1 {
		c.cancel()
		return nil, ctx.Err()
	}
	return c.RejectionCounts.Rejections(ctx, tenants)
}

// 40 tenants refused continuously, every round in a new minute: each flush copies
// every tenant's new count and writes every tenant's new limit_hit, none left for a
// later round.
func TestRefusalFlushWritesEachRoundsEvents(t *testing.T) {
	t.Parallel()
	f := newRejecting(t)
	const tenants, rounds = 40, 20
	f.exec(`INSERT INTO tenants (id, name, plan, created_at)
		SELECT 'ten-' || lpad(i::text, 5, '0'), 'T', 'pro', '2026-11-15' FROM generate_series(1, $1) i`, tenants)
	took := make([]time.Duration, 0, rounds)
	for range rounds {
		f.advance(time.Minute)
		for i := 1; i <= tenants; i++ {
			d, err := f.q.Admit(f.ctx, quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: fmt.Sprintf("ten-%05d", i), Kid: "k1",
				TaskID: "t", InScope: true, Limits: backlogZero(), Period: quotas.PeriodAt(time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC), f.clock())})
			if err != nil || d.Allowed {
				t.Fatalf("admission %+v %v, want refused", d, err)
			}
		}
		began := time.Now()
		res := f.flush()
		took = append(took, time.Since(began))
		if res.Tenants != tenants || res.Events != tenants {
			t.Fatalf("flush %+v, want %d tenants and their events", res, tenants)
		}
	}
	slices.Sort(took)
	// What a flush of this shape takes is reported, not asserted: a timing bound would
	// measure the machine the suite runs on.
	t.Logf("flush of %d tenants with a new event each: p50 %v, p90 %v, max %v", tenants, took[rounds/2], took[rounds*9/10], took[rounds-1])
}

// degradedGuard is admission on a Redis that does not answer: every decision is made
// in process, and the guard counts what it refuses.
func (f *rejecting) degradedGuard() *admission.Guard {
	f.t.Helper()
	dead := testenv.DeadRedis(f.t)
	g := admission.NewGuard(admission.New(dead, f.keys, nil), admission.GuardOptions{ID: "replica-1", Timeout: 50 * time.Millisecond, Archetype: &baseservice.Archetype{Clock: f.clock}})
	f.rej.Local = g
	return g
}

// refuseDegraded runs n admissions that a tenant_rate of 0 refuses in process.
func (f *rejecting) refuseDegraded(g *admission.Guard, n int) {
	f.t.Helper()
	l := quotas.NoLimits()
	l.TenantRate = 0
	for range n {
		d, err := g.Admit(f.ctx, quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: "acme", Kid: "k1", TaskID: "t", InScope: true, Limits: l,
			Period: quotas.PeriodAt(time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC), f.clock())})
		if err != nil || d.Allowed || !d.Degraded {
			f.t.Fatalf("admission %+v %v, want refused in process", d, err)
		}
	}
}

func (f *rejecting) degradedCount() (n int64) {
	f.t.Helper()
	if err := f.st.Pool().QueryRow(f.ctx, `SELECT COALESCE(sum(count), 0)::bigint FROM degraded_rejections WHERE tenant_id = 'acme'`).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// Refusals decided in process are kept while Postgres refuses the flush, written with
// their platform limit_hit by the next flush, and forgotten once their minute is over
// and written; a window's platform event is written once, beside the plan's own.
func TestDegradedRefusalsWaitForPostgres(t *testing.T) {
	t.Parallel()
	f := newRejecting(t)
	g := f.degradedGuard()
	f.refuseDegraded(g, 3)
	heal := f.failEventWrites()
	if _, err := f.rej.FlushLocal(f.ctx); err == nil {
		t.Fatal("a flush whose event write failed reported no error")
	}
	if n := f.degradedCount(); n != 0 {
		t.Fatalf("a failed flush left %d counts", n)
	}
	heal()
	f.refuseDegraded(g, 1)
	res, err := f.rej.FlushLocal(f.ctx)
	if err != nil || res.Events != 1 || res.Rows != 1 || res.Pruned != 0 {
		t.Fatalf("flush after Postgres is back %+v %v, want the count and its event", res, err)
	}
	if n := f.degradedCount(); n != 4 {
		t.Fatalf("degraded refusals counted %d, want 4", n)
	}
	// The plan's own refusal in the same window has its event too.
	l := quotas.NoLimits()
	l.TenantRate = 0
	f.refuse(1, l)
	f.flush()
	hits := f.limitHits()
	if len(hits) != 2 {
		t.Fatalf("%d limit_hit events, want the platform's and the plan's", len(hits))
	}
	_, d := decoded(t, outbox.Event{Payload: hits[0].Payload})
	if d.LimitType != quotas.TenantRate || d.Enforcement != outbox.EnforcementRefused || d.SLAClassification != outbox.EligibleBreach ||
		d.RefusedBy != outbox.RefusedByPlatform || d.Window == nil {
		t.Fatalf("degraded limit_hit %+v", d)
	}
	if _, d := decoded(t, outbox.Event{Payload: hits[1].Payload}); d.SLAClassification != outbox.EnforcedLimit || d.RefusedBy != "" {
		t.Fatalf("the plan's limit_hit %+v", d)
	}
	if res, err := f.rej.FlushLocal(f.ctx); err != nil || res.Events != 0 {
		t.Fatalf("flushing again %+v %v, want nothing new", res, err)
	}
	if n := f.degradedCount(); n != 4 {
		t.Fatalf("flushing again counted %d, want 4", n)
	}
	f.advance(2 * time.Minute)
	if res, err := f.rej.FlushLocal(f.ctx); err != nil || res.Pruned != 1 {
		t.Fatalf("flush once the minute is over %+v %v, want it forgotten", res, err)
	}
	if left := g.LocalRejections(); len(left.Counts) != 0 {
		t.Fatalf("in-process counts left %+v", left)
	}
	if n := f.degradedCount(); n != 4 {
		t.Fatalf("counted %d after forgetting, want 4", n)
	}
}

// tokensUsedUp uses up a tokens quota of 5 in period p, as steps do.
func (f *rejecting) tokensUsedUp(p quotas.Period) quotas.Limits {
	f.t.Helper()
	l := quotas.NoLimits()
	l.TokensMonthly = 5
	for range 5 {
		if err := f.q.ReserveStep(f.ctx, quotas.StepParams{TenantID: "acme", Period: p, Limits: l, Tokens: 1}); err != nil {
			f.t.Fatal(err)
		}
	}
	return l
}

func (f *rejecting) limitHitKeys() []string {
	f.t.Helper()
	rows, err := f.st.Pool().Query(f.ctx, `SELECT dedupe_key FROM events WHERE tenant_id = 'acme' AND type = $1 ORDER BY seq`, outbox.TypeLimitHit)
	if err != nil {
		f.t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		f.t.Fatal(err)
	}
	return keys
}

// A monthly quota's refusal decided in period P and counted by a clock already in the
// next period (the flush, Redis's minute) shares P's 100 % event, not the next
// period's: the next period's own 100 % is still to come.
func TestQuotaRefusalAtAPeriodBoundaryKeysItsOwnPeriod(t *testing.T) {
	t.Parallel()
	f := newRejecting(t)
	anchor := time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC)
	f.now = time.Date(2026, 12, 14, 23, 59, 50, 0, time.UTC)
	p := quotas.PeriodAt(anchor, f.clock())
	l := f.tokensUsedUp(p)
	f.advance(30 * time.Second) // the decision's period is P; Redis's clock is past it
	d, err := f.q.Admit(f.ctx, quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: "acme", Kid: "k1", TaskID: "t", InScope: true, Limits: l, Period: p})
	if err != nil || d.Allowed || !slices.Contains(d.Violated, quotas.AITokensMonthly) {
		t.Fatalf("admission %+v %v, want refused by ai_tokens_monthly", d, err)
	}
	if res := f.flush(); res.Events != 1 {
		t.Fatalf("flush %+v, want the quota's event", res)
	}
	want := outbox.PeriodKey("acme", quotas.AITokensMonthly, p.Start, 100)
	if keys := f.limitHitKeys(); len(keys) != 1 || keys[0] != want {
		t.Fatalf("limit_hit keys %q, want [%q]", keys, want)
	}
}

// A task stopped by a monthly quota in period P whose end is written after P ended
// reports P's 100 % event.
func TestBudgetStopAtAPeriodBoundaryKeysItsOwnPeriod(t *testing.T) {
	t.Parallel()
	f := newRejecting(t)
	anchor := time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC)
	f.now = time.Date(2026, 12, 14, 23, 59, 59, 0, time.UTC)
	p := quotas.PeriodAt(anchor, f.clock())
	l := f.tokensUsedUp(p)
	err := f.q.ReserveStep(f.ctx, quotas.StepParams{TenantID: "acme", Period: p, Limits: l, Tokens: 1})
	var qe *quotas.QuotaExceeded
	if !errors.As(err, &qe) || qe.LimitType != quotas.AITokensMonthly {
		t.Fatalf("reservation %v, want refused by ai_tokens_monthly", err)
	}
	stop := qe.Stop()
	finished := p.End.Add(2 * time.Second)
	task := store.Task{ID: uuid.Must(uuid.NewV7()), TenantID: "acme", State: agentqtype.TaskStateBudgetExceeded, FinishedAt: &finished}
	if err := (outbox.Events{}).BudgetStop(f.ctx, f.st, task, &stop); err != nil {
		t.Fatal(err)
	}
	want := outbox.PeriodKey("acme", quotas.AITokensMonthly, p.Start, 100)
	if keys := f.limitHitKeys(); len(keys) != 1 || keys[0] != want {
		t.Fatalf("limit_hit keys %q, want [%q]", keys, want)
	}
}

// The replica's flush of its in-process counts runs once more when it stops: what it
// refused just before is written, though no interval came round.
func TestLocalRejectionFlushFlushesOnStop(t *testing.T) {
	t.Parallel()
	f := newRejecting(t)
	g := f.degradedGuard()
	fl := rejections.NewLocalRejectionFlush(f.rej, rejections.LocalRejectionFlushOptions{Interval: time.Hour})
	if err := fl.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.refuseDegraded(g, 2)
	if n := f.degradedCount(); n != 0 {
		t.Fatalf("%d counted before any flush", n)
	}
	fl.Stop()
	if n := f.degradedCount(); n != 2 {
		t.Fatalf("counted %d after the stop, want 2", n)
	}
	if hits := f.limitHits(); len(hits) != 1 {
		t.Fatalf("%d limit_hit events after the stop, want 1", len(hits))
	}
}

// A task stopped by the daily steps quota on one UTC day whose end is written on the
// next reports the day it was refused on.
func TestBudgetStopAtADayBoundaryKeysItsOwnDay(t *testing.T) {
	t.Parallel()
	f := newRejecting(t)
	f.now = time.Date(2026, 12, 1, 23, 59, 59, 0, time.UTC)
	l := quotas.NoLimits()
	l.StepsDaily = 0
	err := f.q.ReserveStep(f.ctx, quotas.StepParams{TenantID: "acme", Period: quotas.PeriodAt(time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC), f.clock()), Limits: l})
	var qe *quotas.QuotaExceeded
	if !errors.As(err, &qe) || qe.LimitType != quotas.AgentStepsDaily {
		t.Fatalf("reservation %v, want refused by agent_steps_daily", err)
	}
	stop := qe.Stop()
	finished := f.clock().Add(2 * time.Second)
	task := store.Task{ID: uuid.Must(uuid.NewV7()), TenantID: "acme", State: agentqtype.TaskStateBudgetExceeded, FinishedAt: &finished}
	if err := (outbox.Events{}).BudgetStop(f.ctx, f.st, task, &stop); err != nil {
		t.Fatal(err)
	}
	want := outbox.PeriodKey("acme", quotas.AgentStepsDaily, outbox.DaySpan(f.clock()).Start, 100)
	if keys := f.limitHitKeys(); len(keys) != 1 || keys[0] != want {
		t.Fatalf("limit_hit keys %q, want [%q]", keys, want)
	}
}

// A refusal by a global limit stricter than the tenant's plan (AGENTQ_RATE_*,
// AGENTQ_TENANT_MAX_INFLIGHT) is the platform's: eligible_breach, refused_by
// platform. A tenant's own override of that limit is its own again.
func TestRefusalByAStricterGlobalLimitIsThePlatforms(t *testing.T) {
	t.Parallel()
	f := newRejecting(t)
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	one, twoHundred := 1.0, 200.0
	if err := plans.ApplyGlobals(quotas.Globals{TenantRPS: &one, KeyRPS: &twoHundred}); err != nil {
		t.Fatal(err)
	}
	f.rej.Plans = plans
	l := quotas.NoLimits()
	l.TenantRate, l.TenantBurst = 1, 1
	if d, err := f.q.Admit(f.ctx, quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: "acme", Kid: "k1", TaskID: "first",
		InScope: true, Limits: l, Period: quotas.PeriodAt(time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC), f.clock())}); err != nil || !d.Allowed {
		t.Fatalf("the first admission: %+v %v", d, err)
	}
	f.refuse(2, l)
	if res := f.flush(); res.Events != 1 {
		t.Fatalf("flush %+v, want one event", res)
	}
	hits := f.limitHits()
	if len(hits) != 1 {
		t.Fatalf("%d limit_hit events, want 1", len(hits))
	}
	_, d := decoded(t, outbox.Event{Payload: hits[0].Payload})
	if d.LimitType != quotas.TenantRate || d.SLAClassification != outbox.EligibleBreach || d.RefusedBy != outbox.RefusedByPlatform {
		t.Fatalf("a refusal by the stricter global tenant_rate: %+v", d)
	}
	// key_rate 200 is looser than pro's 20: the plan's own.
	if plans.ByPlatform("pro", nil, quotas.KeyRate) || !plans.ByPlatform("pro", nil, quotas.TenantRate) {
		t.Error("ByPlatform: only the stricter global limit is the platform's")
	}
	if plans.ByPlatform("pro", map[string]quotas.Limit{quotas.TenantRate: 1}, quotas.TenantRate) {
		t.Error("a tenant's own override is its own limit")
	}
}

// A budget stop of a task in a tree names its tree: its event carries the task and
// its root (root_id), so a tree's events can be told apart; a task outside any tree
// carries neither.
func TestBudgetStopOfATreeTaskNamesItsRoot(t *testing.T) {
	t.Parallel()
	f := newRejecting(t)
	root := uuid.Must(uuid.NewV7())
	finished := time.Now()
	stop := quotas.Stop{LimitType: quotas.TaskMaxSteps, Limit: 2, Used: 2}
	child := store.Task{ID: uuid.Must(uuid.NewV7()), TenantID: "acme", State: agentqtype.TaskStateBudgetExceeded, FinishedAt: &finished,
		ParentID: &root, RootID: &root, Depth: 1}
	if err := (outbox.Events{}).BudgetStop(f.ctx, f.st, child, &stop); err != nil {
		t.Fatal(err)
	}
	plain := store.Task{ID: uuid.Must(uuid.NewV7()), TenantID: "acme", State: agentqtype.TaskStateBudgetExceeded, FinishedAt: &finished}
	costStop := quotas.Stop{LimitType: quotas.TaskMaxCostUSD, Limit: 10_000, Used: 10_000}
	if err := (outbox.Events{}).BudgetStop(f.ctx, f.st, plain, &costStop); err != nil {
		t.Fatal(err)
	}
	rows, err := f.st.Pool().Query(f.ctx, `SELECT payload FROM events WHERE tenant_id = 'acme' AND type = $1 ORDER BY seq`, outbox.TypeLimitHit)
	if err != nil {
		t.Fatal(err)
	}
	payloads, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil || len(payloads) != 2 {
		t.Fatalf("%d limit_hit events (%v), want 2", len(payloads), err)
	}
	var got [2]struct {
		TaskID string `json:"task_id"`
		RootID string `json:"root_id"`
	}
	for i, p := range payloads {
		var ev struct{ Data json.RawMessage }
		if err := json.Unmarshal(p, &ev); err != nil || json.Unmarshal(ev.Data, &got[i]) != nil {
			t.Fatalf("event %s: %v", p, err)
		}
	}
	if got[0].TaskID != child.ID.String() || got[0].RootID != root.String() {
		t.Fatalf("the stop of a tree's child carries task %q, root %q; want %s, %s", got[0].TaskID, got[0].RootID, child.ID, root)
	}
	if got[1].RootID != "" {
		t.Fatalf("the stop of a task outside any tree carries root %q", got[1].RootID)
	}
}
