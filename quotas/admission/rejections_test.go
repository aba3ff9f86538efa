package admission

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/quotas"
)

// Refused admissions are counted in Redis per minute and combination of limits, by the
// admission script; admitted ones, peeks and out-of-scope requests are not.
func TestRefusalsAreCountedPerMinuteAndLimits(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	minute := f.clock() / 60000
	steps := only(quotas.Limits{})
	steps.StepsDaily = 0 // a limit of 0 refuses every admission
	both := steps
	both.Sessions = 0

	if d := f.admit(quotas.Limits{Sessions: 5}); !d.Allowed { // admitted: not counted
		t.Fatalf("admission refused: %+v", d)
	}
	for range 3 {
		if d := f.admitExact(steps); d.Allowed {
			t.Fatal("a steps limit of 0 admitted")
		}
	}
	f.admitExact(both)
	f.admitExact(steps, func(p *quotas.AdmitParams) { p.Mode = quotas.ModePeek })
	f.admitExact(steps, func(p *quotas.AdmitParams) { p.InScope = false })
	f.advance(time.Minute)
	f.admitExact(steps)

	trs, err := f.q.Rejections(ctx, []string{"acme", "globex"})
	if err != nil {
		t.Fatal(err)
	}
	stepsBit, sessBit := quotas.ScopeBit(quotas.AgentStepsDaily), quotas.ScopeBit(quotas.ConcurrentSessions)
	want := map[string]int64{
		rkeys.RejectionField(stepsBit, minute, ""):         3,
		rkeys.RejectionField(stepsBit|sessBit, minute, ""): 1,
		rkeys.RejectionField(stepsBit, minute+1, ""):       1,
	}
	if !maps.Equal(trs[0].Fields, want) {
		t.Fatalf("acme's counts %v, want %v", trs[0].Fields, want)
	}
	if len(trs[1].Fields) != 0 {
		t.Fatalf("globex has counts %v", trs[1].Fields)
	}
	at := time.UnixMilli(minute * 60000).UTC()
	wantCounts := []quotas.RejectionCount{
		{LimitType: quotas.AgentStepsDaily, Minute: at, Count: 4},
		{LimitType: quotas.ConcurrentSessions, Minute: at, Count: 1},
		{LimitType: quotas.AgentStepsDaily, Minute: at.Add(time.Minute), Count: 1},
	}
	got := trs[0].Counts()
	if len(got) != len(wantCounts) {
		t.Fatalf("counts %+v, want %+v", got, wantCounts)
	}
	for i := range got {
		if got[i] != wantCounts[i] {
			t.Fatalf("counts %+v, want %+v", got, wantCounts)
		}
	}
	ids, err := f.q.RejectingTenants(ctx, 0)
	if err != nil || len(ids) != 1 || ids[0] != "acme" {
		t.Fatalf("rejecting tenants %v %v, want [acme]", ids, err)
	}
	if ttl := f.rdb.PTTL(ctx, f.keys.Rejections("acme")).Val(); ttl <= 0 || ttl > quotas.RejectionsTTL {
		t.Fatalf("counts TTL %v, want within %v", ttl, quotas.RejectionsTTL)
	}
}

// The key bucket refuses before anything else is checked: the refusal counts for it.
func TestKeyBucketRefusalIsCounted(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	l := quotas.Limits{KeyRate: 1, KeyBurst: 1}
	f.admit(l)
	if d := f.admit(l); d.Allowed {
		t.Fatal("the key bucket's second request admitted")
	}
	trs, err := f.q.Rejections(context.Background(), []string{"acme"})
	if err != nil {
		t.Fatal(err)
	}
	if c := trs[0].Counts(); len(c) != 1 || c[0].LimitType != quotas.KeyRate || c[0].Count != 1 {
		t.Fatalf("counts %+v, want one key_rate refusal", c)
	}
}

// Prune deletes only counts that still hold what was flushed, and forgets the tenant
// once none are left.
func TestPruneRejectionsKeepsCountsThatMoved(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	l := only(quotas.Limits{})
	l.Backlog = 0
	f.admitExact(l)
	f.admitExact(l)
	trs, _ := f.q.Rejections(ctx, []string{"acme"})
	flushed := trs[0].Fields
	f.admitExact(l) // counted after the read
	if n, err := f.q.PruneRejections(ctx, "acme", flushed); err != nil || n != 0 {
		t.Fatalf("pruned %d %v, want 0: the count moved", n, err)
	}
	if ids, _ := f.q.RejectingTenants(ctx, 0); len(ids) != 1 {
		t.Fatalf("rejecting tenants %v, want acme still", ids)
	}
	trs, _ = f.q.Rejections(ctx, []string{"acme"})
	if n, err := f.q.PruneRejections(ctx, "acme", trs[0].Fields); err != nil || n != 1 {
		t.Fatalf("pruned %d %v, want 1", n, err)
	}
	if ids, _ := f.q.RejectingTenants(ctx, 0); len(ids) != 0 {
		t.Fatalf("rejecting tenants %v after the last count went", ids)
	}
	if f.rdb.Exists(ctx, f.keys.Rejections("acme")).Val() != 0 {
		t.Fatal("the counts hash is still there")
	}
}

// A monthly quota's refusal is counted under the billing period the admission was
// decided in, whatever period the script's clock is in; other limits name none.
func TestMonthlyQuotaRefusalNamesItsPeriod(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	decided := quotas.Period{ID: "20261115", Start: time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC), End: time.Date(2026, 12, 15, 0, 0, 0, 0, time.UTC)}
	l := only(quotas.Limits{})
	l.TokensMonthly = 5
	l.Backlog = 0
	if err := f.q.ReserveStep(ctx, quotas.StepParams{TenantID: "acme", Period: decided, Limits: l, Tokens: 5}); err != nil {
		t.Fatal(err)
	}
	d, err := f.q.Admit(ctx, quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: "acme", Kid: "k", TaskID: "x", InScope: true, Limits: l, Period: decided})
	if err != nil || d.Allowed {
		t.Fatalf("admission %+v %v, want refused", d, err)
	}
	trs, err := f.q.Rejections(ctx, []string{"acme"})
	if err != nil {
		t.Fatal(err)
	}
	minute := f.clock() / 60000
	want := map[string]int64{rkeys.RejectionField(quotas.ScopeBit(quotas.AITokensMonthly)|quotas.ScopeBit(quotas.QueueBacklog), minute, decided.ID): 1}
	if !maps.Equal(trs[0].Fields, want) {
		t.Fatalf("counts %v, want %v", trs[0].Fields, want)
	}
	for _, c := range trs[0].Counts() {
		if want := map[string]string{quotas.AITokensMonthly: decided.ID, quotas.QueueBacklog: ""}[c.LimitType]; c.Period != want {
			t.Fatalf("%s counted under period %q, want %q", c.LimitType, c.Period, want)
		}
	}
}
