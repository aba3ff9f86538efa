package admission

import (
	"fmt"
	"testing"
	"time"

	"github.com/agentq/agentq/quotas"
)

// The in-process refusal counts hold at most MaxLocalRejections entries however many
// tenants are refused: past the bound new entries are dropped, counted ones still
// count, and a forget of flushed minutes makes room again.
func TestLocalRejectionCountsAreBounded(t *testing.T) {
	t.Parallel()
	var c localCounts
	now := time.Date(2026, 12, 1, 10, 30, 5, 0, time.UTC)
	for i := range quotas.MaxLocalRejections + 500 {
		first := c.add(fmt.Sprintf("t%d", i), []string{quotas.TenantRate}, now)
		if first != (i == quotas.MaxLocalRejections) {
			t.Fatalf("refusal %d: first drop %v", i, first)
		}
	}
	c.add("t0", []string{quotas.TenantRate}, now)
	snap := c.snapshot("r1")
	if len(snap.Counts) != quotas.MaxLocalRejections || c.dropped != 500 {
		t.Fatalf("%d entries, %d dropped; want %d and 500", len(snap.Counts), c.dropped, quotas.MaxLocalRejections)
	}
	if c := snap.Counts[0]; c.TenantID != "t0" || c.Count != 2 || !c.Minute.Equal(now.Truncate(time.Minute)) {
		t.Fatalf("first entry %+v, want t0 counted twice in its minute", c)
	}
	// A count that moved since it was read stays; a minute not yet over stays.
	c.add("t1", []string{quotas.TenantRate}, now)
	if n := c.forget(snap, now.Truncate(time.Minute)); n != 0 {
		t.Fatalf("forgot %d entries of a minute not over", n)
	}
	if n := c.forget(snap, now.Add(time.Minute)); n != quotas.MaxLocalRejections-1 {
		t.Fatalf("forgot %d entries, want all but the one counted again", n)
	}
	if c.add("new", []string{quotas.TenantRate, quotas.KeyRate}, now) || len(c.snapshot("r1").Counts) != 3 {
		t.Fatalf("after the forget: %+v", c.snapshot("r1"))
	}
}
