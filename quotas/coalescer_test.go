package quotas

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// Stopping the Coalescer while admissions stream in leaves none waiting: those queued
// for a batch are answered, later ones go straight to Redis, and each is taken once.
func TestCoalescerStopAnswersEveryAdmission(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	l := NoLimits()
	for round := range 5 {
		co := NewCoalescer(f.q, 2*time.Second)
		if err := co.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		<-co.Started()
		var wg sync.WaitGroup
		errs := make(chan error, 200)
		for i := range 200 {
			wg.Go(func() {
				// A bound far above a call's time: an admission left queued when the
				// coalescer stopped would run into it.
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				d, err := f.q.Admit(ctx, AdmitParams{Mode: ModeAdmit, TenantID: fmt.Sprint("t", i%7), Kid: "k",
					TaskID: fmt.Sprintf("r%d-%d", round, i), InScope: true, Limits: l, Period: f.period()})
				if err == nil && !d.Allowed {
					err = fmt.Errorf("refused: %v", d.Violated)
				}
				errs <- err
			})
		}
		time.Sleep(time.Duration(round) * time.Millisecond)
		co.Stop()
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: an admission around the stop: %v", round, err)
			}
		}
	}
	if f.q.batcherFor("t1") != nil {
		t.Fatal("admissions still go to a stopped coalescer's batchers")
	}
}
