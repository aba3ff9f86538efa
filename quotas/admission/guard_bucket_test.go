package admission

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/quotas"
)

func TestBucketWithoutRedisIsLocal(t *testing.T) {
	t.Parallel()
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 20 * time.Millisecond})
	t.Cleanup(func() { dead.Close() })
	g := NewGuard(New(dead, rkeys.New("t:", 1), nil), GuardOptions{Timeout: 50 * time.Millisecond})
	b := quotas.Bucket{Rate: 0.1, Burst: 2}
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
