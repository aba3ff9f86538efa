package maintenance

import (
	"testing"
	"time"
)

func newElector(t *testing.T, f *fixture) *Elector {
	t.Helper()
	e := NewElector(f.Deps, ElectorConfig{Interval: 20 * time.Millisecond})
	e.TestSignals.Init(t)
	if err := e.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	return e
}

// Of two electors on one deployment only one leads; when it stops, it unlocks and
// the other takes over; when the leader's database session dies (a crash, a Postgres
// restart), Postgres frees the lock with it and one of them leads again.
func TestElectorOneLeadsAndLeadershipMoves(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := newElector(t, f), newElector(t, f)
	first, second := a, b
	select {
	case <-a.TestSignals.Elected.WaitC():
	case <-b.TestSignals.Elected.WaitC():
		first, second = b, a
	case <-time.After(5 * time.Second):
		t.Fatal("no elector took the lead")
	}
	time.Sleep(100 * time.Millisecond) // several tries of the other
	if !first.Leader() || second.Leader() {
		t.Fatalf("leaders: first %v, second %v; want the first only", first.Leader(), second.Leader())
	}
	since, changed := first.Watch()
	if since.IsZero() {
		t.Fatal("the leader's Watch says it does not lead")
	}

	first.Stop()
	select {
	case <-changed:
	default:
		t.Fatal("stopping did not signal the change of leadership")
	}
	first.TestSignals.Resigned.WaitOrTimeout()
	second.TestSignals.Elected.WaitOrTimeout()
	if first.Leader() || !second.Leader() {
		t.Fatalf("after the leader stopped: first %v, second %v", first.Leader(), second.Leader())
	}

	// The new leader's session ends under it, as in a crash: no unlock is sent.
	var pid int
	if err := f.Pool.QueryRow(f.ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND ((classid::bigint << 32) | objid::bigint) = $1`, second.lockID).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	f.exec(`SELECT pg_terminate_backend($1)`, pid)
	second.TestSignals.Resigned.WaitOrTimeout()
	second.TestSignals.Elected.WaitOrTimeout() // the only one left takes it again
	if !second.Leader() {
		t.Fatal("the lock was not taken again after the leader's session died")
	}
}
