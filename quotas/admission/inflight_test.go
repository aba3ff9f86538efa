package admission

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
)

func TestInflightLeases(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	for i := range 3 {
		held, ok, err := f.q.AcquireInflight(ctx, "acme", string(rune('a'+i)), 3)
		if err != nil || !ok || held != int64(i+1) {
			t.Fatalf("acquire %d: %d %v %v", i, held, ok, err)
		}
	}
	if held, ok, err := f.q.AcquireInflight(ctx, "acme", "d", 3); err != nil || ok || held != 3 {
		t.Fatalf("4th acquire with limit 3: %d %v %v, want refused with 3 held", held, ok, err)
	}
	if err := f.q.ReleaseInflight(ctx, "acme", "a"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := f.q.AcquireInflight(ctx, "acme", "d", 3); !ok {
		t.Fatal("no slot after a release")
	}
	// leases of requests that never ended expire; refreshed ones stay
	f.advance(quotas.InflightLeaseTTL / 2)
	if err := f.q.TouchInflight(ctx, "acme", "b"); err != nil {
		t.Fatal(err)
	}
	f.advance(quotas.InflightLeaseTTL/2 + time.Millisecond)
	if held, ok, err := f.q.AcquireInflight(ctx, "acme", "e", 3); err != nil || !ok || held != 2 {
		t.Fatalf("acquire after c and d expired: %d %v %v, want 2 held (b, e)", held, ok, err)
	}
	if ttl := f.rdb.PTTL(ctx, f.keys.InflightRequests("acme")).Val(); ttl <= 0 || ttl > quotas.InflightLeaseTTL {
		t.Fatalf("lease set TTL %v", ttl)
	}
	// another tenant is counted apart
	if held, ok, _ := f.q.AcquireInflight(ctx, "other", "a", 3); !ok || held != 1 {
		t.Fatalf("another tenant: %d %v", held, ok)
	}
}

// A request's lease given back in another call's round trip is gone once that call
// returned; a release that was not answered, or never sent, is queued for a retry.
func TestReleaseInflightAlong(t *testing.T) {
	t.Parallel()
	rdb, keys := testenv.Redis(t, 1)
	g := NewGuard(New(rdb, keys, nil), GuardOptions{Timeout: time.Second})
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		send      func(along func(redis.Pipeliner)) // the call the release rides with
		held      int64                             // leases held after it
		retryable int                               // releases queued for a retry
	}{
		{"sent with a call", func(along func(redis.Pipeliner)) {
			pipe := rdb.Pipeline()
			pipe.Ping(ctx)
			along(pipe)
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}, 0, 0},
		{"call failed", func(along func(redis.Pipeliner)) {
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			pipe := rdb.Pipeline()
			along(pipe)
			_, _ = pipe.Exec(cctx)
		}, 1, 1},
		{"never sent", func(func(redis.Pipeliner)) {}, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tenant := "along-" + strings.ReplaceAll(tc.name, " ", "-")
			s, err := g.AcquireInflight(ctx, tenant, 3)
			if err != nil || !s.Leased {
				t.Fatal(s, err)
			}
			g.mu.Lock()
			before := len(g.later)
			g.mu.Unlock()
			along, done := g.ReleaseInflightAlong(ctx, s)
			tc.send(along)
			done()
			if n := rdb.ZCard(ctx, keys.InflightRequests(tenant)).Val(); n != tc.held {
				t.Fatalf("%d leases held, want %d", n, tc.held)
			}
			g.mu.Lock()
			queued := len(g.later) - before
			g.mu.Unlock()
			if queued != tc.retryable {
				t.Fatalf("%d releases queued for a retry, want %d", queued, tc.retryable)
			}
		})
	}
	if along, done := g.ReleaseInflightAlong(ctx, quotas.InflightSlot{Allowed: true}); along != nil {
		t.Fatal("a slot with no lease rides along")
	} else {
		done()
	}
}

// BenchmarkInflightLease is the Redis cost of one request's lease (take, give back)
// next to one round trip (PING) and the key-bucket spend every read already makes.
func BenchmarkInflightLease(b *testing.B) {
	rdb, keys := testenv.Redis(b, 1)
	g := NewGuard(New(rdb, keys, nil), GuardOptions{Timeout: time.Second})
	ctx := context.Background()
	b.Run("ping", func(b *testing.B) {
		for b.Loop() {
			if err := rdb.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("key-bucket", func(b *testing.B) {
		p := quotas.AdmitParams{Mode: quotas.ModeKey, TenantID: "acme", Kid: "k", Limits: quotas.Limits{KeyRate: 1e9, KeyBurst: 1e9},
			Period: quotas.PeriodAt(time.Now(), time.Now())}
		for b.Loop() {
			if _, err := g.Admit(ctx, p); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("acquire+release", func(b *testing.B) {
		for b.Loop() {
			s, err := g.AcquireInflight(ctx, "acme", 32)
			if err != nil || !s.Allowed || s.Degraded {
				b.Fatal(s, err)
			}
			g.ReleaseInflight(ctx, s)
		}
	})
}
