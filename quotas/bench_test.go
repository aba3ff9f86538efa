package quotas

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/agentq/agentq/internal/testenv"
)

// BenchmarkAdmit measures one full admission (every scope on, all passing) per
// operation, alone and coalesced; `agentq bench admission` is the comparative run.
func BenchmarkAdmit(b *testing.B) {
	rdb, keys := testenv.Redis(b, 1)
	lim := Limits{
		KeyRate: 1e6, KeyBurst: 1e6, TenantRate: 1e6, TenantBurst: 1e6, KeyAgentRate: 1e6, KeyAgentBurst: 1e6,
		UserHourly: 1e9, UserBurst: 1e9, Sessions: 1e9, LongRunning: 1e9, Backlog: 1e9,
		StepsDaily: 1e9, TokensMonthly: 1e12, USDMonthlyMicro: 1e12,
	}
	period := PeriodAt(time.Now(), time.Now())
	for _, coalesced := range []bool{false, true} {
		b.Run(fmt.Sprintf("coalesced=%v", coalesced), func(b *testing.B) {
			q := New(rdb, keys, nil)
			if coalesced {
				co := NewCoalescer(q, time.Second)
				if err := co.Start(context.Background()); err != nil {
					b.Fatal(err)
				}
				defer co.Stop()
			}
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					i++
					_, err := q.Admit(context.Background(), AdmitParams{Mode: ModeAdmit, TenantID: fmt.Sprint("t", i%50), Kid: "k",
						Agent: "sim", User: fmt.Sprint("u", i%20), TaskID: fmt.Sprint(i), InScope: true, LongRunning: true, Limits: lim, Period: period})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// A short run of the admission benchmark: every phase runs without errors, the
// refusing phase is refused by every scope but the key's (the benchmark checks that
// itself), and the ratio is the two interleaved phases' rates.
func TestAdmissionBench(t *testing.T) {
	t.Parallel()
	rdb, _ := testenv.Redis(t, 1)
	b, err := RunAdmissionBench(context.Background(), rdb, AdmissionBenchOptions{
		Concurrency: 4, Duration: 2 * time.Second, Tenants: 5,
	})
	if err != nil {
		t.Fatal(err)
	}
	if b.Errors != 0 {
		t.Errorf("%d errors", b.Errors)
	}
	for name, v := range map[string]float64{
		"admissions": b.AdmissionsPerS, "single bucket": b.SingleBucketPerS, "raw": b.RawEvalshaPerS,
		"uncoalesced": b.UncoalescedPerS, "refusing": b.RefusingPerS,
		"Redis CPU per admission": b.RedisCPUPerAdmissionUs, "Redis CPU per bucket": b.RedisCPUPerSingleBucketUs,
		"bytes per tenant": b.RedisBytesPerTenant,
	} {
		if v <= 0 {
			t.Errorf("%s: %v", name, v)
		}
	}
	if want := b.AdmissionsPerS / b.SingleBucketPerS; math.Abs(b.Ratio-want) > 0.002 {
		t.Errorf("ratio %v, want %v", b.Ratio, want)
	}
}
