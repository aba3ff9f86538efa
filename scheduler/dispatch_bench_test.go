package scheduler

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/testenv"
)

// roundTrips counts the client's round trips to Redis (a pipeline is one).
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { r.n.Add(1); return next(ctx, cmd) }
}
func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { r.n.Add(1); return next(ctx, cmds) }
}

// scriptUsec is the Redis server's CPU time spent in EVALSHA so far (INFO
// commandstats): exact for this benchmark only on a Redis nothing else uses.
func scriptUsec(ctx context.Context, b *testing.B, rdb *redis.Client) float64 {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:"); ok {
			for _, kv := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(kv, "usec="); ok {
					n, _ := strconv.ParseFloat(v, 64)
					return n
				}
			}
		}
	}
	return 0
}

// BenchmarkTake is one dispatch as `agentq bench fairness` measures it (worker slot, fair
// pick, confirm) with 10 and 10,000 backlogged tenants; the completion is not timed.
// Run it with -benchtime=3000x, the fairness benchmark's sample count. It reports the
// round trips of a dispatch and the Redis CPU its scripts took (script-µs/op, which
// includes the untimed completion's script, and holds only on a Redis of its own).
func BenchmarkTake(b *testing.B) {
	for _, tenants := range []int{10, 10000} {
		b.Run(fmt.Sprintf("tenants=%d", tenants), func(b *testing.B) {
			ctx := context.Background()
			rdb, keys := testenv.Redis(b, 1)
			s := New(rdb, keys, Options{})
			if err := s.Heartbeat(ctx, "bench", 1<<30, time.Hour); err != nil {
				b.Fatal(err)
			}
			if err := enqueueScript.Load(ctx, rdb).Err(); err != nil { // a pipeline cannot fall back to EVAL
				b.Fatal(err)
			}
			perTenant := max(3, (b.N+30000)/tenants)
			now := time.Now()
			pipe := rdb.Pipeline()
			for t := range tenants {
				for i := range perTenant {
					EnqueueInPipeline(ctx, pipe, keys, EnqueueParams{TenantID: fmt.Sprint("t", t),
						TaskID: uuid.Must(uuid.NewV7()), Priority: 5, CreatedAt: now.Add(time.Duration(i) * time.Millisecond), Weight: 1 + t%4})
				}
				if pipe.Len() >= 5000 {
					if _, err := pipe.Exec(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
			trips := &roundTrips{}
			rdb.AddHook(trips)
			var takeTrips int64
			usec0 := scriptUsec(ctx, b, rdb)
			b.ResetTimer()
			for range b.N {
				before := trips.n.Load()
				d, err := s.Take(ctx)
				takeTrips += trips.n.Load() - before
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := s.Done(ctx, d, 20*time.Millisecond); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.StopTimer()
			b.ReportMetric(float64(takeTrips)/float64(b.N), "roundtrips/op")
			b.ReportMetric((scriptUsec(ctx, b, rdb)-usec0)/float64(b.N), "script-µs/op")
		})
	}
}
