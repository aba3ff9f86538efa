package maintenance

import (
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/testenv/testfactory"
)

// child makes id a child of parent, as a spawn does.
func (f *fixture) child(parent, id uuid.UUID, index int) {
	f.t.Helper()
	testfactory.TaskChildOf(f.t, f.Pool, id, parent, index)
}

// A parent that ended while its children were live, its process gone before it
// cancelled them, leaves them running on: the repair cancels them (killed,
// parent_ended) with a cancel's effects (off their queue, lease released), and
// leaves the children of a live parent, and ended children, alone.
func TestTreeRepairCancelsOrphans(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("m")
	gone, live := f.submit("m"), f.submit("m")
	orphan, done, kept := f.submit("m"), f.submit("m"), f.submit("m")
	f.child(gone, orphan, 0)
	f.child(gone, done, 1)
	f.child(live, kept, 0)
	for _, id := range []uuid.UUID{gone, done} {
		testfactory.TaskEnded(t, f.Pool, id, string(agentqtype.TaskStateCompleted))
	}

	p := NewTreeRepair(f.Deps, NewElector(f.Deps, ElectorConfig{}), TreeRepairConfig{})
	res, err := p.runOnce(f.ctx)
	if err != nil || res.Cancelled != 1 || !res.Stats.Done {
		t.Fatalf("run: %+v %v", res, err)
	}
	var reason string
	if err := f.Pool.QueryRow(f.ctx, `SELECT error FROM tasks WHERE id = $1`, orphan).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if st := f.state(orphan); st != string(agentqtype.TaskStateKilled) || !strings.HasPrefix(reason, "parent_ended") {
		t.Fatalf("the orphan is %s: %q; want killed, parent_ended", st, reason)
	}
	if f.queued("m", orphan) || f.leased("m", orphan) {
		t.Fatalf("the orphan is still queued %v, leased %v", f.queued("m", orphan), f.leased("m", orphan))
	}
	if st := f.state(kept); st != string(agentqtype.TaskStateQueued) || !f.queued("m", kept) {
		t.Fatalf("the live parent's child is %s (queued in Redis %v)", st, f.queued("m", kept))
	}
	if res, err := p.runOnce(f.ctx); err != nil || res.Cancelled != 0 {
		t.Fatalf("a second run: %+v %v", res, err)
	}
}

// A spawned task holds no session of its own (its tree holds its root's): the lease
// pass re-adds a root's lost lease and never gives a live child one, which would
// count against its tenant's concurrent_sessions.
func TestLeasesGiveSpawnedTasksNoSession(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("lt")
	root, kid := f.submit("lt"), f.task("lt")
	f.child(root, kid, 0)
	if _, err := f.q.Release(f.ctx, nil, "lt", root.String()); err != nil { // Redis lost the root's lease
		t.Fatal(err)
	}
	p := NewLeases(f.Deps, NewElector(f.Deps, ElectorConfig{}), LeasesConfig{})
	res, err := p.runOnce(f.ctx)
	if err != nil || res.Added != 1 {
		t.Fatalf("run: %+v %v; want the root's lease re-added", res, err)
	}
	if !f.leased("lt", root) || f.leased("lt", kid) {
		t.Fatalf("leases: the root %v, its child %v; want the root's only", f.leased("lt", root), f.leased("lt", kid))
	}
}
