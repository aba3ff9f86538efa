package admission

import (
	"context"
	"testing"

	"github.com/agentq/agentq/quotas"
)

// A correction is applied only to counters that did not move since the snapshot it
// pairs with: a step reserved while the ledger was read is no drift.
func TestRecountLeavesCountersThatMovedSinceTheSnapshot(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	step := quotas.StepParams{TenantID: "acme", Period: f.period(), Limits: quotas.NoLimits(), Tokens: 10}
	if err := f.q.ReserveStep(ctx, step); err != nil {
		t.Fatal(err)
	}
	ledger := quotas.LedgerCounts{Period: f.period()} // the ledger has nothing: the step was never recorded
	snap, err := f.q.SnapshotCounters(ctx, []string{"acme", "nobody"})
	if err != nil || !snap[0].Seeded || snap[1].Seeded {
		t.Fatalf("snapshots %+v %v", snap, err)
	}
	if err := f.q.ReserveStep(ctx, step); err != nil { // moves after the snapshot
		t.Fatal(err)
	}
	res, err := f.q.CorrectCounters(ctx, []quotas.Correction{{Snapshot: snap[0], Ledger: ledger}})
	if err != nil || res[0].Outcome != quotas.RecountBusy {
		t.Fatalf("correction of counters that moved: %+v %v", res, err)
	}
	snap, _ = f.q.SnapshotCounters(ctx, []string{"acme"})
	res, err = f.q.CorrectCounters(ctx, []quotas.Correction{{Snapshot: snap[0], Ledger: ledger}})
	if err != nil || res[0].Outcome != quotas.RecountCorrected || res[0].Steps != -2 || res[0].Tokens != -20 {
		t.Fatalf("correction from a fresh snapshot: %+v %v", res, err)
	}
	peek := f.admit(quotas.Limits{}, func(p *quotas.AdmitParams) { p.Mode = quotas.ModePeek })
	if scopeOf(peek, quotas.AgentStepsDaily).Used != 0 || scopeOf(peek, quotas.AITokensMonthly).Used != 0 {
		t.Fatalf("after the correction: steps %v tokens %v", scopeOf(peek, quotas.AgentStepsDaily).Used, scopeOf(peek, quotas.AITokensMonthly).Used)
	}
}

// A held correction keeps what was reserved after its snapshot: the ledger's reader
// holds step records back, not reservations, so a task that starts while the ledger
// is read reserves a step the running count it read does not know of. The drift is
// measured on the snapshot and the moves since are added to the corrected value.
func TestHeldRecountKeepsReservationsMadeAfterTheSnapshot(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	step := quotas.StepParams{TenantID: "acme", Period: f.period(), Limits: quotas.NoLimits(), Tokens: 10}
	for range 3 { // three reservations that leaked: nothing runs, the ledger is empty
		if err := f.q.ReserveStep(ctx, step); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := f.q.SnapshotCounters(ctx, []string{"acme"})
	if err != nil || !snap[0].Seeded {
		t.Fatalf("snapshot %+v %v", snap, err)
	}
	ledger := quotas.LedgerCounts{Period: f.period()}  // read with no task running
	if err := f.q.ReserveStep(ctx, step); err != nil { // a task starts meanwhile
		t.Fatal(err)
	}
	res, err := f.q.CorrectCounters(ctx, []quotas.Correction{{Snapshot: snap[0], Ledger: ledger, Held: true}})
	if err != nil || res[0].Outcome != quotas.RecountCorrected || res[0].Steps != -3 || res[0].Tokens != -30 {
		t.Fatalf("held correction: %+v %v, want the 3 leaked steps and 30 tokens taken off", res, err)
	}
	peek := f.admit(quotas.Limits{}, func(p *quotas.AdmitParams) { p.Mode = quotas.ModePeek })
	if scopeOf(peek, quotas.AgentStepsDaily).Used != 1 || scopeOf(peek, quotas.AITokensMonthly).Used != 10 {
		t.Fatalf("after the correction: steps %v tokens %v, want the new task's 1 step and 10 tokens",
			scopeOf(peek, quotas.AgentStepsDaily).Used, scopeOf(peek, quotas.AITokensMonthly).Used)
	}
}

// A counter the snapshot did not have (a tenant with no use this period has no tokens
// field) counts as 0 there: a reservation made after the snapshot is kept.
func TestHeldRecountKeepsAReservationIntoAFieldTheSnapshotLacked(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	seed := quotas.StepParams{TenantID: "acme", Period: f.period(), Limits: quotas.NoLimits()}
	if err := f.q.ReserveStep(ctx, seed); err != nil { // seeds the counters, no tokens field
		t.Fatal(err)
	}
	snap, err := f.q.SnapshotCounters(ctx, []string{"acme"})
	if err != nil || !snap[0].Seeded {
		t.Fatalf("snapshot %+v %v", snap, err)
	}
	ledger := quotas.LedgerCounts{Period: f.period(), InFlight: quotas.InFlight{Steps: 1}} // the first step runs
	if err := f.q.ReserveStep(ctx, quotas.StepParams{TenantID: "acme", Period: f.period(), Limits: quotas.NoLimits(), Tokens: 10}); err != nil {
		t.Fatal(err) // a task that starts after the ledger was read
	}
	if _, err := f.q.CorrectCounters(ctx, []quotas.Correction{{Snapshot: snap[0], Ledger: ledger, Held: true}}); err != nil {
		t.Fatal(err)
	}
	peek := f.admit(quotas.Limits{}, func(p *quotas.AdmitParams) { p.Mode = quotas.ModePeek })
	if scopeOf(peek, quotas.AITokensMonthly).Used != 10 || scopeOf(peek, quotas.AgentStepsDaily).Used != 2 {
		t.Fatalf("after the correction: steps %v tokens %v, want the two reserved steps and the 10 tokens",
			scopeOf(peek, quotas.AgentStepsDaily).Used, scopeOf(peek, quotas.AITokensMonthly).Used)
	}
}
