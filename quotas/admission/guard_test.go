package admission

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
)

// lateReplies makes the next n script calls late: Redis runs each one, but its reply
// arrives after the caller's deadline, as with a Redis that stalls for a moment. It
// counts the script calls that reached Redis.
type lateReplies struct {
	late    atomic.Int64
	scripts atomic.Int64
}

func (h *lateReplies) takeLate() bool {
	for {
		v := h.late.Load()
		if v <= 0 {
			return false
		}
		if h.late.CompareAndSwap(v, v-1) {
			return true
		}
	}
}

func (h *lateReplies) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lateReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *lateReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n != "evalsha" && n != "eval" {
			return next(ctx, cmd)
		}
		h.scripts.Add(1)
		if !h.takeLate() {
			return next(ctx, cmd)
		}
		err := next(context.WithoutCancel(ctx), cmd) // it runs in Redis...
		if err != nil {
			return err
		}
		<-ctx.Done() // ...and the answer comes too late
		return ctx.Err()
	}
}

type gfix struct {
	t    *testing.T
	rdb  *redis.Client
	hook *lateReplies
	g    *Guard
}

func newGuard(t *testing.T, cooldown time.Duration) *gfix {
	rdb, keys := testenv.Redis(t, 1)
	hook := &lateReplies{}
	rdb.AddHook(hook)
	g := NewGuard(New(rdb, keys, nil), GuardOptions{Timeout: 50 * time.Millisecond, Cooldown: cooldown})
	f := &gfix{t: t, rdb: rdb, hook: hook, g: g}
	// load the scripts and detect the Lua flavour, so injected faults hit admissions
	if d := f.admit(quotas.ModeKey, "prime"); d.Degraded {
		t.Fatal("priming admission degraded")
	}
	return f
}

var keyOnly = limitsOn(func(l *quotas.Limits) { l.KeyRate = 1000; l.KeyBurst = 1000 })

func (f *gfix) params(mode quotas.Mode, task string) quotas.AdmitParams {
	return quotas.AdmitParams{Mode: mode, TenantID: "acme", Kid: "k1", TaskID: task, InScope: true, Limits: keyOnly,
		Period: quotas.PeriodAt(time.Now(), time.Now())}
}

func (f *gfix) admit(mode quotas.Mode, task string) quotas.Decision {
	f.t.Helper()
	d, err := f.g.Admit(context.Background(), f.params(mode, task))
	if err != nil {
		f.t.Fatal(err)
	}
	return d
}

// reached runs one admission and reports whether it reached Redis.
func (f *gfix) reached() bool {
	f.t.Helper()
	before := f.hook.scripts.Load()
	f.admit(quotas.ModeKey, "")
	return f.hook.scripts.Load() > before
}

func TestGuardOneTimeoutDoesNotTrip(t *testing.T) {
	t.Parallel()
	f := newGuard(t, time.Minute)
	f.hook.late.Store(1)
	if d := f.admit(quotas.ModeKey, ""); !d.Degraded || !d.Allowed {
		t.Fatalf("a timed-out admission: %+v, want a degraded answer", d)
	}
	if f.g.Degraded() {
		t.Fatal("one timeout switched the replica to degraded mode")
	}
	if !f.reached() {
		t.Fatal("the admission after one timeout did not go to Redis")
	}
	// failures that are not consecutive and stay rare never trip
	for i := range 100 {
		if i%10 == 0 {
			f.hook.late.Store(1)
		}
		f.admit(quotas.ModeKey, "")
	}
	if f.g.Degraded() {
		t.Fatal("one failure in ten tripped the breaker")
	}
}

// Admissions in flight together that fail together (one slow moment of Redis, or one
// shared round trip that came back late) are one failure, not many: the breaker stays
// closed and the next admission goes to Redis. Before, the burst opened it, and every
// submission of the cool-down was refused with a 503.
func TestGuardOneSlowMomentDoesNotTrip(t *testing.T) {
	t.Parallel()
	f := newGuard(t, time.Minute)
	const n = 8
	f.hook.late.Store(n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			d, err := f.g.Admit(context.Background(), f.params(quotas.ModeKey, ""))
			if err != nil || !d.Degraded {
				t.Errorf("a late admission: %+v, %v; want a degraded answer", d, err)
			}
		})
	}
	wg.Wait()
	if f.g.Degraded() {
		t.Fatalf("%d admissions late at the same moment tripped the breaker", n)
	}
	if !f.reached() {
		t.Fatal("the admission after the slow moment did not go to Redis")
	}
}

func TestGuardTripsOnConsecutiveFailuresAndRecovers(t *testing.T) {
	t.Parallel()
	f := newGuard(t, 300*time.Millisecond)
	f.hook.late.Store(3)
	for i := range 3 {
		if !f.reached() {
			t.Fatalf("failure %d did not reach Redis: the breaker opened early", i+1)
		}
	}
	if !f.g.Degraded() {
		t.Fatal("3 consecutive timeouts did not trip the breaker")
	}
	if f.reached() {
		t.Fatal("an open breaker still sends admissions to Redis")
	}
	if d := f.admit(quotas.ModeKey, ""); !d.Degraded {
		t.Fatal("an open breaker answered without the degraded rules")
	}
	time.Sleep(350 * time.Millisecond)
	// half-open: one probe goes to Redis; it fails, so the breaker opens again
	f.hook.late.Store(1)
	if !f.reached() {
		t.Fatal("no probe after the cool-down")
	}
	if !f.g.Degraded() || f.reached() {
		t.Fatal("a failed probe did not open the breaker again")
	}
	time.Sleep(350 * time.Millisecond)
	if !f.reached() {
		t.Fatal("no probe after the second cool-down")
	}
	if f.g.Degraded() {
		t.Fatal("a successful probe did not close the breaker")
	}
	for range 5 {
		if !f.reached() {
			t.Fatal("a closed breaker skipped Redis")
		}
	}
}

func TestGuardTripsOnErrorRate(t *testing.T) {
	t.Parallel()
	f := newGuard(t, time.Minute)
	// every other call fails: never 3 in a row, but half of them
	for i := range 40 {
		if f.g.Degraded() {
			if calls := i + 1; calls < rateMinCalls { // the priming call counts too
				t.Fatalf("tripped after only %d calls", calls)
			}
			return
		}
		if i%2 == 0 {
			f.hook.late.Store(1)
		}
		f.admit(quotas.ModeKey, "")
	}
	t.Fatal("half of 40 admissions failed and the breaker stayed closed")
}

// A timed-out admission may have taken its session lease in Redis; when the task is
// not created (a degraded refusal, or a quota tenant's 503) the guard gives it back.
func TestGuardReleasesTheLeaseOfATimedOutAdmission(t *testing.T) {
	t.Parallel()
	f := newGuard(t, time.Minute)
	ctx := context.Background()
	sessions := f.g.q.keys.Sessions("acme")
	held := func(task string) bool {
		_, err := f.rdb.ZScore(ctx, sessions, task).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		return err == nil
	}
	waitReleased := func(task string) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for held(task) {
			if time.Now().After(deadline) {
				t.Fatalf("the lease of timed-out admission %s was never released", task)
			}
			f.g.retryReleases(ctx)
			time.Sleep(20 * time.Millisecond)
		}
	}

	// 1. refused by the local bucket: the in-process key bucket is empty, Redis's is not
	local := f.params(quotas.ModeAdmit, "local")
	local.Kid = "k2" // a fresh key bucket
	local.Limits = limitsOn(func(l *quotas.Limits) { l.KeyRate = 0.001; l.KeyBurst = 1; l.Sessions = 10 })
	if d, _ := f.g.degraded(local); !d.Allowed {
		t.Fatal("the local bucket refused its first token")
	}
	p := local
	p.TaskID = "refused"
	f.hook.late.Store(1)
	d, err := f.g.Admit(ctx, p)
	if err != nil || d.Allowed || !d.Degraded {
		t.Fatalf("timed-out admission with the local bucket empty: %+v %v, want a degraded refusal", d, err)
	}
	if !held("refused") {
		t.Fatal("the late script did not take its lease: the test shows nothing")
	}
	waitReleased("refused")

	// 2. a quota tenant fails closed (503): its lease goes back too
	q := f.params(quotas.ModeAdmit, "closed")
	q.Limits = limitsOn(func(l *quotas.Limits) { l.KeyRate = 1000; l.KeyBurst = 1000; l.Sessions = 10; l.TokensMonthly = 1000 })
	if _, err := f.g.q.Seed(ctx, q.TenantID, q.Period); err != nil { // so the late script decides, and takes
		t.Fatal(err)
	}
	f.hook.late.Store(1)
	if _, err := f.g.Admit(ctx, q); !errors.Is(err, quotas.ErrUnavailable) {
		t.Fatalf("timed-out admission of a quota tenant: %v, want ErrUnavailable", err)
	}
	if !held("closed") {
		t.Fatal("the late script did not take its lease")
	}
	waitReleased("closed")

	// 3. a degraded admission that is allowed keeps its lease: the task will be created
	ok := f.params(quotas.ModeAdmit, "allowed")
	ok.Limits = limitsOn(func(l *quotas.Limits) { l.KeyRate = 1000; l.KeyBurst = 1000; l.Sessions = 10 })
	f.hook.late.Store(1)
	if d, err := f.g.Admit(ctx, ok); err != nil || !d.Allowed {
		t.Fatalf("timed-out admission of a no-quota tenant: %+v %v", d, err)
	}
	f.g.retryReleases(ctx)
	if !held("allowed") {
		t.Fatal("the lease of an admitted task was released")
	}
}

// limitsOn is NoLimits with the given limits turned on: a zero field of a Limits literal
// is a limit of zero, not "off".
func limitsOn(set func(*quotas.Limits)) quotas.Limits {
	l := quotas.NoLimits()
	set(&l)
	return l
}
