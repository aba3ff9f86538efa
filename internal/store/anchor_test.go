package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentq/agentq/internal/store"
)

// waitForRollupLock waits until a transaction waits for tenant's rollup lock.
func waitForRollupLock(t *testing.T, ctx context.Context, st *store.Store, tenant string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var waiting bool
		if err := st.Pool().QueryRow(ctx, `
			SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
				AND classid = ((k >> 32) & 4294967295)::oid AND objid = (k & 4294967295)::oid)
			FROM (SELECT hashtextextended(current_schema() || '|rollups|' || $1, 0) AS k) x`, tenant).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
	}
	t.Fatal("no step came to wait for the rollup lock")
}

// A step recorded while the tenant's billing anchor changes waits for the change and
// is booked by the new anchor: its period, and the rollup rows it adds to.
func TestStepWaitingOnAnchorChangeBooksTheNewAnchor(t *testing.T) {
	t.Parallel()
	ctx, st, _ := setup(t)
	id := newTask(t, ctx, st, "acme")
	task, ok, err := st.UnscopedStartTask(ctx, id)
	if err != nil || !ok {
		t.Fatalf("start: %v %v", ok, err)
	}
	// The tenant's period starts today (its creation day); any other billing day puts
	// now in another period.
	day := time.Now().UTC().Day()%28 + 1
	type result struct {
		r   store.RecordedStep
		err error
	}
	done := make(chan result, 1)
	var moved store.Tenant
	err = st.InTx(ctx, func(tx *store.Store) error {
		var err error
		if moved, err = tx.UpdateTenant(ctx, store.UpdateTenantParams{ID: "acme", BillingDay: &day}); err != nil {
			return err
		}
		if err := tx.UnscopedRebuildRollups(ctx, store.RebuildRollupsParams{TenantID: "acme"}); err != nil {
			return err
		}
		go func() {
			r, _, err := st.UnscopedRecordStep(ctx, store.RecordStepParams{ID: id, Attempt: task.Attempt, Step: 1, Tokens: 7, CostMicro: 3})
			done <- result{r, err}
		}()
		waitForRollupLock(t, ctx, st, "acme")
		return nil // the change commits with the step waiting
	})
	if err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	want := moved.Anchor().PeriodAt(res.r.Usage.RecordedAt)
	if res.r.Usage.Period != want || res.r.Tenant.BillingDay == nil || *res.r.Tenant.BillingDay != day {
		t.Fatalf("the waiting step was booked in period %s with billing day %v; the new anchor's period is %s",
			res.r.Usage.Period.ID, res.r.Tenant.BillingDay, want.ID)
	}
	got, err := st.UnscopedTenantRollups(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Periods) != 1 || got.Periods[0].Period.ID != want.ID || got.Periods[0].Steps != 1 || got.Periods[0].Tokens != 7 {
		t.Fatalf("period rollups %+v, want one of period %s with the step", got.Periods, want.ID)
	}
}
