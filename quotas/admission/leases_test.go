package admission

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/quotas"
)

// LeaseMembers reads a page of tenants' lease sets in the page's order; a tenant
// without leases has empty lists.
func TestLeaseMembersReadsAPageOfTenants(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	if err := f.q.AddLease(ctx, "a", "ta", false); err != nil {
		t.Fatal(err)
	}
	if err := f.q.AddLease(ctx, "b", "tb", true); err != nil {
		t.Fatal(err)
	}
	sess, long, err := f.q.LeaseMembers(ctx, []string{"a", "none", "b"})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(sess) != "[[ta] [] [tb]]" || fmt.Sprint(long) != "[[] [] [tb]]" {
		t.Fatalf("sessions %v, long-running %v; want [[ta] [] [tb]] and [[] [] [tb]]", sess, long)
	}
	if sess, long, err := f.q.LeaseMembers(ctx, nil); err != nil || len(sess)+len(long) != 0 {
		t.Fatalf("an empty page: %v %v %v", sess, long, err)
	}
}

// DropKey removes a key's own buckets, found by the rkeys field formats, and no other
// key's, even one whose kid starts with the same characters.
func TestDropKeyRemovesOnlyThatKeysBuckets(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	l := quotas.NoLimits()
	l.KeyRate, l.KeyBurst, l.KeyAgentRate, l.KeyAgentBurst = 10, 10, 10, 10
	for i, kid := range []string{"k1", "k10"} {
		p := quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: "acme", Kid: kid, Agent: "writer", TaskID: fmt.Sprint("t", i), InScope: true,
			Limits: l, Period: f.period()}
		if d, err := f.q.Admit(ctx, p); err != nil || !d.Allowed {
			t.Fatalf("admit %s: %+v %v", kid, d, err)
		}
	}
	if err := f.q.DropKey(ctx, "acme", "k1"); err != nil {
		t.Fatal(err)
	}
	fields := f.rdb.HKeys(ctx, f.keys.AdmissionState("acme")).Val()
	for _, gone := range []string{rkeys.KeyBucketField("k1"), rkeys.KeyAgentField("k1", "writer")} {
		if slices.Contains(fields, gone) {
			t.Errorf("%q is still there: %v", gone, fields)
		}
	}
	for _, kept := range []string{rkeys.KeyBucketField("k10"), rkeys.KeyAgentField("k10", "writer")} {
		if !slices.Contains(fields, kept) {
			t.Errorf("%q went too: %v", kept, fields)
		}
	}
}
