package admission

import (
	"context"
	"testing"

	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/quotas"
)

// The counters carry a mark from the moment they are seeded; without it no script
// decides on them or writes them. (Rebuilding from a real ledger: billing/usage's tests.)
func TestCountersWithoutTheirMarkAreSeededFirst(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	h := f.keys.AdmissionState("acme")
	marked := func() bool {
		t.Helper()
		ok, err := f.rdb.HExists(ctx, h, "sd").Result()
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}

	// a tenant without period quotas is decided at once: no counter is read
	if d := f.admit(quotas.Limits{TenantRate: 100, TenantBurst: 100}); !d.Allowed || marked() {
		t.Fatalf("admission without period quotas: %+v, marked %v", d, marked())
	}
	// nor does a key-only call (a read) seed anything
	if d := f.admit(quotas.Limits{KeyRate: 100, KeyBurst: 100}, func(p *quotas.AdmitParams) { p.Mode = quotas.ModeKey }); !d.Allowed || marked() {
		t.Fatalf("key-only call: %+v, marked %v", d, marked())
	}
	// a settlement on unmarked counters writes nothing: its step is in the ledger
	if err := f.q.SettleStep(ctx, nil, quotas.StepParams{TenantID: "acme", Period: f.period(), Tokens: 7, CostMicro: 9, Steps: -1}); err != nil {
		t.Fatal(err)
	}
	if v, _ := f.rdb.HGet(ctx, h, rkeys.TokensField(f.period().ID)).Result(); v != "" {
		t.Fatalf("a settlement on unseeded counters wrote tokens %q", v)
	}
	if n, _ := f.rdb.Exists(ctx, f.keys.StepsDaily("acme")).Result(); n != 0 {
		t.Fatal("a settlement on unseeded counters wrote the steps hash")
	}

	// an admission with a period quota seeds (zero without a ledger), then decides
	d := f.admit(quotas.Limits{StepsDaily: 5})
	if !d.Allowed || !marked() || scopeOf(d, quotas.AgentStepsDaily).Used != 0 {
		t.Fatalf("first quota admission: %+v, marked %v", d, marked())
	}
	if ttl, _ := f.rdb.PTTL(ctx, h).Result(); ttl <= 0 {
		t.Fatalf("the seeded state hash has no TTL (%v)", ttl)
	}
	// from now on settlements count, and a second seed changes nothing
	if err := f.q.ReserveStep(ctx, quotas.StepParams{TenantID: "acme", Period: f.period(), Limits: quotas.NoLimits(), Tokens: 10}); err != nil {
		t.Fatal(err)
	}
	if err := f.q.SettleStep(ctx, nil, quotas.StepParams{TenantID: "acme", Period: f.period(), Tokens: 5}); err != nil {
		t.Fatal(err)
	}
	if wrote, err := f.q.Seed(ctx, "acme", f.period()); err != nil || wrote {
		t.Fatalf("seeding marked counters: wrote %v, %v", wrote, err)
	}
	peek := f.admit(quotas.Limits{}, func(p *quotas.AdmitParams) { p.Mode = quotas.ModePeek })
	if scopeOf(peek, quotas.AgentStepsDaily).Used != 1 || scopeOf(peek, quotas.AITokensMonthly).Used != 15 {
		t.Fatalf("after a reserve and a settle: steps %v tokens %v, want 1 and 15",
			scopeOf(peek, quotas.AgentStepsDaily).Used, scopeOf(peek, quotas.AITokensMonthly).Used)
	}

	// Redis loses the counters: a reservation seeds before it reserves, and the
	// counters start from the ledger (zero here), not from what was lost
	f.rdb.Del(ctx, h, f.keys.StepsDaily("acme"))
	if err := f.q.ReserveStep(ctx, quotas.StepParams{TenantID: "acme", Period: f.period(), Limits: quotas.NoLimits(), Tokens: 3}); err != nil {
		t.Fatal(err)
	}
	peek = f.admit(quotas.Limits{}, func(p *quotas.AdmitParams) { p.Mode = quotas.ModePeek })
	if !marked() || scopeOf(peek, quotas.AgentStepsDaily).Used != 1 || scopeOf(peek, quotas.AITokensMonthly).Used != 3 {
		t.Fatalf("after the loss: marked %v, steps %v tokens %v, want 1 and 3", marked(),
			scopeOf(peek, quotas.AgentStepsDaily).Used, scopeOf(peek, quotas.AITokensMonthly).Used)
	}
}

// A seed replaces counters left without the mark (by an earlier version, or a partial
// loss) instead of adding to them.
func TestSeedReplacesUnmarkedCounters(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	per := f.period()
	h := f.keys.AdmissionState("acme")
	f.rdb.HSet(ctx, h, rkeys.TokensField(per.ID), 500, rkeys.TokensField("20200101"), 9, "per", per.ID, "t", 1)
	f.rdb.HSet(ctx, f.keys.StepsDaily("acme"), f.clock()/3600000, 40)
	if wrote, err := f.q.Seed(ctx, "acme", per); err != nil || !wrote {
		t.Fatalf("seed: %v %v", wrote, err)
	}
	all, _ := f.rdb.HGetAll(ctx, h).Result()
	if all[rkeys.TokensField(per.ID)] != "" || all[rkeys.TokensField("20200101")] != "" || all["t"] != "1" || all["sd"] == "" {
		t.Fatalf("state after the seed: %v", all)
	}
	if n, _ := f.rdb.Exists(ctx, f.keys.StepsDaily("acme")).Result(); n != 0 {
		t.Fatal("the seed kept the unmarked steps")
	}
}
