package maintenance

import (
	"testing"
	"time"

	"github.com/agentq/agentq/internal/store"
)

// A pool counter that counts slots no task holds is recounted.
func TestPoolCounterRecountsTheCounter(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.Redis.Set(f.ctx, f.Keys.SlotsInflight(), 5, time.Hour)
	p := NewSlotCounter(f.Deps, NewElector(f.Deps, ElectorConfig{}), SlotCounterConfig{})
	res, err := p.runOnce(f.ctx)
	if err != nil || res.Corrected != -5 || !res.Stats.Done {
		t.Fatalf("result %+v, %v; want the counter corrected by -5", res, err)
	}
	if n, _ := f.Redis.Get(f.ctx, f.Keys.SlotsInflight()).Int(); n != 0 {
		t.Fatalf("pool counter %d after the pass, want 0", n)
	}
	if res, err := p.runOnce(f.ctx); err != nil || res.Corrected != 0 {
		t.Fatalf("a second run %+v, %v", res, err)
	}
}

// A pass runs only while its elector leads: not before the elector took the lock, at
// once when it does, on its interval while it leads, and no more once it stopped.
func TestPassesRunOnlyWhileLeading(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	e := NewElector(f.Deps, ElectorConfig{Interval: 20 * time.Millisecond})
	e.TestSignals.Init(t)
	p := NewSlotCounter(f.Deps, e, SlotCounterConfig{Interval: 30 * time.Millisecond})
	p.TestSignals.Init(t)
	if err := p.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	time.Sleep(100 * time.Millisecond)
	p.TestSignals.Ran.RequireEmpty() // no leader yet

	f.Redis.Set(f.ctx, f.Keys.SlotsInflight(), 3, time.Hour)
	if err := e.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	e.TestSignals.Elected.WaitOrTimeout()
	if res := p.TestSignals.Ran.WaitOrTimeout(); res.Corrected != -3 {
		t.Fatalf("the first run as leader: %+v", res)
	}
	p.TestSignals.Ran.WaitOrTimeout() // and again on its interval

	e.Stop()
	e.TestSignals.Resigned.WaitOrTimeout()
	time.Sleep(50 * time.Millisecond) // a run that had begun ends
	for len(p.TestSignals.Ran.WaitC()) > 0 {
		<-p.TestSignals.Ran.WaitC()
	}
	time.Sleep(150 * time.Millisecond)
	p.TestSignals.Ran.RequireEmpty()
}

// A run that corrected something is recorded for the operator view; one that found
// nothing is not.
func TestCorrectionsAreRecorded(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	st := store.New(f.Pool)
	f.Corrections = st
	p := NewSlotCounter(f.Deps, NewElector(f.Deps, ElectorConfig{}), SlotCounterConfig{})
	f.Redis.Set(f.ctx, f.Keys.SlotsInflight(), 4, time.Hour)
	if _, err := p.runOnce(f.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.runOnce(f.ctx); err != nil { // nothing to fix: no record
		t.Fatal(err)
	}
	runs, totals, err := st.UnscopedJanitorRuns(f.ctx, time.Now().Add(-time.Hour), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || runs[0].Pass != passSlots || runs[0].Corrections["pool"] != -4 {
		t.Fatalf("runs %+v, want one pool run that corrected -4", runs)
	}
	if totals["pool"] != -4 {
		t.Fatalf("totals %v", totals)
	}
}
