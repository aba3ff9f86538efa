package store_test

import (
	"testing"
	"time"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
)

// Two steps of a tenant recorded at once on either side of an hour boundary: the
// later one waits for the earlier one's period row, and then counts it in its sliding
// day, so each of the daily steps quota's thresholds is crossed by exactly one step.
// Under a limit of 10, seven steps in an earlier hour, then the 8th (80 %) at 10:59
// and the 9th (90 %) at 11:00, concurrently.
func TestDayStepsAcrossAnHourBoundaryCrossEachThresholdOnce(t *testing.T) {
	t.Parallel()
	ctx, st, pool := setup(t)
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	first := 1
	if _, err := st.UpdateTenant(ctx, store.UpdateTenantParams{ID: "acme", BillingDay: &first,
		Overrides: map[string]quotas.Limit{quotas.AgentStepsDaily: 10}}); err != nil {
		t.Fatal(err)
	}
	cross := outbox.Crossings{Limits: func(t store.Tenant) (quotas.Limits, error) {
		p, err := tenants.PolicyOf(plans, t)
		return p.Limits, err
	}}.Step
	// An hour boundary well inside a billing period (the rollups do not care about the
	// wall clock): all the steps update the one period row.
	boundary := time.Date(2026, 11, 20, 11, 0, 0, 0, time.UTC)
	record := func(tx *store.Store, at time.Time) (store.RecordedStep, error) {
		r, err := store.AddStepToRollupsAt(ctx, tx, "acme", at, 1, 0)
		if err != nil {
			return r, err
		}
		return r, cross(ctx, tx, r)
	}
	for range 7 {
		if err := st.InTx(ctx, func(tx *store.Store) error {
			_, err := record(tx, boundary.Add(-3*time.Hour))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	later := make(chan store.RecordedStep, 1)
	errs := make(chan error, 1)
	err = st.InTx(ctx, func(tx *store.Store) error {
		if _, err := record(tx, boundary.Add(-time.Minute)); err != nil {
			return err
		}
		pid, err := store.BackendPID(ctx, tx)
		if err != nil {
			return err
		}
		go func() {
			errs <- st.InTx(ctx, func(tx *store.Store) error {
				r, err := record(tx, boundary)
				later <- r
				return err
			})
		}()
		// Commit once the later step waits for this one's rows.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, pid).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			if time.Now().After(deadline) {
				t.Error("the later step never waited for the earlier one")
				return nil
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if r := <-later; r.Usage.DaySteps != 9 {
		t.Errorf("the 9th step counted %d steps in its sliding day, want 9", r.Usage.DaySteps)
	}
	rows, err := pool.Query(ctx, `SELECT e->'data'->>'threshold', count(*)
		FROM (SELECT convert_from(payload, 'UTF8')::jsonb AS e FROM events WHERE tenant_id = 'acme') x
		WHERE e->'data'->>'limit_type' = 'agent_steps_daily' GROUP BY 1 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for rows.Next() {
		var th string
		var n int
		if err := rows.Scan(&th, &n); err != nil {
			t.Fatal(err)
		}
		got[th] = n
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if len(got) != 2 || got["80"] != 1 || got["90"] != 1 {
		t.Fatalf("agent_steps_daily events per threshold: %v; want 80 and 90 once each", got)
	}
}
