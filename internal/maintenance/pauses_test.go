package maintenance

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentq/agentq/internal/tasks"
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
