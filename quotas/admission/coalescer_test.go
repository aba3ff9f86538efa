package admission

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentq/agentq/quotas"
)

// Coalesced admissions streaming in across a few tenants of one shard are each
// answered and each take their lease once; one whose caller already gave up takes
// nothing and answers its caller's error.
func TestCoalescedAdmissionsAnswerEveryCaller(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	f.q = New(f.rdb, f.keys, f.clock, Options{Coalesce: true, CoalesceTimeout: 2 * time.Second})
	l := quotas.NoLimits()
	l.Sessions = 1000 // on, so that each admission takes a lease
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			d, err := f.q.Admit(ctx, quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: fmt.Sprint("t", i%7), Kid: "k",
				TaskID: fmt.Sprintf("r%d", i), InScope: true, Limits: l, Period: f.period()})
			if err == nil && !d.Allowed {
				err = fmt.Errorf("refused: %v", d.Violated)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a coalesced admission: %v", err)
		}
	}
	var leases int
	for i := range 7 {
		sess, long, err := f.q.Leases(context.Background(), fmt.Sprint("t", i))
		if err != nil {
			t.Fatal(err)
		}
		leases += len(sess) + len(long)
	}
	if leases != 200 {
		t.Fatalf("%d leases after 200 admissions", leases)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := f.q.Admit(ctx, quotas.AdmitParams{Mode: quotas.ModeAdmit, TenantID: "t0", Kid: "k", TaskID: "late", InScope: true, Limits: l, Period: f.period()})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("an admission whose caller gave up: %v, want context.Canceled", err)
	}
}
