package maintenance

import (
	"slices"
	"testing"

	"github.com/agentq/agentq/internal/testenv"
)

// After Redis lost everything, the re-push pass brings the queued backlog back in
// admission order, a batch per run from its cursor.
func TestRepushPushesBackInAdmissionOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("o")
	var ids []string
	for range 6 {
		ids = append(ids, f.submit("o").String())
	}
	testenv.DeletePrefix(f.ctx, f.Redis, f.Keys.Prefix())
	p := NewRepush(f.Deps, NewElector(f.Deps, ElectorConfig{}), RepushConfig{Batch: 4})
	res, err := p.runOnce(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Repushed != 4 || res.Stats.Done || res.Stats.Cursor != ids[3] {
		t.Fatalf("first run %+v, want 4 re-pushed and a cursor at the fourth task", res)
	}
	if res, err = p.runOnce(f.ctx); err != nil || res.Repushed != 2 || !res.Stats.Done || res.Stats.Cursor != "" {
		t.Fatalf("second run %+v, %v; want the last 2 re-pushed and the walk done", res, err)
	}
	got, _ := f.Redis.ZRange(f.ctx, f.Keys.TenantQueue("o"), 0, -1).Result()
	if !slices.Equal(got, ids) {
		t.Fatalf("queue after the re-push %v, want admission order %v", got, ids)
	}
	if res, err = p.runOnce(f.ctx); err != nil || res.Repushed != 0 {
		t.Fatalf("a third run %+v, %v; want nothing to push", res, err)
	}
}
