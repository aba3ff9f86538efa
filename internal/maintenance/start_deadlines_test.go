package maintenance

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/testenv/testfactory"
)

// overdue dates the task's start deadline a second ago.
func (f *fixture) overdue(id uuid.UUID) {
	f.t.Helper()
	testfactory.TaskStartOverdue(f.t, f.Pool, id)
}

func (f *fixture) leased(tenant string, id uuid.UUID) bool {
	f.t.Helper()
	sessions, _, err := f.q.LeaseMembers(f.ctx, []string{tenant})
	if err != nil {
		f.t.Fatal(err)
	}
	return slices.Contains(sessions[0], id.String())
}

// A queued task past its start deadline expires at the pass's next run, with no
// worker involved: its lease goes back, it leaves its queue, its watchers hear of it,
// and nothing is charged. A task within its deadline, one without, and one that
// started already are left alone.
func TestStartDeadlinesExpireOverdueTasks(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("m")
	due, timely, none, started := f.submit("m"), f.submit("m"), f.submit("m"), f.submit("m")
	f.overdue(due)
	testfactory.TaskStartDeadlineIn(t, f.Pool, timely, time.Hour)
	f.overdue(started)
	testfactory.TaskStartedAgo(t, f.Pool, started, time.Minute) // parked since
	sub := f.Redis.Subscribe(f.ctx, f.Keys.TaskEvents(due.String()))
	defer sub.Close()
	if _, err := sub.Receive(f.ctx); err != nil {
		t.Fatal(err)
	}

	p := NewStartDeadlines(f.Deps, NewElector(f.Deps, ElectorConfig{}), StartDeadlinesConfig{})
	res, err := p.runOnce(f.ctx)
	if err != nil || res.Expired != 1 || !res.Stats.Done {
		t.Fatalf("run: %+v %v", res, err)
	}
	if st := f.state(due); st != string(agentqtype.TaskStateExpired) {
		t.Fatalf("the overdue task is %s", st)
	}
	var steps int
	var cost int64
	if err := f.Pool.QueryRow(f.ctx, `SELECT steps, cost_micro_usd FROM tasks WHERE id = $1`, due).Scan(&steps, &cost); err != nil ||
		steps != 0 || cost != 0 {
		t.Fatalf("charged %d steps, %d micro-USD (%v)", steps, cost, err)
	}
	if f.queued("m", due) || f.leased("m", due) {
		t.Fatalf("still queued %v, still leased %v", f.queued("m", due), f.leased("m", due))
	}
	select {
	case m := <-sub.Channel():
		var ev struct{ Type, State, Error string }
		if err := json.Unmarshal([]byte(m.Payload), &ev); err != nil || ev.Type != "state" || ev.State != "expired" || ev.Error == "" {
			t.Fatalf("message %s (%v)", m.Payload, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no state message")
	}
	for _, id := range []uuid.UUID{timely, none, started} {
		if st := f.state(id); st != string(agentqtype.TaskStateQueued) || !f.queued("m", id) || !f.leased("m", id) {
			t.Errorf("task %s: %s, queued %v, leased %v", id, st, f.queued("m", id), f.leased("m", id))
		}
	}
	if res, err := p.runOnce(f.ctx); err != nil || res.Expired != 0 {
		t.Fatalf("second run: %+v %v", res, err)
	}
}

// Passes of several replicas at once (a leader change) expire each task once: each
// end is one conditional update, and only its winner releases and removes.
func TestStartDeadlinesConcurrentPassesExpireOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("m")
	var ids []uuid.UUID
	for range 6 {
		id := f.submit("m")
		f.overdue(id)
		ids = append(ids, id)
	}
	passes := make([]*StartDeadlines, 3)
	for i := range passes {
		passes[i] = NewStartDeadlines(f.Deps, NewElector(f.Deps, ElectorConfig{}), StartDeadlinesConfig{Limit: 2})
	}
	total := make(chan int, 100)
	done := make(chan struct{})
	for _, p := range passes {
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				res, err := p.runOnce(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				total <- res.Expired
				if res.Expired == 0 {
					return
				}
			}
		}()
	}
	for range passes {
		<-done
	}
	close(total)
	n := 0
	for v := range total {
		n += v
	}
	if n != len(ids) {
		t.Fatalf("the passes expired %d tasks, want %d", n, len(ids))
	}
	for _, id := range ids {
		if f.state(id) != string(agentqtype.TaskStateExpired) || f.queued("m", id) || f.leased("m", id) {
			t.Errorf("task %s: %s", id, f.state(id))
		}
	}
}

// The pass runs on the janitor's leader on its own short interval.
func TestStartDeadlinesRunWhileLeading(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("m")
	e := NewElector(f.Deps, ElectorConfig{})
	p := NewStartDeadlines(f.Deps, e, StartDeadlinesConfig{Interval: 20 * time.Millisecond})
	p.TestSignals.Init(t)
	if err := e.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	if err := p.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	p.TestSignals.Ran.WaitOrTimeout()
	id := f.submit("m")
	f.overdue(id)
	for f.state(id) != string(agentqtype.TaskStateExpired) {
		p.TestSignals.Ran.WaitOrTimeout()
		if t.Failed() {
			t.FailNow()
		}
	}
}
