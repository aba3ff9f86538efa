package capacity

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
)

// A bucket lets its burst through at once, then one token per 1/Rate; looking takes
// nothing; the key lives only until the bucket is full again.
func TestBucketTakesBurstThenRate(t *testing.T) {
	t.Parallel()
	rdb, keys := testenv.Redis(t, 1)
	var now atomic.Int64
	now.Store(1_700_000_000_000)
	q := NewBuckets(rdb, keys, now.Load)
	ctx := context.Background()
	key := keys.AuthFailures("192.0.2.7")
	b := quotas.Bucket{Rate: 0.5, Burst: 3} // a token every 2 s

	take := func(want bool) quotas.BucketAnswer {
		t.Helper()
		a, err := q.Bucket(ctx, key, b, true)
		if err != nil {
			t.Fatal(err)
		}
		if a.Allowed != want {
			t.Fatalf("take at %d: %+v, want allowed %v", now.Load(), a, want)
		}
		return a
	}
	peek := func() quotas.BucketAnswer {
		t.Helper()
		a, err := q.Bucket(ctx, key, b, false)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	for range 10 {
		if !peek().Allowed {
			t.Fatal("looking at a full bucket says it is empty")
		}
	}
	for range 3 {
		take(true)
	}
	if a := take(false); a.RetryAfter != 2*time.Second {
		t.Fatalf("retry after %v, want 2s", a.RetryAfter)
	}
	if a := peek(); a.Allowed || a.RetryAfter != 2*time.Second {
		t.Fatalf("looking at an empty bucket: %+v", a)
	}
	if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 0 || ttl > 6*time.Second {
		t.Fatalf("bucket key TTL %v, want until it is full (6 s)", ttl)
	}
	now.Add(1999)
	take(false)
	now.Add(1)
	take(true)
	take(false)
	now.Add(6000) // full again
	for range 3 {
		take(true)
	}
	take(false)
}

// Callers at the same moment cannot all take the last tokens: exactly the burst passes.
func TestBucketConcurrentTakersGetOnlyTheBurst(t *testing.T) {
	t.Parallel()
	rdb, keys := testenv.Redis(t, 1)
	bs := NewBuckets(rdb, keys, func() int64 { return 1_700_000_000_000 })
	b := quotas.Bucket{Rate: 1, Burst: 5}
	var wg sync.WaitGroup
	var allowed atomic.Int64
	start := make(chan struct{})
	for range 60 {
		wg.Go(func() {
			<-start
			a, err := bs.Bucket(context.Background(), keys.AuthFailures("198.51.100.1"), b, true)
			if err != nil || a.Degraded {
				t.Errorf("take: %+v %v", a, err)
			}
			if a.Allowed {
				allowed.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if n := allowed.Load(); n != 5 {
		t.Fatalf("%d of 60 concurrent takers got a token, want the burst, 5", n)
	}
}

// Without Redis the bucket is this process's own, with the same burst.
