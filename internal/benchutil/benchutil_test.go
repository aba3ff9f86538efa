package benchutil_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/agentq/agentq/internal/benchutil"
	"github.com/agentq/agentq/internal/testenv"
)

// Interleaved ops each get their share of the time in slices, their workers'
// sequence numbers carry on from slice to slice (so keys built from them never
// repeat), and an op that calls Redis is given Redis CPU per operation. (How an
// op's CPU compares with another's is not checked: other tests share this Redis.)
func TestRunInterleaved(t *testing.T) {
	t.Parallel()
	rdb, keys := testenv.Redis(t, 1)
	ctx := context.Background()
	key := keys.BaselineBucket("interleaved")
	var mu sync.Mutex
	seen := map[[2]int64]bool{}
	var repeats, idleCalls int
	withRedis := func(ctx context.Context, w int, seq int64) error {
		mu.Lock()
		k := [2]int64{int64(w), seq}
		if seen[k] {
			repeats++
		}
		seen[k] = true
		mu.Unlock()
		return rdb.Incr(ctx, key).Err()
	}
	idle := func(ctx context.Context, _ int, _ int64) error {
		mu.Lock()
		idleCalls++
		mu.Unlock()
		time.Sleep(time.Millisecond)
		return nil
	}
	const d = 400 * time.Millisecond
	res, err := benchutil.RunInterleaved(ctx, rdb, 4, d, 4, withRedis, idle)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 {
		t.Fatalf("%d results for 2 ops", len(res))
	}
	for i, r := range res {
		if r.Ops == 0 || r.PerSec <= 0 || r.P50 <= 0 || r.Errors != 0 {
			t.Errorf("op %d: %+v", i, r)
		}
		// Four slices of d/4 each, plus each slice's goroutine start and stop.
		if r.Elapsed < d || r.Elapsed > 2*d {
			t.Errorf("op %d ran %v in all, want about %v", i, r.Elapsed, d)
		}
	}
	if repeats > 0 {
		t.Errorf("%d (worker, sequence) pairs came twice", repeats)
	}
	// A call a slice's deadline cuts short is not counted: at most one per worker and
	// slice.
	if n, _ := rdb.Get(ctx, key).Int64(); n < res[0].Ops || n > res[0].Ops+4*4 {
		t.Errorf("the Redis op ran %d times, the result counts %d", n, res[0].Ops)
	}
	if int64(idleCalls) < res[1].Ops {
		t.Errorf("idle op: %d calls, %d counted", idleCalls, res[1].Ops)
	}
	if res[0].RedisCPUPerOp <= 0 {
		t.Errorf("Redis CPU per INCR: %v", res[0].RedisCPUPerOp)
	}
}
