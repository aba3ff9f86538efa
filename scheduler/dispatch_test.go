package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/rkeys"
)

// seedTenant writes a backlogged tenant's scheduler state directly: its conf, running
// set, queue and its entry in ready at pass. tasks are queued in order (score i).
func (f *fixture) seedTenant(tenant string, pass float64, weight, cap, running int, tasks ...string) {
	f.t.Helper()
	ctx := context.Background()
	pipe := f.rdb.TxPipeline()
	pipe.HSet(ctx, f.keys.TenantConf(tenant), "w", weight, "cap", cap)
	for i := range running {
		pipe.SAdd(ctx, f.keys.TenantRunning(tenant), fmt.Sprintf("%s-running-%d", tenant, i))
	}
	for i, task := range tasks {
		pipe.ZAdd(ctx, f.keys.TenantQueue(tenant), redis.Z{Score: QueueScore(DefaultPriority, f.base) + float64(i), Member: task})
	}
	pipe.ZAdd(ctx, f.keys.Ready(0), redis.Z{Score: pass, Member: tenant})
	if _, err := pipe.Exec(ctx); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) score(key, member string) (float64, bool) {
	f.t.Helper()
	v, err := f.rdb.ZScore(context.Background(), key, member).Result()
	if err == redis.Nil {
		return 0, false
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return v, true
}

// A dispatch whose candidates do not include the head of ready changes nothing and
// answers "retry" with the current heads; dispatchOne then picks the head.
func TestDispatchRetriesWhenTheHeadIsNotACandidate(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100, 0)
	ctx := context.Background()
	f.seedTenant("a", 10, 1, 0, 0, "a1", "a2")
	f.seedTenant("b", 20, 1, 0, 0, "b1")

	// The script alone, with a candidate that is not the head: nothing moves.
	keys := []string{f.keys.Ready(0), f.keys.Capped(0), f.keys.Dispatching(0), f.keys.VirtualTime(0),
		f.keys.TenantConf("b"), f.keys.TenantRunning("b"), f.keys.TenantQueue("b")}
	res, err := dispatchScript.Run(ctx, f.rdb, keys, f.s.nowArg(), 60, DefaultEstimateMs, "0", readyCandidates, cappedCandidates, 1, "b").StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(res) != "[retry 0 a b]" {
		t.Fatalf("dispatch with a stale candidate answered %v, want [retry 0 a b]", res)
	}
	if n := f.rdb.ZCard(ctx, f.keys.TenantQueue("a")).Val() + f.rdb.ZCard(ctx, f.keys.TenantQueue("b")).Val(); n != 3 {
		t.Fatalf("queues hold %d tasks after a retry answer, want 3", n)
	}
	if n := f.rdb.ZCard(ctx, f.keys.Dispatching(0)).Val(); n != 0 {
		t.Fatalf("a retry answer dispatched %d tasks", n)
	}

	// Through the Go method, starting from stale candidates.
	f.s.setCandidates(0, []string{"gone", "b"})
	d, err := f.s.dispatchOne(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if d.TenantID != "a" || d.TaskID != "a1" {
		t.Fatalf("dispatched %+v, want a's first task", d)
	}
	if got := fmt.Sprint(f.s.candidates(0)); got != "[a b]" && got != "[b a]" {
		t.Fatalf("candidates after the dispatch = %s, want ready's heads a and b", got)
	}
	// a was charged the default estimate: pass 10 + 100/1.
	if p, _ := f.score(f.keys.Ready(0), "a"); p != 10+DefaultEstimateMs {
		t.Fatalf("a's pass = %v, want %v", p, 10+DefaultEstimateMs)
	}
}

// More capped and emptied tenants ahead of the one to dispatch than one call names as
// candidates: dispatchOne carries on over several calls, and each skipped tenant ends
// where a single scan would have put it.
func TestDispatchSkipsMoreCappedTenantsThanOneCallNames(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100, 0)
	ctx := context.Background()
	const capped = 3*readyCandidates + 1
	for i := range capped {
		f.seedTenant(fmt.Sprintf("c%02d", i), float64(i), 1, 1, 1, fmt.Sprintf("c%02d-task", i))
	}
	f.seedTenant("emptied", float64(capped), 1, 0, 0) // its tasks were cancelled
	f.seedTenant("free", 1000, 2, 0, 0, "free-task")

	d, err := f.s.dispatchOne(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if d.TenantID != "free" || d.TaskID != "free-task" || d.Priority != DefaultPriority || d.EstimateMs != DefaultEstimateMs {
		t.Fatalf("dispatched %+v, want free's task", d)
	}
	for i := range capped {
		tenant := fmt.Sprintf("c%02d", i)
		if p, ok := f.score(f.keys.Capped(0), tenant); !ok || p != float64(i) {
			t.Fatalf("%s in capped = %v %v, want its pass %d", tenant, p, ok, i)
		}
		if _, ok := f.score(f.keys.Ready(0), tenant); ok {
			t.Fatalf("%s still in ready", tenant)
		}
	}
	if _, ok := f.score(f.keys.Ready(0), "emptied"); ok {
		t.Fatal("a tenant with an empty queue stayed in ready")
	}
	if fp := f.rdb.HGet(ctx, f.keys.TenantConf("emptied"), "fp").Val(); fp != strconv.Itoa(capped) {
		t.Fatalf("emptied tenant's finish pass = %q, want its pass %d", fp, capped)
	}
	// free's queue emptied at this dispatch: it leaves ready with its finish pass
	// 1000 + 100/2.
	if _, ok := f.score(f.keys.Ready(0), "free"); ok {
		t.Fatal("free stayed in ready with an empty queue")
	}
	if fp := f.rdb.HGet(ctx, f.keys.TenantConf("free"), "fp").Val(); fp != "1050" {
		t.Fatalf("free's finish pass = %q, want 1050", fp)
	}
	if ok := f.rdb.SIsMember(ctx, f.keys.TenantRunning("free"), "free-task").Val(); !ok {
		t.Fatal("free's task is not in its running set")
	}
	if vt := f.rdb.Get(ctx, f.keys.VirtualTime(0)).Val(); vt != "1000" {
		t.Fatalf("virtual time = %q, want 1000", vt)
	}
	if _, err := f.s.dispatchOne(ctx, 0, 0); err != errEmpty {
		t.Fatalf("next dispatch: %v, want errEmpty", err)
	}
}

// The member the dispatch script writes is rkeys.DispatchingMember, the format the
// re-send and the completion read.
func TestDispatchWritesTheRkeysDispatchingMember(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100, 0)
	ctx := context.Background()
	id := f.enqueue("acme", 8, 1, 0)
	d, err := f.dispatch()
	if err != nil {
		t.Fatal(err)
	}
	members := f.rdb.ZRange(ctx, f.keys.Dispatching(0), 0, -1).Val()
	want := rkeys.DispatchingMember(8, DefaultEstimateMs, "acme", id.String())
	if len(members) != 1 || members[0] != want || d.member() != want {
		t.Fatalf("dispatching set = %q (Go side %q), want [%q]", members, d.member(), want)
	}
	p, est, tenant, task, err := rkeys.ParseDispatchingMember(members[0])
	if err != nil || p != 8 || est != DefaultEstimateMs || tenant != "acme" || task != id.String() {
		t.Fatalf("parsed %d %d %q %q %v", p, est, tenant, task, err)
	}
}

// Dispatchers in different processes hold different, often stale, candidates: they
// still hand out every task once, in the same weighted-fair proportions.
func TestDispatchersWithTheirOwnCandidatesShareFairly(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100000, 0)
	ctx := context.Background()
	const perTenant = 60
	weights := map[string]int{"w1": 1, "w2": 2, "w3": 3}
	for i := range perTenant {
		for tenant, w := range weights {
			f.enqueue(tenant, 5, w, 0)
		}
		f.enqueue(fmt.Sprintf("one%d", i), 5, 1, 0) // tenants that come and go
	}
	scheds := make([]*Scheduler, 3)
	for i := range scheds {
		scheds[i] = New(f.rdb, f.keys, Options{NowMs: f.now})
	}
	var mu sync.Mutex
	seen := map[string]bool{}
	counts := map[string]int{}
	var wg sync.WaitGroup
	const first = 120 // all weighted tenants still backlogged
	for _, s := range scheds {
		wg.Go(func() {
			for {
				d, err := s.dispatchOne(ctx, 0, 0)
				if err == errEmpty {
					return
				}
				if err == errBusy {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if seen[d.TaskID] {
					t.Errorf("task %s dispatched twice", d.TaskID)
				}
				seen[d.TaskID] = true
				if len(seen) <= first {
					counts[d.TenantID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != perTenant*4 {
		t.Fatalf("dispatched %d tasks, want %d", len(seen), perTenant*4)
	}
	// Of the first 120 dispatches, the one-task tenants take one each; w1:w2:w3 split
	// the rest 1:2:3 within a few tasks.
	weighted := counts["w1"] + counts["w2"] + counts["w3"]
	for tenant, w := range weights {
		want := float64(weighted) * float64(w) / 6
		if got := float64(counts[tenant]); got < want-4 || got > want+4 {
			t.Errorf("%s got %v of %d weighted dispatches, want about %.0f (counts %v)", tenant, got, weighted, want, counts)
		}
	}
}

func TestRunningSetsReadsAPageOfTenants(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0, 0)
	ctx := context.Background()
	for _, r := range [][2]string{{"a", "x"}, {"b", "y"}, {"b", "z"}} {
		if err := f.s.AddRunning(ctx, r[0], r[1]); err != nil {
			t.Fatal(err)
		}
	}
	sets, err := f.s.RunningSets(ctx, []string{"b", "none", "a"})
	if err != nil {
		t.Fatal(err)
	}
	if len(sets) != 3 || !slices.Equal(sorted(sets[0]), []string{"y", "z"}) || len(sets[1]) != 0 || !slices.Equal(sets[2], []string{"x"}) {
		t.Fatalf("running sets = %v, want [[y z] [] [x]]", sets)
	}
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

// The generation marker is reported missing once, then present, and always carries a
// ttl; after a FLUSHDB-like loss it is missing again.
func TestMarkGeneration(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0, 0)
	ctx := context.Background()
	for i, want := range []bool{true, false, false} {
		set, err := f.s.MarkGeneration(ctx)
		if err != nil || set != want {
			t.Fatalf("call %d: set = %v (%v), want %v", i, set, err, want)
		}
		if ttl := f.rdb.TTL(ctx, f.keys.Generation()).Val(); ttl < generationTTL-time.Minute {
			t.Fatalf("call %d: marker ttl %v, want about %v", i, ttl, generationTTL)
		}
	}
	f.rdb.Del(ctx, f.keys.Generation())
	if set, err := f.s.MarkGeneration(ctx); err != nil || !set {
		t.Fatalf("after the marker was lost: set = %v (%v), want true", set, err)
	}
}

// On a cluster a node restarted without its data loses only its shards' keys: the
// loss of one shard's marker is reported though the global marker is still there.
func TestMarkGenerationSeesOneShardsLoss(t *testing.T) {
	t.Parallel()
	f := newShardedFixture(t, 0, 0, 4)
	ctx := context.Background()
	if set, err := f.s.MarkGeneration(ctx); err != nil || !set {
		t.Fatalf("first mark: set = %v (%v), want true", set, err)
	}
	for shard := range 4 {
		if ttl := f.rdb.TTL(ctx, f.keys.ShardGeneration(shard)).Val(); ttl < generationTTL-time.Minute {
			t.Fatalf("shard %d: marker ttl %v, want about %v", shard, ttl, generationTTL)
		}
	}
	if set, err := f.s.MarkGeneration(ctx); err != nil || set {
		t.Fatalf("second mark: set = %v (%v), want false", set, err)
	}
	f.rdb.Del(ctx, f.keys.ShardGeneration(2))
	if set, err := f.s.MarkGeneration(ctx); err != nil || !set {
		t.Fatalf("after shard 2 lost its marker: set = %v (%v), want true", set, err)
	}
}

func TestQueueLen(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10, 0)
	ctx := context.Background()
	f.enqueue("a", 5, 1, 0)
	f.enqueue("a", 5, 1, 0)
	if n, err := f.s.QueueLen(ctx, "a"); err != nil || n != 2 {
		t.Fatalf("queue length %d (%v), want 2", n, err)
	}
	f.mustDispatch()
	if n, err := f.s.QueueLen(ctx, "a"); err != nil || n != 1 {
		t.Fatalf("after a dispatch: %d (%v), want 1", n, err)
	}
}

// A pop of several tasks in one call takes them in the order single pops would, with
// the same state left behind: caps, emptied queues and passes included.
func TestDispatchManyPopsInTheOrderOfSinglePops(t *testing.T) {
	t.Parallel()
	seed := func(f *fixture) {
		f.seedTenant("a", 10, 1, 0, 0, "a1", "a2", "a3", "a4")
		f.seedTenant("b", 12, 2, 0, 0, "b1", "b2", "b3", "b4", "b5")
		f.seedTenant("c", 11, 1, 2, 1, "c1", "c2", "c3")
		f.seedTenant("d", 40, 1, 0, 0, "d1")
	}
	ctx := context.Background()
	single := newFixture(t, 100, 0)
	many := newShardedFixture(t, 100, 0, 1)
	seed(single)
	seed(many)
	var want []string
	for {
		d, err := single.s.dispatchOne(ctx, 0, 0)
		if errors.Is(err, errEmpty) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, d.TenantID+"/"+d.TaskID)
	}
	var got []string
	for _, n := range []int{3, 5, 100} {
		ds, err := many.s.dispatchMany(ctx, 0, 0, n)
		if err != nil && !errors.Is(err, errEmpty) {
			t.Fatal(err)
		}
		if len(ds) > n {
			t.Fatalf("asked for %d, popped %d", n, len(ds))
		}
		for _, d := range ds {
			got = append(got, d.TenantID+"/"+d.TaskID)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("batched pops %v\nsingle pops  %v", got, want)
	}
	if len(want) != 11 { // c stops at its cap of 2 with one running
		t.Fatalf("%d tasks popped, want 11: %v", len(want), want)
	}
	for _, k := range []func(int) string{single.keys.Ready, single.keys.Capped} {
		a := single.rdb.ZRangeWithScores(ctx, k(0), 0, -1).Val()
		b := many.rdb.ZRangeWithScores(ctx, strings.Replace(k(0), single.keys.Prefix(), many.keys.Prefix(), 1), 0, -1).Val()
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("%s after batched pops %v, after single pops %v", k(0), b, a)
		}
	}
}
