package store_test

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/agentq/agentq/internal/store"
)

// One statement answers the usage report's refusal counts: the recent minutes one
// by one, and each older window's sums up to them, of one tenant only.
func TestRejectionCounts(t *testing.T) {
	t.Parallel()
	ctx, st, _ := setup(t)
	if _, err := st.CreateTenant(ctx, store.CreateTenantParams{ID: "other", Name: "Other", Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	at := func(h, m int) time.Time { return time.Date(2026, 12, 2, h, m, 0, 0, time.UTC) }
	rows := []store.RejectionRow{
		{TenantID: "acme", LimitType: "tenant_rate", Minute: at(0, 5), Count: 1},        // before the day's window
		{TenantID: "acme", LimitType: "tenant_rate", Minute: at(9, 0), Count: 2},        // in both windows
		{TenantID: "acme", LimitType: "agent_steps_daily", Minute: at(9, 30), Count: 4}, // in both windows
		{TenantID: "acme", LimitType: "tenant_rate", Minute: at(12, 0), Count: 8},       // recent
		{TenantID: "acme", LimitType: "key_rate", Minute: at(12, 1), Count: 16},         // recent
		{TenantID: "acme", LimitType: "key_rate", Minute: at(12, 3), Count: 32},         // after Until
		{TenantID: "other", LimitType: "tenant_rate", Minute: at(9, 0), Count: 64},
		{TenantID: "other", LimitType: "tenant_rate", Minute: at(12, 0), Count: 128},
	}
	if _, err := st.UnscopedAddRejections(ctx, rows); err != nil {
		t.Fatal(err)
	}
	got, err := st.RejectionCounts(ctx, store.RejectionCountsParams{TenantID: "acme", Since: at(12, 0), Until: at(12, 2),
		TotalsFrom: []time.Time{at(1, 0), at(0, 0), at(11, 0)}})
	if err != nil {
		t.Fatal(err)
	}
	var minutes []int64
	for _, r := range got.Minutes {
		if r.TenantID != "acme" {
			t.Errorf("row of %s", r.TenantID)
		}
		minutes = append(minutes, r.Count)
	}
	if !slices.Equal(minutes, []int64{8, 16}) {
		t.Errorf("minutes: %+v, want the counts 8 then 16", got.Minutes)
	}
	want := []map[string]int64{
		{"tenant_rate": 2, "agent_steps_daily": 4},
		{"tenant_rate": 3, "agent_steps_daily": 4},
		{},
	}
	if len(got.Totals) != len(want) {
		t.Fatalf("totals: %v, want %v", got.Totals, want)
	}
	for i := range want {
		if !maps.Equal(got.Totals[i], want[i]) {
			t.Errorf("totals from window %d: %v, want %v", i, got.Totals[i], want[i])
		}
	}
	none, err := st.RejectionCounts(ctx, store.RejectionCountsParams{TenantID: "acme", Since: at(12, 0), Until: at(12, 2)})
	if err != nil || len(none.Totals) != 0 || len(none.Minutes) != 2 {
		t.Errorf("no windows: %+v %v", none, err)
	}
}
