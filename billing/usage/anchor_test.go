package usage_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
)

// After a change of anchor re-seeds a tenant's monthly counters, the re-seeded period
// holds until it ends (a step that names a newer period, from a worker with another
// view of the anchor, books into it), and then the next period starts as usual, from
// zero.
func TestReseededPeriodHoldsUntilItEnds(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	task := f.running("rs")
	f.record(task, 1, 100, 0)
	var clock atomic.Int64
	clock.Store(time.Now().UnixMilli())
	q := admission.New(f.rdb, f.keys, clock.Load)
	q.SetUsageSource(f.ledger, nil)
	anchor := quotas.Anchor{Day: time.Now().UTC().Day()%28 + 1}
	cur := anchor.PeriodAt(time.UnixMilli(clock.Load()))
	next := anchor.PeriodAt(cur.End)
	tokens := func(p quotas.Period) float64 {
		t.Helper()
		d, err := q.Admit(f.ctx, quotas.AdmitParams{Mode: quotas.ModePeek, TenantID: "rs", Kid: "k", Limits: limits(), Period: p})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range d.Scopes {
			if s.Name == quotas.AITokensMonthly {
				return s.Used
			}
		}
		t.Fatal("no ai_tokens_monthly scope")
		return 0
	}
	if wrote, err := q.ReseedAnchor(f.ctx, "rs", anchor); err != nil || wrote {
		t.Fatalf("re-seeding counters never seeded: wrote %v, %v; want nothing written", wrote, err)
	}
	if _, err := q.Seed(f.ctx, "rs", quotas.Anchor{Day: time.Now().UTC().Day()}.PeriodAt(time.Now())); err != nil {
		t.Fatal(err)
	}
	if wrote, err := q.ReseedAnchor(f.ctx, "rs", anchor); err != nil || !wrote {
		t.Fatalf("re-seed: wrote %v, %v", wrote, err)
	}
	if got := tokens(cur); got != 100 {
		t.Fatalf("tokens of the re-seeded period: %v, want the ledger's 100", got)
	}
	step := quotas.StepParams{TenantID: "rs", Period: next, Limits: limits(), Tokens: 7}
	if err := q.ReserveStep(f.ctx, step); err != nil {
		t.Fatal(err)
	}
	if got := tokens(cur); got != 107 {
		t.Fatalf("a step naming the next period before the re-seeded one ended: tokens %v, want 107 in the re-seeded period", got)
	}
	clock.Store(cur.End.Add(time.Minute).UnixMilli())
	if err := q.ReserveStep(f.ctx, step); err != nil {
		t.Fatal(err)
	}
	if got := tokens(next); got != 7 {
		t.Fatalf("the first step after the re-seeded period ended: tokens %v, want 7 in the next period", got)
	}
	if pe := f.rdb.HExists(f.ctx, f.keys.AdmissionState("rs"), "pe").Val(); pe {
		t.Fatal("the mark of the re-seeded period outlived it")
	}
}
