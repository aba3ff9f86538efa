package maintenance

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/internal/testenv/testfactory"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
)

// countingSweeper counts the sweeps made through it.
type countingSweeper struct{ n atomic.Int64 }

func (c *countingSweeper) SweepPauses(context.Context, *tasks.PauseMarks) (tasks.PauseSweep, error) {
	c.n.Add(1)
	return tasks.PauseSweep{}, nil
}

// Of two processes running the pause watcher, only the janitor's leader sweeps.
func TestPauseWatcherSweepsOnTheLeaderOnly(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ea, eb := newElector(t, f), newElector(t, f)
	var sa, sb countingSweeper
	da, db := f.Deps, f.Deps
	da.Pauses, db.Pauses = &sa, &sb
	wa := NewPauseWatcher(da, ea, PauseWatcherConfig{Interval: 10 * time.Millisecond})
	wb := NewPauseWatcher(db, eb, PauseWatcherConfig{Interval: 10 * time.Millisecond})
	wa.TestSignals.Init(t)
	wb.TestSignals.Init(t)
	for _, w := range []*PauseWatcher{wa, wb} {
		if err := w.Start(f.ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Stop)
	}
	leader, other, follower := wa, &sb, eb
	select {
	case <-ea.TestSignals.Elected.WaitC():
	case <-eb.TestSignals.Elected.WaitC():
		leader, other, follower = wb, &sa, ea
	case <-time.After(5 * time.Second):
		t.Fatal("no elector took the lead")
	}
	for range 5 {
		leader.TestSignals.Swept.WaitOrTimeout()
	}
	if follower.Leader() || other.n.Load() != 0 {
		t.Fatalf("the follower swept %d times (leads: %v), want none", other.n.Load(), follower.Leader())
	}
}

// pauseService is the tasks service the janitor's pause watcher sweeps with, on f.
func pauseService(f *fixture) *tasks.Service {
	st := store.New(f.Pool)
	return tasks.New(tasks.Deps{
		Store: st, Tenants: tenants.New(st, f.Plans, tenants.Options{}),
		Admission: admission.NewGuard(f.q, admission.GuardOptions{Timeout: time.Second}),
		Queue:     f.sched, Redis: f.Redis, Keys: f.Keys,
	})
}

// pause starts task id and pauses it at limitType (its limit and the use that met it
// both limit), its pause begun age ago and expiring timeout after it began.
func (f *fixture) pause(id uuid.UUID, limitType string, limit int64, age, timeout time.Duration) {
	f.t.Helper()
	st := store.New(f.Pool)
	run, _, err := st.UnscopedStartTask(f.ctx, id)
	if err != nil {
		f.t.Error(err)
		return
	}
	if _, err := st.UnscopedPauseTask(f.ctx, store.UnscopedPauseTaskParams{Claim: store.Claim{ID: id, Attempt: run.Attempt},
		Reason: limitType, Limit: limit, Used: limit}); err != nil {
		f.t.Error(err)
		return
	}
	testfactory.TaskPausedAgo(f.t, f.Pool, id, age, timeout)
}

// Many tasks pause at once while two watchers sweep them over and over (a leadership
// change overlapping a sweep): each pause past its timeout ends once, each pause its
// quota no longer holds resumes once, and each task's watchers hear of it once.
func TestPauseWatcherStress(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.exec(`INSERT INTO tenants (id, name, plan, overrides) VALUES ('m', 'm', 'pro', '{"concurrent_sessions": "unlimited"}')`)
	d := f.Deps
	d.Pauses = pauseService(f)
	watchers := []*PauseWatcher{NewPauseWatcher(d, NewElector(d, ElectorConfig{}), PauseWatcherConfig{}),
		NewPauseWatcher(d, NewElector(d, ElectorConfig{}), PauseWatcherConfig{})}
	events := f.Redis.PSubscribe(f.ctx, f.Keys.TaskEvents("*"))
	defer events.Close()
	if _, err := events.Receive(f.ctx); err != nil {
		t.Fatal(err)
	}

	const perPauser, pausers = 10, 6
	var expiring, resuming sync.Map // task id → true
	var total atomic.Int64          // resumed and expired, over every sweep
	var swept tasks.PauseSweep
	var mu sync.Mutex
	progress := make(chan struct{}, 1) // a sweep changed something
	sweep := func(w *PauseWatcher) {
		res, err := w.runOnce(f.ctx)
		if err != nil {
			t.Error(err)
		}
		mu.Lock()
		swept.Resumed += res.Resumed
		swept.Expired += res.Expired
		mu.Unlock()
		if total.Add(int64(res.Resumed + res.Expired)); res.Resumed+res.Expired > 0 {
			select {
			case progress <- struct{}{}:
			default:
			}
		}
	}
	stop := make(chan struct{})
	var sweepers, pausing sync.WaitGroup
	for _, w := range watchers {
		sweepers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					sweep(w)
				}
			}
		})
	}
	for p := range pausers {
		pausing.Go(func() {
			for i := range perPauser {
				id := f.task("m")
				if (p+i)%2 == 0 { // paused a day and an hour ago, for at most a day
					f.pause(id, quotas.TaskMaxCostUSD, 1_000_000, 25*time.Hour, 24*time.Hour)
					expiring.Store(id, true)
				} else { // the daily steps it met are not used any more (Redis holds none)
					f.pause(id, quotas.AgentStepsDaily, 500, time.Minute, 24*time.Hour)
					resuming.Store(id, true)
				}
			}
		})
	}
	pausing.Wait()
	// A change of the tenant makes the sweeps look at its quota pauses again, those
	// that paused after a sweep had looked included.
	w := 1
	if _, err := store.New(f.Pool).UpdateTenant(f.ctx, store.UpdateTenantParams{ID: "m", Weight: &w}); err != nil {
		t.Fatal(err)
	}
	for total.Load() < pausers*perPauser && !t.Failed() {
		select {
		case <-progress:
		case <-time.After(time.Minute):
			t.Errorf("the sweeps settled %d of %d pauses", total.Load(), pausers*perPauser)
		}
	}
	close(stop)
	sweepers.Wait()
	for _, w := range watchers { // nothing is left to do
		sweep(w)
	}

	if want := pausers * perPauser / 2; swept.Expired != want || swept.Resumed != want {
		t.Fatalf("the sweeps expired %d and resumed %d, want %d each", swept.Expired, swept.Resumed, want)
	}
	// Every state message of the sweeps is in before the sentinel, published after them.
	sentinel := f.Keys.TaskEvents("sentinel")
	if err := f.Redis.Publish(f.ctx, sentinel, "end").Err(); err != nil {
		t.Fatal(err)
	}
	heard := map[string][]string{}
	for m := range events.Channel() {
		if m.Channel == sentinel {
			break
		}
		var ev struct {
			TaskID string `json:"task_id"`
			State  string `json:"state"`
		}
		if err := json.Unmarshal([]byte(m.Payload), &ev); err != nil {
			t.Fatal(err)
		}
		heard[ev.TaskID] = append(heard[ev.TaskID], ev.State)
	}
	check := func(ids *sync.Map, state agentqtype.TaskState) {
		ids.Range(func(k, _ any) bool {
			id := k.(uuid.UUID)
			if got := f.state(id); got != string(state) {
				t.Errorf("task %s is %s, want %s", id, got, state)
			}
			if h := heard[id.String()]; len(h) != 1 || h[0] != string(state) {
				t.Errorf("task %s's watchers heard %v, want %s once", id, h, state)
			}
			return true
		})
	}
	check(&expiring, agentqtype.TaskStateBudgetExceeded)
	check(&resuming, agentqtype.TaskStateQueued)
}
