package tasks_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/tasks/change"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
)

type limitEnv struct {
	lc   *tasks.Lifecycle
	st   *store.Store
	fail bool
}

func limitSetup(t *testing.T) *limitEnv {
	t.Helper()
	e := &limitEnv{st: store.New(testenv.Postgres(t))}
	for _, id := range []string{"acme", "globex"} {
		if _, err := e.st.CreateTenant(context.Background(), store.CreateTenantParams{ID: id, Name: id, Plan: "pro"}); err != nil {
			t.Fatal(err)
		}
	}
	e.lc = tasks.NewLifecycle(e.st, tasks.LifecycleOptions{Subscribers: []tasks.Subscriber{
		&outbox.Subscriber{Store: e.st, Events: outbox.Events{UpgradeURL: "https://agentq.example/upgrade"}},
		change.Funcs{Tx: func(_ context.Context, _ *store.Store, c tasks.Change) error {
			if e.fail && c.Kind == tasks.ChangeFinished {
				return errHook
			}
			return nil
		}},
	}})
	return e
}

// run starts a task with budget, records steps of 1 token and 1000 micro-dollars each,
// and ends it as the worker does with errMsg in state to, naming the limit stop.
func (e *limitEnv) run(t *testing.T, tenant, budget string, steps int, to store.TaskState, errMsg string, stop *quotas.Stop) error {
	t.Helper()
	ctx := context.Background()
	id := uuid.Must(uuid.NewV7())
	if _, _, err := e.lc.Create(ctx, store.InsertTaskParams{ID: id, TenantID: tenant, Kid: "k", Agent: "sim",
		Input: json.RawMessage(`{}`), Budget: json.RawMessage(budget), RequestHash: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	task, out, err := e.lc.Start(ctx, id)
	if err != nil || out != tasks.Started {
		t.Fatalf("start: %v %v", out, err)
	}
	for s := 1; s <= steps; s++ {
		if err := e.lc.RecordStep(ctx, store.RecordStepParams{ID: id, Attempt: task.Attempt, Step: s, Tokens: 1, CostMicro: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = e.lc.Finish(ctx, tasks.FinishParams{Claim: claimOf(task), To: to, Error: errMsg, Stop: stop})
	return err
}

type storedEvent struct {
	Type, Tenant, Key string
	Payload           []byte
}

func (e *limitEnv) events(t *testing.T) []storedEvent {
	t.Helper()
	evs, err := e.st.UnscopedListEvents(context.Background(), store.ListEventsParams{})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]storedEvent, len(evs))
	for i, ev := range evs {
		out[i] = storedEvent{Type: ev.Type, Tenant: ev.TenantID, Key: ev.DedupeKey, Payload: ev.Payload}
	}
	return out
}

// eventually waits for the feed to show n events: it shows an event once every older
// transaction on the server has ended, and other tests share the server.
func (e *limitEnv) eventually(t *testing.T, n int) []storedEvent {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs := e.events(t)
		if len(evs) >= n || time.Now().After(deadline) {
			return evs
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type budgetEvent struct {
	Type    string           `json:"type"`
	Subject string           `json:"subject"`
	Data    outbox.LimitData `json:"data"`
}

func decodeEvent(t *testing.T, b []byte) (budgetEvent, map[string]any) {
	t.Helper()
	var ev budgetEvent
	var raw struct {
		Data map[string]any `json:"data"`
	}
	if err := json.Unmarshal(b, &ev); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	return ev, raw.Data
}

// A task ended budget_exceeded writes one usage.limit_hit, with its change, naming
// the budget field that ended it; other ends write none.
func TestBudgetExceededWritesLimitHit(t *testing.T) {
	t.Parallel()
	e := limitSetup(t)
	if err := e.run(t, "acme", `{"max_steps":2,"max_wallclock_s":60,"max_cost_usd":1}`, 2, agentqtype.TaskStateCompleted, "", nil); err != nil {
		t.Fatal(err)
	}
	if err := e.run(t, "acme", `{"max_steps":2,"max_wallclock_s":60,"max_cost_usd":1}`, 2,
		agentqtype.TaskStateBudgetExceeded, "budget exceeded: max_steps 2 reached", &quotas.Stop{LimitType: quotas.TaskMaxSteps, Limit: 2, Used: 2}); err != nil {
		t.Fatal(err)
	}
	e.eventually(t, 1)
	time.Sleep(100 * time.Millisecond)
	evs := e.events(t)
	if len(evs) != 1 {
		t.Fatalf("events %+v, want one limit_hit", evs)
	}
	ev, raw := decodeEvent(t, evs[0].Payload)
	d := ev.Data
	if evs[0].Type != outbox.TypeLimitHit || ev.Type != outbox.TypeLimitHit || ev.Subject != "acme" || evs[0].Tenant != "acme" ||
		d.TenantID != "acme" || d.Plan != "pro" || d.LimitType != outbox.LimitTaskMaxSteps ||
		d.LimitValue != (outbox.Amount{N: 2}) || d.CurrentUsage != (outbox.Amount{N: 2}) ||
		d.Enforcement != outbox.EnforcementStopped || d.SLAClassification != outbox.EnforcedLimit ||
		d.UpgradeURL != "https://agentq.example/upgrade" || d.Window == nil || d.Window.End.Sub(d.Window.Start) != time.Minute ||
		d.Period != nil {
		t.Fatalf("limit_hit %s", evs[0].Payload)
	}
	if want := outbox.WindowKey("acme", outbox.LimitTaskMaxSteps, d.Window.Start); evs[0].Key != want {
		t.Fatalf("dedupe key %q, want %q", evs[0].Key, want)
	}
	if _, ok := raw["window"]; !ok {
		t.Fatalf("limit_hit has no window: %s", evs[0].Payload)
	}
}

// Each budget field and a tenant quota name their own limit; the cost is a USD
// amount, and a quota's stop belongs to the quota's period.
func TestBudgetExceededLimitTypes(t *testing.T) {
	t.Parallel()
	e := limitSetup(t)
	budget := `{"max_steps":10,"max_wallclock_s":60,"max_cost_usd":0.002}`
	for msg, stop := range map[string]quotas.Stop{
		"budget exceeded: max_cost_usd 0.002 reached":                                 {LimitType: quotas.TaskMaxCostUSD, Limit: 2000, Used: 2000},
		"budget exceeded: max_wallclock_s 60 reached":                                 {LimitType: quotas.TaskMaxWallclock, Limit: 60, Used: 60},
		"budget exceeded: tenant agent_steps_daily limit of 2 reached (used 2)":       {LimitType: quotas.AgentStepsDaily, Limit: 2, Used: 2},
		"budget exceeded: tenant usd_monthly limit of $0.50 reached (used $0.500000)": {LimitType: quotas.USDMonthly, Limit: 500_000, Used: 500_000},
	} {
		if err := e.run(t, "globex", budget, 2, agentqtype.TaskStateBudgetExceeded, msg, &stop); err != nil {
			t.Fatal(err)
		}
	}
	evs := e.eventually(t, 4)
	got := map[string]outbox.LimitData{}
	for _, ev := range evs {
		d, _ := decodeEvent(t, ev.Payload)
		got[d.Data.LimitType] = d.Data
	}
	if d := got[outbox.LimitTaskMaxCostUSD]; d.LimitValue != (outbox.Amount{N: 2000, USD: true}) || d.CurrentUsage != (outbox.Amount{N: 2000, USD: true}) {
		t.Errorf("cost: %+v", d)
	}
	if d := got[outbox.LimitTaskMaxWallclock]; d.LimitValue != (outbox.Amount{N: 60}) || d.Window == nil {
		t.Errorf("wall clock: %+v", d)
	}
	if d := got["agent_steps_daily"]; d.LimitValue != (outbox.Amount{N: 2}) || d.CurrentUsage != (outbox.Amount{N: 2}) ||
		d.Period == nil || d.Threshold != 100 || d.Period.End.Sub(d.Period.Start) != 24*time.Hour {
		t.Errorf("daily steps: %+v", d)
	}
	if d := got["usd_monthly"]; d.LimitValue != (outbox.Amount{N: 500_000, USD: true}) || d.Period == nil || d.Enforcement != outbox.EnforcementStopped {
		t.Errorf("usd: %+v", d)
	}
	if len(evs) != 4 {
		t.Errorf("%d events, want 4", len(evs))
	}
}

// A budget end whose transaction rolls back leaves no event; two budget ends of the
// same tenant and field in one minute leave one.
func TestBudgetExceededLimitHitIsAtomicAndDeduplicated(t *testing.T) {
	t.Parallel()
	e := limitSetup(t)
	// Stay clear of a minute boundary, so both ends fall in one window.
	if s := time.Now().Second(); s > 50 {
		time.Sleep(time.Duration(61-s) * time.Second)
	}
	budget := `{"max_steps":1,"max_wallclock_s":60,"max_cost_usd":1}`
	steps1 := &quotas.Stop{LimitType: quotas.TaskMaxSteps, Limit: 1, Used: 1}
	e.fail = true
	if err := e.run(t, "acme", budget, 1, agentqtype.TaskStateBudgetExceeded, "budget exceeded: max_steps 1 reached", steps1); !errors.Is(err, errHook) {
		t.Fatalf("finish: %v, want the hook's error", err)
	}
	e.fail = false
	time.Sleep(200 * time.Millisecond)
	if evs := e.events(t); len(evs) != 0 {
		t.Fatalf("a rolled-back end left events %+v", evs)
	}
	for range 2 {
		if err := e.run(t, "acme", budget, 1, agentqtype.TaskStateBudgetExceeded, "budget exceeded: max_steps 1 reached", steps1); err != nil {
			t.Fatal(err)
		}
	}
	// Another tenant's end in the same minute is its own event.
	if err := e.run(t, "globex", budget, 1, agentqtype.TaskStateBudgetExceeded, "budget exceeded: max_steps 1 reached", steps1); err != nil {
		t.Fatal(err)
	}
	e.eventually(t, 2)
	time.Sleep(100 * time.Millisecond)
	if evs := e.events(t); len(evs) != 2 || evs[0].Tenant == evs[1].Tenant {
		t.Fatalf("events %+v, want one per tenant", evs)
	}
}
