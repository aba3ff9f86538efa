package maintenance

import (
	"bytes"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/riverqueue/river/rivershared/startstop"

	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/testenv"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) line(with string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range strings.Split(s.b.String(), "\n") {
		if strings.Contains(l, with) {
			return l
		}
	}
	return ""
}

// A missing marker is a first start on an empty database (logged at info) and a data
// loss once Postgres holds tasks (a warning). Either way every pass runs from the
// first tenant and task until all reached their end.
func TestGenerationCheckRepairsAfterDataLoss(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var logs syncBuffer
	f.Archetype = &baseservice.Archetype{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	f.tenant("g1")
	f.tenant("g2")
	j := NewJanitor(f.Deps, JanitorConfig{})
	g := j.generation

	res, err := g.runOnce(f.ctx)
	if err != nil || res.Generation != GenerationFirst || res.Repair == nil || !res.Repair.complete() {
		t.Fatalf("first check: %+v, %v; want a first start, repaired", res, err)
	}
	if l := logs.line("generation marker written"); !strings.Contains(l, "level=INFO") || !strings.Contains(l, "first start") {
		t.Fatalf("first start logged as %q", l)
	}
	if res, err := g.runOnce(f.ctx); err != nil || res.Generation != GenerationSame || res.Repair != nil {
		t.Fatalf("second check: %+v, %v; want the marker found", res, err)
	}

	var ids []string
	for _, tenant := range []string{"g1", "g2", "g2"} {
		ids = append(ids, f.submit(tenant).String())
	}
	// Where earlier runs left off: a repair that kept the cursors would skip g1 and
	// every task.
	j.leases.cursor, j.running.cursor = "g1", "g1"
	j.repush.cursor = uuid.MustParse(ids[2])
	testenv.DeletePrefix(f.ctx, f.Redis, f.Keys.Prefix())
	res, err = g.runOnce(f.ctx)
	if err != nil || res.Generation != GenerationLost || res.Repair == nil {
		t.Fatalf("after the loss: %+v, %v; want a loss, repaired", res, err)
	}
	if rep := res.Repair; rep.Repushed != 3 || rep.LeasesAdded != 3 || rep.TenantsReviewed != 2 || !rep.complete() {
		t.Fatalf("repair report %+v, want 3 tasks re-pushed with their leases over both tenants", rep)
	}
	if l := logs.line("Redis lost its data"); !strings.Contains(l, "level=WARN") {
		t.Fatalf("data loss logged as %q", l)
	}
	got, _ := f.Redis.ZRange(f.ctx, f.Keys.TenantQueue("g2"), 0, -1).Result()
	if !slices.Equal(got, ids[1:]) {
		t.Fatalf("g2's queue %v, want %v", got, ids[1:])
	}
}

// After the repair of a loss, every pass runs once more FollowUpAfter later: what the
// first repair could not yet tell lost (a task asynq lost, stranded only 30 s after
// its dispatch) is repaired then, not at the passes' next interval. Once only.
func TestGenerationCheckFollowsUpALoss(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("f1")
	j := NewJanitor(f.Deps, JanitorConfig{Generation: GenerationCheckConfig{FollowUpAfter: 200 * time.Millisecond}})
	g := j.generation
	if res, err := g.runOnce(f.ctx); err != nil || res.Generation != GenerationFirst {
		t.Fatalf("first check: %+v, %v", res, err)
	}
	id := f.submit("f1").String()
	testenv.DeletePrefix(f.ctx, f.Redis, f.Keys.Prefix())
	if res, err := g.runOnce(f.ctx); err != nil || res.Generation != GenerationLost || res.Repair.Repushed != 1 {
		t.Fatalf("after the loss: %+v, %v; want the task re-pushed", res, err)
	}
	// lost again without the marker going: only a follow-up finds it
	f.Redis.Del(f.ctx, f.Keys.TenantQueue("f1"))
	if res, err := g.runOnce(f.ctx); err != nil || res.Repair != nil || res.FollowUp {
		t.Fatalf("check before the follow-up is due: %+v, %v; want nothing run", res, err)
	}
	time.Sleep(250 * time.Millisecond)
	res, err := g.runOnce(f.ctx)
	if err != nil || !res.FollowUp || res.Repair == nil || res.Repair.Repushed != 1 {
		t.Fatalf("follow-up: %+v, %v; want the task re-pushed", res, err)
	}
	if got, _ := f.Redis.ZRange(f.ctx, f.Keys.TenantQueue("f1"), 0, -1).Result(); !slices.Equal(got, []string{id}) {
		t.Fatalf("queue after the follow-up %v, want %v", got, id)
	}
	time.Sleep(250 * time.Millisecond)
	if res, err := g.runOnce(f.ctx); err != nil || res.FollowUp || res.Repair != nil {
		t.Fatalf("after the follow-up: %+v, %v; want nothing run", res, err)
	}
}

// Of two janitors on one deployment only the leader's passes run.
func TestJanitorPassesRunOnTheLeaderOnly(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	start := func() *Janitor {
		j := NewJanitor(f.Deps, JanitorConfig{Elector: ElectorConfig{Interval: 20 * time.Millisecond}})
		j.elector.TestSignals.Init(t)
		j.generation.TestSignals.Init(t)
		j.leases.TestSignals.Init(t)
		if err := startstop.StartAll(f.ctx, j.Services()...); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			s := j.Services()
			for i := len(s) - 1; i >= 0; i-- {
				s[i].Stop()
			}
		})
		return j
	}
	a, b := start(), start()
	leader, standby := a, b
	select {
	case <-a.elector.TestSignals.Elected.WaitC():
	case <-b.elector.TestSignals.Elected.WaitC():
		leader, standby = b, a
	case <-time.After(5 * time.Second):
		t.Fatal("no janitor took the lead")
	}
	if res := leader.generation.TestSignals.Checked.WaitOrTimeout(); res.Generation != GenerationFirst {
		t.Fatalf("the leader's first check: %+v", res)
	}
	leader.leases.TestSignals.Ran.WaitOrTimeout()
	time.Sleep(100 * time.Millisecond)
	standby.generation.TestSignals.Checked.RequireEmpty()
	standby.leases.TestSignals.Ran.RequireEmpty()
}
