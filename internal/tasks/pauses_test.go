package tasks_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/testenv/testfactory"
	"github.com/agentq/agentq/quotas"
)

// pausedTask stores a task of tenant paused at limitType, whose limit and use at the
// pause were limit and used, paused age ago.
func (e env) pausedTask(t *testing.T, tenant, limitType string, limit, used int64, age time.Duration) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	id := uuid.Must(uuid.NewV7())
	if _, _, err := e.st.InsertTask(ctx, store.InsertTaskParams{ID: id, TenantID: tenant, Kid: "k1", Agent: "sim",
		Input: json.RawMessage(`{}`), Budget: json.RawMessage(`{"max_steps":20,"max_wallclock_s":300,"max_cost_usd":1}`),
		RequestHash: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	running, _, err := e.st.UnscopedStartTask(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.UnscopedPauseTask(ctx, store.UnscopedPauseTaskParams{Claim: store.Claim{ID: id, Attempt: running.Attempt},
		Reason: limitType, Limit: limit, Used: used}); err != nil {
		t.Fatal(err)
	}
	testfactory.TaskPausedAgo(t, e.st.Pool(), id, age, 24*time.Hour)
	return id
}

func (e env) state(t *testing.T, tenant string, id uuid.UUID) store.Task {
	t.Helper()
	got, err := e.st.GetTask(context.Background(), store.GetTaskParams{TenantID: tenant, ID: id})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// The pause sweep resumes a task paused by a period quota once that quota's use fell
// since the pause (the daily window moved on, a new billing period began) and there
// is room; a quota still where it was keeps its task paused, and so does a task's own
// budget, which waits for a person. A pause past the plan's pause timeout (24 h on
// pro) ends budget_exceeded. The resumed task is queued with its session taken and
// the pause's time added to waited_ms.
func TestSweepPausesResumesWhenTheQuotaAllowsAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, "acme")
	// Nothing of the tenant's is in Redis: its daily steps and monthly use read 0.
	fell := e.pausedTask(t, "acme", quotas.AgentStepsDaily, 500, 500, time.Minute)
	newPeriod := e.pausedTask(t, "acme", quotas.USDMonthly, 50_000_000, 50_000_000, time.Minute)
	// The tokens quota is where the pause left it: 0 used of 0, nothing changed.
	unchanged := e.pausedTask(t, "acme", quotas.AITokensMonthly, 20_000_000, 0, time.Minute)
	budget := e.pausedTask(t, "acme", quotas.TaskMaxSteps, 20, 20, time.Minute)
	old := e.pausedTask(t, "acme", quotas.TaskMaxCostUSD, 1_000_000, 1_000_000, 25*time.Hour)

	marks := tasks.NewPauseMarks()
	res, err := e.svc.SweepPauses(ctx, marks)
	if err != nil || res.Resumed != 2 || res.Expired != 1 {
		t.Fatalf("sweep: %+v %v, want 2 resumed and 1 expired", res, err)
	}
	for _, id := range []uuid.UUID{fell, newPeriod} {
		got := e.state(t, "acme", id)
		if got.State != agentqtype.TaskStateQueued || got.Pause.Reason != nil || got.WaitedMs < 59_000 || got.Pause.Count != 1 {
			t.Fatalf("resumed task: %s, pause %+v, waited %d ms", got.State, got.Pause, got.WaitedMs)
		}
	}
	for _, id := range []uuid.UUID{unchanged, budget} {
		if got := e.state(t, "acme", id); got.State != agentqtype.TaskStatePaused {
			t.Fatalf("a pause nothing lifted is %s", got.State)
		}
	}
	if got := e.state(t, "acme", old); got.State != agentqtype.TaskStateBudgetExceeded {
		t.Fatalf("a pause past its timeout is %s", got.State)
	}
	sessions, _, err := e.deps.Admission.Quotas().Leases(ctx, "acme")
	if err != nil || len(sessions) != 2 {
		t.Fatalf("sessions after the resumes: %v %v, want the 2 resumed tasks'", sessions, err)
	}
	if res, err := e.svc.SweepPauses(ctx, marks); err != nil || res != (tasks.PauseSweep{}) {
		t.Fatalf("a second sweep: %+v %v, want nothing done", res, err)
	}
}

// The sweep looks at a tenant's quota pauses again only when something that could
// lift the quota changed since it last looked (here: an admin's change of the
// tenant); until then a pause stays as it is, whatever the sweeps in between.
func TestSweepPausesLooksAgainOnlyWhenTheTenantChanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, "acme")
	id := e.pausedTask(t, "acme", quotas.AITokensMonthly, 20_000_000, 0, time.Minute)
	marks := tasks.NewPauseMarks()
	if res, err := e.svc.SweepPauses(ctx, marks); err != nil || res != (tasks.PauseSweep{}) {
		t.Fatalf("first sweep: %+v %v, want nothing done", res, err)
	}
	// Behind the sweep's back the pause now reads as lifted (its use at the pause
	// above today's); no mark of the tenant's changed, so the sweep does not look.
	testfactory.TaskPauseUsed(t, e.st.Pool(), id, 5)
	if res, err := e.svc.SweepPauses(ctx, marks); err != nil || res.Resumed != 0 {
		t.Fatalf("a sweep with nothing changed: %+v %v, want no resume", res, err)
	}
	if _, err := e.st.UpdateTenant(ctx, store.UpdateTenantParams{ID: "acme", Overrides: map[string]quotas.Limit{quotas.AITokensMonthly: 30_000_000}}); err != nil {
		t.Fatal(err)
	}
	if res, err := e.svc.SweepPauses(ctx, marks); err != nil || res.Resumed != 1 {
		t.Fatalf("a sweep after the tenant changed: %+v %v, want the task resumed", res, err)
	}
	if got := e.state(t, "acme", id); got.State != agentqtype.TaskStateQueued {
		t.Fatalf("the task is %s, want queued", got.State)
	}
}
