package usage_test

import (
	"bytes"
	"encoding/csv"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/billing/usage"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
)

// Rollups kept step by step equal the rollups rebuilt from the ledger, whatever the
// steps and however often they are retried.
func TestIncrementalRollupsEqualRebuilt(t *testing.T) {
	f := newFixture(t)
	rnd := rand.New(rand.NewPCG(1, 2))
	tasks := []uuid.UUID{f.running("acme"), f.running("acme"), f.running("acme")}
	next := make([]int, len(tasks))
	for i := 0; i < 60; i++ {
		k := rnd.IntN(len(tasks))
		n := next[k] + 1
		if next[k] > 0 && rnd.IntN(3) == 0 {
			n = next[k] // a retry of the last step: recorded once
		}
		next[k] = n
		f.record(tasks[k], n, rnd.Int64N(500), rnd.Int64N(20000))
	}
	before, err := f.st.UnscopedTenantRollups(f.ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	steps := 0
	for _, n := range next {
		steps += n
	}
	if len(before.Periods) != 1 || before.Periods[0].Steps != int64(steps) {
		t.Fatalf("period rollups %+v, want %d steps", before.Periods, steps)
	}
	if err := usage.NewRollups(f.st).Rebuild(f.ctx, "acme", time.Time{}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	after, err := f.st.UnscopedTenantRollups(f.ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	assertRollups(t, after, before)
	// A range rebuild of the current period changes nothing either.
	if err := usage.NewRollups(f.st).Rebuild(f.ctx, "acme", time.Now().Add(-time.Minute), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	again, err := f.st.UnscopedTenantRollups(f.ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	assertRollups(t, again, before)
	total, err := f.st.UnscopedLedgerTotals(f.ctx, "acme", before.Periods[0].Period.Start, before.Periods[0].Period.End)
	if err != nil || total != before.Periods[0].Rollup {
		t.Fatalf("ledger totals %+v (%v), period rollup %+v", total, err, before.Periods[0].Rollup)
	}
}

func assertRollups(t *testing.T, got, want store.TenantRollups) {
	t.Helper()
	eq := func(name string, a, b int, same func(i int) bool) {
		if a != b {
			t.Fatalf("%s: %d rows, want %d\ngot  %+v\nwant %+v", name, a, b, got, want)
		}
		for i := 0; i < a; i++ {
			if !same(i) {
				t.Fatalf("%s row %d differs\ngot  %+v\nwant %+v", name, i, got, want)
			}
		}
	}
	eq("hours", len(got.Hours), len(want.Hours), func(i int) bool { return got.Hours[i] == want.Hours[i] })
	eq("days", len(got.Days), len(want.Days), func(i int) bool { return got.Days[i] == want.Days[i] })
	eq("periods", len(got.Periods), len(want.Periods), func(i int) bool { return got.Periods[i] == want.Periods[i] })
}

// ledgerRow writes one step's three ledger rows at a chosen time (the worker's steps
// are stamped with the transaction's clock, which a test cannot move).
func (f *fixture) ledgerRow(tenant string, task uuid.UUID, step int, at time.Time, tokens, micro int64) {
	f.t.Helper()
	f.exec(`INSERT INTO usage_ledger (task_id, step, meter, tenant_id, quantity, recorded_at)
		VALUES ($1, $2, 'steps', $3, 1, $4), ($1, $2, 'tokens', $3, $5, $4), ($1, $2, 'cost_micro_usd', $3, $6, $4)`,
		task, step, tenant, at, tokens, micro)
}

// Rebuilt rollups cut days and periods where the tenant's zone and billing day say,
// and the export of a month gives each tenant its period starting in it, summing
// exactly to the ledger over that period, in JSON and in CSV.
func TestRebuildAndExportFollowTheAnchor(t *testing.T) {
	f := newFixture(t)
	created := time.Date(2025, 12, 1, 0, 0, 0, 0, time.UTC)
	f.exec(`INSERT INTO tenants (id, name, plan, created_at, billing_day, time_zone) VALUES
		('ny', 'ny', 'pro', $1, 31, 'America/New_York'),
		('in', 'in', 'pro', $1, 10, 'Asia/Kolkata'),
		('utc', 'utc', 'free', $1, NULL, NULL)`, created)
	f.exec(`INSERT INTO tenants (id, name, plan, created_at) VALUES ('late', 'late', 'pro', '2026-06-01')`)
	task := map[string]uuid.UUID{}
	for _, id := range []string{"ny", "in", "utc"} {
		task[id] = uuid.Must(uuid.NewV7())
		f.exec(`INSERT INTO tasks (id, tenant_id, kid, agent, request_hash, state) VALUES ($1, $2, 'k', 'sim', '\x01', 'completed')`, task[id], id)
	}
	// Steps every 7 h 15 min from mid-January to mid-April: across month ends, New
	// York's DST start (March 8) and Kolkata's half-hour midnights.
	rnd := rand.New(rand.NewPCG(3, 4))
	type row struct {
		at     time.Time
		tokens int64
		micro  int64
	}
	rows := map[string][]row{}
	step := 0
	for at := time.Date(2026, 1, 15, 0, 0, 0, 0, time.UTC); at.Before(time.Date(2026, 4, 15, 0, 0, 0, 0, time.UTC)); at = at.Add(7*time.Hour + 15*time.Minute) {
		step++
		for _, id := range []string{"ny", "in", "utc"} {
			r := row{at: at, tokens: rnd.Int64N(1000), micro: rnd.Int64N(3_000_000)}
			rows[id] = append(rows[id], r)
			f.ledgerRow(id, task[id], step, r.at, r.tokens, r.micro)
		}
	}
	ro := usage.NewRollups(f.st)
	for _, id := range []string{"ny", "in", "utc"} {
		if err := ro.Rebuild(f.ctx, id, time.Time{}, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	// The rebuilt days and periods are what the anchor says of each row.
	for _, id := range []string{"ny", "in", "utc"} {
		tn, err := f.st.GetTenant(f.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		a := tn.Anchor()
		days := map[string]store.Rollup{}
		periods := map[string]store.Rollup{}
		for _, r := range rows[id] {
			d := r.at.In(zoneOf(a)).Format(time.DateOnly)
			days[d] = store.Rollup{Steps: days[d].Steps + 1, Tokens: days[d].Tokens + r.tokens, CostMicro: days[d].CostMicro + r.micro}
			p := a.PeriodAt(r.at).ID
			periods[p] = store.Rollup{Steps: periods[p].Steps + 1, Tokens: periods[p].Tokens + r.tokens, CostMicro: periods[p].CostMicro + r.micro}
		}
		got, err := f.st.UnscopedTenantRollups(f.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Days) != len(days) || len(got.Periods) != len(periods) {
			t.Fatalf("%s: %d days, %d periods; want %d, %d", id, len(got.Days), len(got.Periods), len(days), len(periods))
		}
		for _, d := range got.Days {
			if d.Rollup != days[d.Day] {
				t.Errorf("%s day %s: %+v, want %+v", id, d.Day, d.Rollup, days[d.Day])
			}
		}
		for _, p := range got.Periods {
			if p.Rollup != periods[p.Period.ID] {
				t.Errorf("%s period %s: %+v, want %+v", id, p.Period.ID, p.Rollup, periods[p.Period.ID])
			}
		}
	}

	exp, err := ro.Export(f.ctx, "2026-03")
	if err != nil {
		t.Fatal(err)
	}
	if len(exp.Tenants) != 3 || exp.Tenants[0].TenantID != "in" || exp.Tenants[1].TenantID != "ny" || exp.Tenants[2].TenantID != "utc" {
		t.Fatalf("export tenants %+v, want in, ny, utc (late was created after March's periods)", exp.Tenants)
	}
	wantStart := map[string]string{"in": "2026-03-09T18:30:00Z", "ny": "2026-03-31T04:00:00Z", "utc": "2026-03-01T00:00:00Z"}
	var sum store.Rollup
	for _, tu := range exp.Tenants {
		if got := tu.Period.Start.UTC().Format(time.RFC3339); got != wantStart[tu.TenantID] {
			t.Errorf("%s: period starts %s, want %s", tu.TenantID, got, wantStart[tu.TenantID])
		}
		ledger, err := f.st.UnscopedLedgerTotals(f.ctx, tu.TenantID, tu.Period.Start, tu.Period.End)
		if err != nil {
			t.Fatal(err)
		}
		got := store.Rollup{Steps: tu.Meters[0].Quantity, Tokens: tu.Meters[1].Quantity, CostMicro: tu.Meters[2].Quantity}
		if got != ledger || ledger.Steps == 0 {
			t.Errorf("%s: export %+v, ledger %+v", tu.TenantID, got, ledger)
		}
		if tu.Meters[2].USD != outbox.FormatUSD(ledger.CostMicro) {
			t.Errorf("%s: usd %q, want %q", tu.TenantID, tu.Meters[2].USD, outbox.FormatUSD(ledger.CostMicro))
		}
		sum = store.Rollup{Steps: sum.Steps + ledger.Steps, Tokens: sum.Tokens + ledger.Tokens, CostMicro: sum.CostMicro + ledger.CostMicro}
	}
	if exp.Totals[0].Quantity != sum.Steps || exp.Totals[1].Quantity != sum.Tokens || exp.Totals[2].Quantity != sum.CostMicro {
		t.Errorf("totals %+v, want %+v", exp.Totals, sum)
	}

	// The CSV holds the same numbers, one row per tenant and meter.
	var b bytes.Buffer
	if err := usage.WriteCSV(&b, exp); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&b).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1+3*3 || recs[0][0] != "period" || recs[0][7] != "quantity" {
		t.Fatalf("csv: %q", recs)
	}
	csvSum := map[string]int64{}
	for _, r := range recs[1:] {
		n, err := strconv.ParseInt(r[7], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		csvSum[r[6]] += n
		if r[6] == usage.MeterCostMicro {
			if usd, err := outbox.ParseUSD(r[8]); err != nil || usd != n {
				t.Errorf("csv usd %q for %d micro-dollars", r[8], n)
			}
		}
	}
	if csvSum[usage.MeterSteps] != sum.Steps || csvSum[usage.MeterTokens] != sum.Tokens || csvSum[usage.MeterCostMicro] != sum.CostMicro {
		t.Errorf("csv sums %v, want %+v", csvSum, sum)
	}

	// A month without use lists the tenants with zeros; a malformed one is refused.
	if e, err := ro.Export(f.ctx, "2026-08"); err != nil || len(e.Tenants) != 4 || e.Totals[0].Quantity != 0 {
		t.Errorf("export of an empty month: %+v %v", e, err)
	}
	for _, bad := range []string{"", "2026-3", "2026-13", "2026-00", "26-03", "2026-03-01", "1999-12", "２０２６-03"} {
		if _, err := ro.Export(f.ctx, bad); err != usage.ErrBadPeriod {
			t.Errorf("Export(%q): %v, want ErrBadPeriod", bad, err)
		}
	}
}

func zoneOf(a quotas.Anchor) *time.Location {
	if a.Zone == nil {
		return time.UTC
	}
	return a.Zone
}

// The export labels each period with the plan that was in force in it, not the
// tenant's plan today: a tenant created on free two months ago, with use last month,
// moves to enterprise now. Its first period (no use), last month's and this month's
// show free, free and enterprise; a rebuild of its rollups keeps them.
func TestExportShowsThePlanOfEachPeriod(t *testing.T) {
	f := newFixture(t)
	now := time.Now().UTC()
	month := func(back int) time.Time {
		return time.Date(now.Year(), now.Month()-time.Month(back), 1, 0, 0, 0, 0, time.UTC)
	}
	f.exec(`INSERT INTO tenants (id, name, plan, created_at, billing_day) VALUES ('pl', 'pl', 'free', $1, 1)`, month(2).Add(72*time.Hour))
	task := uuid.Must(uuid.NewV7())
	f.exec(`INSERT INTO tasks (id, tenant_id, kid, agent, request_hash, state) VALUES ($1, 'pl', 'k', 'sim', '\x01', 'completed')`, task)
	f.ledgerRow("pl", task, 1, month(1).Add(48*time.Hour), 10, 20)
	ro := usage.NewRollups(f.st)
	if err := ro.Rebuild(f.ctx, "pl", time.Time{}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tenants.New(f.st, plans, tenants.Options{}).Update(f.ctx, tenants.UpdateParams{ID: "pl", Plan: ptr("enterprise")}); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		for back, want := range []string{"enterprise", "free", "free"} {
			m := month(back).Format("2006-01")
			exp, err := ro.Export(f.ctx, m)
			if err != nil {
				t.Fatal(err)
			}
			if len(exp.Tenants) != 1 || exp.Tenants[0].Plan != want {
				t.Errorf("%s: export of %s: %+v, want plan %s", when, m, exp.Tenants, want)
			}
		}
	}
	check("after the plan change")
	if err := ro.Rebuild(f.ctx, "pl", time.Time{}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	check("after a rebuild")
}

func ptr[T any](v T) *T { return &v }

// A change of the billing anchor rewrites the tenant's whole history of rollups in
// bounded pieces, a transaction per billing period (a transaction over the whole
// history would hold back every tenant's feed and webhooks while it ran), and ends
// with every period of the new anchor equal to the ledger's sums over it.
func TestAnchorChangeRebuildsInPieces(t *testing.T) {
	f := newFixture(t)
	now := time.Now().UTC()
	created := time.Date(now.Year(), now.Month()-8, 1, 0, 0, 0, 0, time.UTC)
	f.exec(`INSERT INTO tenants (id, name, plan, created_at, billing_day) VALUES ('hist', 'hist', 'pro', $1, 1)`, created)
	task := uuid.Must(uuid.NewV7())
	f.exec(`INSERT INTO tasks (id, tenant_id, kid, agent, request_hash, state) VALUES ($1, 'hist', 'k', 'sim', '\x01', 'completed')`, task)
	step := 0
	for at := created.Add(time.Hour); at.Before(now); at = at.Add(41 * time.Hour) {
		step++
		f.ledgerRow("hist", task, step, at, int64(step), int64(10*step))
	}
	ro := usage.NewRollups(f.st)
	if err := ro.Rebuild(f.ctx, "hist", time.Time{}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tenants.New(f.st, plans, tenants.Options{}).Update(f.ctx, tenants.UpdateParams{ID: "hist", BillingDay: ptr(17), TimeZone: ptr("Asia/Kolkata")}); err != nil {
		t.Fatal(err)
	}
	tn, err := f.st.GetTenant(f.ctx, "hist")
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.st.UnscopedTenantRollups(f.ctx, "hist")
	if err != nil {
		t.Fatal(err)
	}
	a := tn.Anchor()
	if want := a.PeriodAt(now).ID; len(got.Periods) < 8 || got.Periods[len(got.Periods)-1].Period.ID != want {
		t.Fatalf("periods after the change: %+v; want 8 or more, the last %s", got.Periods, want)
	}
	for _, p := range got.Periods {
		if p.Period != a.PeriodAt(p.Period.Start) {
			t.Errorf("period %+v is not one of the new anchor's", p.Period)
		}
		ledger, err := f.st.UnscopedLedgerTotals(f.ctx, "hist", p.Period.Start, p.Period.End)
		if err != nil {
			t.Fatal(err)
		}
		if p.Rollup != ledger {
			t.Errorf("period %s: %+v, the ledger %+v", p.Period.ID, p.Rollup, ledger)
		}
	}
	var writers int
	if err := f.st.Pool().QueryRow(f.ctx, `SELECT count(DISTINCT xmin::text) FROM usage_rollup_period WHERE tenant_id = 'hist'`).Scan(&writers); err != nil {
		t.Fatal(err)
	}
	if writers < len(got.Periods)-1 {
		t.Fatalf("%d periods written by %d transactions: the history was not rebuilt a period at a time", len(got.Periods), writers)
	}
}
