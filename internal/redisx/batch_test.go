package redisx_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/testenv"
)

// newBatch is a test's own Redis prefix and a Batch on it, closed when the test ends.
func newBatch(t *testing.T) (*redis.Client, string, *redisx.Batch) {
	rdb, keys := testenv.Redis(t, 1)
	b := redisx.NewBatch(rdb, 0)
	t.Cleanup(b.Close)
	return rdb, keys.Prefix(), b
}

var incrBy = redisx.NewScript(`return redis.call('INCRBY', KEYS[1], ARGV[1])`)

// countingHook counts the round trips (single commands and pipelines) a client makes,
// and holds each pipeline for delay: calls arriving meanwhile must share the next.
type countingHook struct {
	mu    sync.Mutex
	trips int
	delay time.Duration
}

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.trips++
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		h.trips++
		h.mu.Unlock()
		time.Sleep(h.delay)
		return next(ctx, cmds)
	}
}

func TestBatchConcurrentCallsShareRoundTripsAndKeepTheirResults(t *testing.T) {
	t.Parallel()
	rdb, prefix, b := newBatch(t)
	hook := &countingHook{delay: 5 * time.Millisecond}
	rdb.AddHook(hook)
	ctx := context.Background()
	key := prefix + "batch:n"
	const calls = 200
	results := make([]int64, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			var got *redis.Cmd
			var set *redis.StatusCmd
			err := b.Do(ctx, func(pipe redis.Pipeliner) {
				got = incrBy.Run(ctx, pipe, []string{key}, 1)
				set = pipe.Set(ctx, fmt.Sprintf("%sbatch:k%d", prefix, i), i, 0)
			})
			if err != nil || set.Err() != nil {
				t.Errorf("call %d: %v / %v", i, err, set.Err())
				return
			}
			results[i], _ = got.Int64()
		})
	}
	wg.Wait()
	hook.mu.Lock()
	trips := hook.trips
	hook.mu.Unlock()
	seen := map[int64]bool{}
	for i, r := range results {
		if r < 1 || r > calls || seen[r] {
			t.Fatalf("call %d read %d: each call must see its own increment (1..%d, once each)", i, r, calls)
		}
		seen[r] = true
	}
	for i := range calls {
		if v, err := rdb.Get(ctx, fmt.Sprintf("%sbatch:k%d", prefix, i)).Int(); err != nil || v != i {
			t.Fatalf("key %d = %d, %v", i, v, err)
		}
	}
	if trips > calls/4 {
		t.Fatalf("%d round trips for %d concurrent calls: too few were shared", trips, calls)
	}
	t.Logf("%d calls in %d round trips", calls, trips)
}

func TestBatchOneCallsFailedCommandLeavesTheOthers(t *testing.T) {
	t.Parallel()
	rdb, prefix, b := newBatch(t)
	ctx := context.Background()
	str := prefix + "batch:str"
	rdb.Set(ctx, str, "text", 0)
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Go(func() {
			errs[i] = b.Do(ctx, func(pipe redis.Pipeliner) {
				if i == 7 {
					pipe.Incr(ctx, str) // WRONGTYPE-like: not an integer
					return
				}
				pipe.Incr(ctx, fmt.Sprintf("%sbatch:c%d", prefix, i))
			})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if (i == 7) != (err != nil) {
			t.Fatalf("call %d: err %v; only call 7's command fails", i, err)
		}
	}
}

func TestBatchLoadsScriptsRedisLost(t *testing.T) {
	t.Parallel()
	rdb, prefix, b := newBatch(t)
	ctx := context.Background()
	key := prefix + "batch:lost"
	lost := redisx.NewScript(`return redis.call('INCRBY', KEYS[1], ARGV[1]) -- batch test ` + prefix)
	// Never loaded, with a body of this test's own: Redis answers NOSCRIPT, as it
	// does for every script after a restart (SCRIPT FLUSH would disturb the tests
	// running beside this one).
	var got, other *redis.Cmd
	var plain *redis.IntCmd
	err := b.Do(ctx, func(pipe redis.Pipeliner) {
		plain = pipe.Incr(ctx, key+":plain")
		got = lost.EvalSha(ctx, pipe, []string{key}, 5)
		other = lost.EvalSha(ctx, pipe, []string{key}, 2)
	})
	if err != nil {
		t.Fatalf("Do after SCRIPT FLUSH: %v", err)
	}
	if n, _ := got.Int64(); n != 5 {
		t.Fatalf("first script call = %d, want 5", n)
	}
	if n, _ := other.Int64(); n != 7 {
		t.Fatalf("second script call = %d, want 7", n)
	}
	if n, _ := rdb.Get(ctx, key+":plain").Int(); n != 1 || plain.Val() != 1 {
		t.Fatalf("the plain command ran %d times, want once", n)
	}
}

func TestBatchGoRunsUntilClose(t *testing.T) {
	t.Parallel()
	rdb, keys := testenv.Redis(t, 1)
	ctx := context.Background()
	b := redisx.NewBatch(rdb, 0) // closed by the test itself
	key := keys.Prefix() + "batch:go"
	var mu sync.Mutex
	var outcomes []error
	for range 50 {
		b.Go(ctx, func(pipe redis.Pipeliner) { pipe.Incr(ctx, key) }, func(err error) {
			mu.Lock()
			outcomes = append(outcomes, err)
			mu.Unlock()
		})
	}
	b.Close()
	if n, _ := rdb.Get(ctx, key).Int(); n != 50 || len(outcomes) != 50 {
		t.Fatalf("after Close: %d increments, %d outcomes; want 50 and 50", n, len(outcomes))
	}
	b.Go(ctx, func(pipe redis.Pipeliner) { pipe.Incr(ctx, key) }, nil)
	b.Close() // waits for anything the late Go started, had it started anything
	if n, _ := rdb.Get(ctx, key).Int(); n != 50 {
		t.Fatalf("Go after Close ran: %d", n)
	}
}

// Calls that share a round trip are queued on one Do's pipe: they go in one round
// trip, each command keeps its own answer, and one's failure is the Do's error
// without touching the others' results.
func TestCallsQueuedOnOnePipeShareItsRoundTrip(t *testing.T) {
	rdb, prefix, b := newBatch(t)
	ctx := context.Background()
	list, n := prefix+"along:list", prefix+"along:n"
	hook := &tripsOfKey{key: list}
	rdb.AddHook(hook)
	var got *redis.Cmd
	var pushed *redis.IntCmd
	err := b.Do(ctx, func(pipe redis.Pipeliner) {
		got = incrBy.Run(ctx, pipe, []string{n}, 2)
		pushed = pipe.RPush(ctx, list, "running")
		pipe.HSet(ctx, list, "f", "v") // WRONGTYPE
	})
	if err == nil {
		t.Fatal("a failed command of the pipe was not reported")
	}
	if v, _ := got.Int(); v != 2 || pushed.Val() != 1 {
		t.Fatalf("incr %d, push %d", v, pushed.Val())
	}
	if hook.trips != 1 || hook.cmds != 3 {
		t.Fatalf("the commands went in %d round trips with %d commands of the call, want 1 with 3", hook.trips, hook.cmds)
	}
}

// tripsOfKey counts the round trips that carry commands on key, and those commands
// of the counted trips that are not on key.
type tripsOfKey struct {
	key         string
	trips, cmds int
}

func (h *tripsOfKey) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *tripsOfKey) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.count([]redis.Cmder{cmd}); return next(ctx, cmd) }
}
func (h *tripsOfKey) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.count(cmds); return next(ctx, cmds) }
}

func (h *tripsOfKey) count(cmds []redis.Cmder) {
	for _, c := range cmds {
		if slices.Contains(c.Args(), any(h.key)) {
			h.trips, h.cmds = h.trips+1, h.cmds+len(cmds)
			return
		}
	}
}
