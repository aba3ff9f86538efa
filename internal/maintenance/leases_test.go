package maintenance

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/testenv/testfactory"
)

// The lease pass releases the lease of a task that ended, re-adds those of live tasks
// Redis lost, pushes a waiting task's lease forward, and spares the young lease of a
// task Postgres does not know yet (an admission still writing it).
func TestLeasesReleasesAndRestores(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("l")
	ended := f.submit("l")
	testfactory.TaskEnded(t, f.Pool, ended, "completed")
	lost := f.submit("l")
	if _, err := f.q.Release(f.ctx, nil, "l", lost.String()); err != nil {
		t.Fatal(err)
	}
	waiting := f.submit("l")
	soon := float64(time.Now().Add(time.Second).UnixMilli()) // about to expire
	f.Redis.ZAddXX(f.ctx, f.Keys.Sessions("l"), redis.Z{Score: soon, Member: waiting.String()})
	admitting := uuid.Must(uuid.NewV7())
	if err := f.q.AddLease(f.ctx, "l", admitting.String(), false); err != nil {
		t.Fatal(err)
	}

	p := NewLeases(f.Deps, NewElector(f.Deps, ElectorConfig{}), LeasesConfig{})
	res, err := p.runOnce(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Released != 1 || res.Added != 1 || !res.Stats.Done || res.Stats.Rows != 1 {
		t.Fatalf("result %+v, want 1 released, 1 re-added, the one tenant reviewed", res)
	}
	sess, _, _ := f.q.Leases(f.ctx, "l")
	slices.Sort(sess)
	want := []string{lost.String(), waiting.String(), admitting.String()}
	slices.Sort(want)
	if !slices.Equal(sess, want) {
		t.Fatalf("leases %v, want %v", sess, want)
	}
	if sc := f.Redis.ZScore(f.ctx, f.Keys.Sessions("l"), waiting.String()).Val(); sc < float64(time.Now().Add(5*time.Hour).UnixMilli()) {
		t.Fatalf("the waiting task's lease expires in %v", time.Duration(sc-float64(time.Now().UnixMilli()))*time.Millisecond)
	}
	if res, err := p.runOnce(f.ctx); err != nil || res.Released+res.Added != 0 {
		t.Fatalf("a second run: %+v, %v", res, err)
	}
}

// With many tenants the tenant passes advance a batch per run from their cursor and
// cover every tenant over the runs; a pass that runs out of its budget stops part way
// and the next run resumes there.
func TestTenantPassesResumeFromTheirCursor(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const tenants = 20000
	f.exec(`INSERT INTO tenants (id, name, plan) SELECT 'bulk' || lpad(g::text, 5, '0'), 'Bulk', 'free' FROM generate_series(1, $1) g`, tenants)
	// The last tenant in id order holds the lease of a task that ended.
	last := fmt.Sprintf("bulk%05d", tenants)
	ended := f.task(last)
	testfactory.TaskEnded(t, f.Pool, ended, "completed")
	if err := f.q.AddLease(f.ctx, last, ended.String(), false); err != nil {
		t.Fatal(err)
	}
	e := NewElector(f.Deps, ElectorConfig{})
	walk := TenantWalk{Batch: 6000, Page: 500}
	leases := NewLeases(f.Deps, e, LeasesConfig{Walk: walk, Budget: 20 * time.Second})
	running := NewRunningSets(f.Deps, e, RunningSetsConfig{Walk: walk, Budget: 20 * time.Second})
	released := 0
	began := time.Now()
	for pass, run := range map[string]func() (PassStats, error){
		passLeases: func() (PassStats, error) {
			res, err := leases.runOnce(f.ctx)
			released += res.Released
			return res.Stats, err
		},
		passRunning: func() (PassStats, error) { res, err := running.runOnce(f.ctx); return res.Stats, err },
	} {
		covered, prev := 0, ""
		for n := 1; n <= 4; n++ {
			st, err := run()
			if err != nil || st.Err != "" || st.Name != pass {
				t.Fatalf("%s run %d: %+v, %v", pass, n, st, err)
			}
			covered += st.Rows
			if n < 4 {
				// advanced by a batch, not done, and resuming past where the last run stopped
				if st.Rows != 6000 || st.Done || st.Cursor <= prev {
					t.Fatalf("%s run %d: %+v (previous cursor %q)", pass, n, st, prev)
				}
			} else if !st.Done || st.Cursor != "" {
				t.Fatalf("%s run %d: %+v, want it to reach the last tenant and wrap", pass, n, st)
			}
			prev = st.Cursor
		}
		if covered != tenants {
			t.Fatalf("%s reviewed %d tenants over the runs, want all %d", pass, covered, tenants)
		}
	}
	if released != 1 {
		t.Fatalf("the last tenant's leaked lease: %d released, want 1", released)
	}
	if took := time.Since(began); took > 20*time.Second {
		t.Fatalf("eight runs over %d tenants took %v", tenants, took)
	}

	// A run out of budget stops where it is, with its cursor, and the next resumes.
	tight := NewLeases(f.Deps, e, LeasesConfig{Walk: TenantWalk{Batch: 1 << 20, Page: 50}, Budget: 40 * time.Millisecond})
	res, err := tight.runOnce(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st := res.Stats; st.Done || st.Rows == 0 || st.Rows >= tenants || st.Cursor == "" {
		t.Fatalf("a run with a tiny budget: %+v, want it stopped part way with a cursor", st)
	}
	next, err := tight.runOnce(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if next.Stats.Cursor <= res.Stats.Cursor && !next.Stats.Done {
		t.Fatalf("the next run did not resume: cursor %q after %q", next.Stats.Cursor, res.Stats.Cursor)
	}
}

// A paused task holds no session: the lease pass releases the lease a paused task
// kept (its worker died, or Redis failed, between the pause and the release) as it
// does an ended task's.
func TestLeasesReleaseAPausedTasksLease(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("lp")
	paused := f.submit("lp")
	testfactory.TaskInState(t, f.Pool, paused, "paused")
	// Last refreshed two minutes ago, by the worker that paused it.
	f.Redis.ZAddXX(f.ctx, f.Keys.Sessions("lp"), redis.Z{Score: float64(time.Now().Add(6*time.Hour - 2*time.Minute).UnixMilli()), Member: paused.String()})
	p := NewLeases(f.Deps, NewElector(f.Deps, ElectorConfig{}), LeasesConfig{})
	res, err := p.runOnce(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sess, long, _ := f.q.Leases(f.ctx, "lp"); res.Released != 1 || len(sess)+len(long) != 0 {
		t.Fatalf("result %+v, leases %v %v; want the paused task's lease released", res, sess, long)
	}
}

// A lease taken or refreshed under a minute ago on a task the pass reads as paused is
// a resume's, made between the pass's read and its release: the pass spares it.
func TestLeasesSpareAResumesFreshLease(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("lr")
	resuming := f.submit("lr") // its lease taken a moment ago
	testfactory.TaskInState(t, f.Pool, resuming, "paused")
	p := NewLeases(f.Deps, NewElector(f.Deps, ElectorConfig{}), LeasesConfig{})
	res, err := p.runOnce(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sess, _, _ := f.q.Leases(f.ctx, "lr"); res.Released != 0 || !slices.Contains(sess, resuming.String()) {
		t.Fatalf("result %+v, leases %v; want the fresh lease kept", res, sess)
	}
}
