package quotas

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/testenv"
)

// A bucket lets its burst through at once, then one token per 1/Rate; looking takes
// nothing; the key lives only until the bucket is full again.
func TestBucketTakesBurstThenRate(t *testing.T) {
	t.Parallel()
	rdb, keys := testenv.Redis(t, 1)
	var now atomic.Int64
	now.Store(1_700_000_000_000)
	q := New(rdb, keys, now.Load)
	ctx := context.Background()
	key := keys.AuthFailures("192.0.2.7")
	b := Bucket{Rate: 0.5, Burst: 3} // a token every 2 s

	take := func(want bool) BucketAnswer {
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
	peek := func() BucketAnswer {
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
	g := NewGuard(New(rdb, keys, func() int64 { return 1_700_000_000_000 }), GuardOptions{Timeout: 2 * time.Second})
	b := Bucket{Rate: 1, Burst: 5}
	var wg sync.WaitGroup
	var allowed atomic.Int64
	start := make(chan struct{})
	for range 60 {
		wg.Go(func() {
			<-start
			a, err := g.TakeBucket(context.Background(), keys.AuthFailures("198.51.100.1"), b)
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
func TestBucketWithoutRedisIsLocal(t *testing.T) {
	t.Parallel()
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 20 * time.Millisecond})
	t.Cleanup(func() { dead.Close() })
	g := NewGuard(New(dead, rkeys.New("t:", 1), nil), GuardOptions{Timeout: 50 * time.Millisecond})
	b := Bucket{Rate: 0.1, Burst: 2}
	key := rkeys.New("t:", 1).AuthFailures("203.0.113.9")
	for i, want := range []bool{true, true, false} {
		a, err := g.TakeBucket(context.Background(), key, b)
		if err != nil || !a.Degraded || a.Allowed != want {
			t.Fatalf("take %d without Redis: %+v %v, want degraded, allowed %v", i, a, err, want)
		}
	}
	if a, _ := g.PeekBucket(context.Background(), key, b); a.Allowed || a.RetryAfter <= 0 {
		t.Fatalf("looking at the empty local bucket: %+v", a)
	}
}
