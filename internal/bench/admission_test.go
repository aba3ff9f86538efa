package bench

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/agentq/agentq/internal/testenv"
)

// A short run of the admission benchmark: every phase runs without errors, the
// refusing phase is refused by every scope but the key's (the benchmark checks that
// itself), and the ratio is the two interleaved phases' rates.
func TestAdmissionBenchRunsEveryPhase(t *testing.T) {
	t.Parallel()
	rdb, _ := testenv.Redis(t, 1)
	b, err := RunAdmission(context.Background(), rdb, AdmissionOptions{
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
