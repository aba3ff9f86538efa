package tasks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/tasks/change"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
)

type crossEnv struct {
	st   *store.Store
	lc   *tasks.Lifecycle
	fail bool // the step's transaction fails after the crossings were written
}

// crossSetup writes tenant with overrides and a lifecycle that writes the crossings of
// every recorded step, as the library wires it.
func crossSetup(t *testing.T, tenant string, ov map[string]quotas.Limit) *crossEnv {
	t.Helper()
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	e := &crossEnv{st: store.New(testenv.Postgres(t))}
	if _, err := e.st.CreateTenant(context.Background(), store.CreateTenantParams{ID: tenant, Name: tenant, Plan: "pro", Overrides: ov}); err != nil {
		t.Fatal(err)
	}
	e.lc = tasks.NewLifecycle(e.st, tasks.LifecycleOptions{Subscribers: []tasks.Subscriber{
		&outbox.Subscriber{Store: e.st, Crossings: outbox.Crossings{Limits: func(t store.Tenant) (quotas.Limits, error) {
			p, err := tenants.PolicyOf(plans, t)
			return p.Limits, err
		}}},
		change.Funcs{Tx: func(_ context.Context, _ *store.Store, c tasks.Change) error {
			if e.fail && c.Kind == tasks.ChangeStep {
				return errHook
			}
			return nil
		}},
	}})
	return e
}

// start creates a task of tenant and starts it.
func (e *crossEnv) start(t *testing.T, tenant string) store.Task {
	t.Helper()
	ctx := context.Background()
	id := uuid.Must(uuid.NewV7())
	if _, _, err := e.lc.Create(ctx, store.InsertTaskParams{ID: id, TenantID: tenant, Kid: "k", Agent: "sim",
		Input: json.RawMessage(`{}`), Budget: json.RawMessage(`{}`), RequestHash: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	task, out, err := e.lc.Start(ctx, id)
	if err != nil || out != tasks.Started {
		t.Fatalf("start: %v %v", out, err)
	}
	return task
}

func (e *crossEnv) step(task store.Task, n int, tokens, micro int64) error {
	return e.lc.RecordStep(context.Background(), store.RecordStepParams{ID: task.ID, Attempt: task.Attempt, Step: n, Tokens: tokens, CostMicro: micro})
}

// crossing is a written event, read straight from the table (not through the feed,
// which waits for other tests' transactions).
type crossing struct {
	Type      string
	LimitType string
	Threshold int
	Usage     string // current_usage as JSON
	Key       string
}

func (e *crossEnv) crossings(t *testing.T, tenant string) []crossing {
	t.Helper()
	rows, err := e.st.Pool().Query(context.Background(), `SELECT type, dedupe_key, payload FROM events WHERE tenant_id = $1 ORDER BY seq`, tenant)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []crossing
	for rows.Next() {
		var c crossing
		var payload []byte
		if err := rows.Scan(&c.Type, &c.Key, &payload); err != nil {
			t.Fatal(err)
		}
		var ev struct {
			Data struct {
				LimitType    string          `json:"limit_type"`
				Threshold    int             `json:"threshold"`
				CurrentUsage json.RawMessage `json:"current_usage"`
			} `json:"data"`
		}
		if err := json.Unmarshal(payload, &ev); err != nil {
			t.Fatal(err)
		}
		c.LimitType, c.Threshold, c.Usage = ev.Data.LimitType, ev.Data.Threshold, string(ev.Data.CurrentUsage)
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].LimitType != out[j].LimitType {
			return out[i].LimitType < out[j].LimitType
		}
		return out[i].Threshold < out[j].Threshold
	})
	return out
}

func summary(cs []crossing) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = fmt.Sprintf("%s %s %d @%s", c.Type, c.LimitType, c.Threshold, c.Usage)
	}
	return out
}

func sameStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Each period quota's 80, 90 and 100 % are written exactly once, by the step that
// reaches them, with the usage it reached: one step may cross several; a retried step
// and the steps past 100 % write nothing more.
func TestStepCrossingsExactlyOnce(t *testing.T) {
	t.Parallel()
	e := crossSetup(t, "acme", map[string]quotas.Limit{
		quotas.AgentStepsDaily: quotas.Limit(10), quotas.AITokensMonthly: quotas.Limit(1000), quotas.USDMonthly: quotas.Limit(0.01),
	})
	task := e.start(t, "acme")
	// tokens: 50, 900 (950: 80 and 90 at once), 0, 50 (1000: 100), then more.
	// cost: 7999 (just below 80 % of 10000), 1 (8000: 80), 0, 0, 1999 (9999: 90), 1
	// (10000: 100), then more. Steps: the 8th, 9th and 10th of a limit of 10.
	steps := []struct{ tokens, micro int64 }{
		{50, 7999}, {900, 1}, {0, 0}, {50, 0}, {0, 1999}, {0, 1}, {10, 10}, {10, 10}, {10, 10}, {10, 10}, {10, 10}, {10, 10},
	}
	for i, s := range steps {
		if err := e.step(task, i+1, s.tokens, s.micro); err != nil {
			t.Fatalf("step %d: %v", i+1, err)
		}
		// The worker's retry of a step whose commit lost its reply: nothing twice.
		if err := e.step(task, i+1, s.tokens, s.micro); err != nil {
			t.Fatalf("retry of step %d: %v", i+1, err)
		}
	}
	want := []string{
		`usage.approaching_limit agent_steps_daily 80 @8`,
		`usage.approaching_limit agent_steps_daily 90 @9`,
		`usage.limit_hit agent_steps_daily 100 @10`,
		`usage.approaching_limit ai_tokens_monthly 80 @950`,
		`usage.approaching_limit ai_tokens_monthly 90 @950`,
		`usage.limit_hit ai_tokens_monthly 100 @1000`,
		`usage.approaching_limit usd_monthly 80 @"0.008000"`,
		`usage.approaching_limit usd_monthly 90 @"0.009999"`,
		`usage.limit_hit usd_monthly 100 @"0.010000"`,
	}
	if got := summary(e.crossings(t, "acme")); !sameStrings(got, want) {
		t.Fatalf("events:\n%v\nwant:\n%v", got, want)
	}
	// The rollups counted each step once.
	r, err := e.st.UnscopedTenantRollups(context.Background(), "acme")
	if err != nil || len(r.Periods) != 1 || r.Periods[0].Steps != int64(len(steps)) || r.Periods[0].Tokens != 1060 || r.Periods[0].CostMicro != 10060 {
		t.Fatalf("period rollups %+v %v", r.Periods, err)
	}
}

// crossingsOf40Steps are the events of 40 steps of 10 tokens each, under a daily
// limit of 40 steps and a monthly one of 400 tokens.
var crossingsOf40Steps = []string{
	`usage.approaching_limit agent_steps_daily 80 @32`,
	`usage.approaching_limit agent_steps_daily 90 @36`,
	`usage.limit_hit agent_steps_daily 100 @40`,
	`usage.approaching_limit ai_tokens_monthly 80 @320`,
	`usage.approaching_limit ai_tokens_monthly 90 @360`,
	`usage.limit_hit ai_tokens_monthly 100 @400`,
}

// Steps of one tenant recorded at once, by many tasks, cross each threshold once, each
// at exactly its value: every step sees the totals of the ones before it.
func TestConcurrentStepsCrossOnce(t *testing.T) {
	t.Parallel()
	e := crossSetup(t, "acme", map[string]quotas.Limit{quotas.AgentStepsDaily: quotas.Limit(40), quotas.AITokensMonthly: quotas.Limit(400)})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		task := e.start(t, "acme")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 1; n <= 6; n++ {
				if err := e.step(task, n, 10, 0); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got, want := summary(e.crossings(t, "acme")), crossingsOf40Steps; !sameStrings(got, want) {
		t.Fatalf("events:\n%v\nwant:\n%v", got, want)
	}
}

// A step whose transaction rolls back leaves no event, no ledger row and no rollup;
// the same step recorded again then crosses, once.
func TestRolledBackStepEmitsNothing(t *testing.T) {
	t.Parallel()
	e := crossSetup(t, "acme", map[string]quotas.Limit{quotas.AITokensMonthly: quotas.Limit(100)})
	ctx := context.Background()
	task := e.start(t, "acme")
	e.fail = true
	if err := e.step(task, 1, 100, 5); err == nil {
		t.Fatal("the failing step committed")
	}
	var ledger, rollups, events int
	if err := e.st.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM usage_ledger), (SELECT count(*) FROM usage_rollup_period) +
		(SELECT count(*) FROM usage_rollup_daily) + (SELECT count(*) FROM usage_rollup_hourly), (SELECT count(*) FROM events)`).
		Scan(&ledger, &rollups, &events); err != nil {
		t.Fatal(err)
	}
	if ledger != 0 || rollups != 0 || events != 0 {
		t.Fatalf("after a rolled-back step: %d ledger rows, %d rollup rows, %d events; want none", ledger, rollups, events)
	}
	e.fail = false
	if err := e.step(task, 1, 100, 5); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`usage.approaching_limit ai_tokens_monthly 80 @100`,
		`usage.approaching_limit ai_tokens_monthly 90 @100`,
		`usage.limit_hit ai_tokens_monthly 100 @100`,
	}
	if got := summary(e.crossings(t, "acme")); !sameStrings(got, want) {
		t.Fatalf("events:\n%v\nwant:\n%v", got, want)
	}
}

// Last steps completing at once share transactions (group commit): each is recorded
// and ends its task exactly once, the rollups hold every step, and each threshold is
// still crossed by exactly one step, with the usage it reached.
func TestConcurrentLastStepsCrossOnce(t *testing.T) {
	t.Parallel()
	e := crossSetup(t, "acme", map[string]quotas.Limit{quotas.AgentStepsDaily: quotas.Limit(40), quotas.AITokensMonthly: quotas.Limit(400)})
	ctx := context.Background()
	var started []store.Task
	for range 40 {
		started = append(started, e.start(t, "acme"))
	}
	var wg sync.WaitGroup
	var won atomic.Int64
	errs := make(chan error, len(started))
	for _, task := range started {
		wg.Go(func() {
			ok, err := e.lc.RecordLastStep(ctx, store.RecordStepParams{ID: task.ID, Attempt: task.Attempt, Step: 1, Tokens: 10},
				tasks.FinishParams{Claim: store.Claim{ID: task.ID, Attempt: task.Attempt}, To: agentqtype.TaskStateCompleted, Output: json.RawMessage(`{"n":1}`)})
			if err != nil {
				errs <- err
			}
			if ok {
				won.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if won.Load() != 40 {
		t.Fatalf("%d of 40 last steps won their end", won.Load())
	}
	for _, task := range started {
		got, err := e.st.GetTask(ctx, store.GetTaskParams{TenantID: "acme", ID: task.ID})
		if err != nil || got.State != agentqtype.TaskStateCompleted || got.Usage.Steps != 1 || got.Usage.Tokens != 10 || string(got.Output) != `{"n": 1}` {
			t.Fatalf("task after its last step: %+v %v", got, err)
		}
	}
	var steps, tokens, ledger int64
	if err := e.st.Pool().QueryRow(ctx, `SELECT steps, tokens FROM usage_rollup_period WHERE tenant_id = 'acme'`).Scan(&steps, &tokens); err != nil || steps != 40 || tokens != 400 {
		t.Fatalf("period rollup: %d steps, %d tokens, %v; want 40, 400", steps, tokens, err)
	}
	if err := e.st.Pool().QueryRow(ctx, `SELECT count(*) FROM usage_ledger WHERE tenant_id = 'acme'`).Scan(&ledger); err != nil || ledger != 120 {
		t.Fatalf("ledger rows: %d %v; want 120", ledger, err)
	}
	if got, want := summary(e.crossings(t, "acme")), crossingsOf40Steps; !sameStrings(got, want) {
		t.Fatalf("events:\n%v\nwant:\n%v", got, want)
	}
	// A retry of any of them changes nothing and wins nothing.
	task := started[7]
	if ok, err := e.lc.RecordLastStep(ctx, store.RecordStepParams{ID: task.ID, Attempt: task.Attempt, Step: 1, Tokens: 10},
		tasks.FinishParams{Claim: store.Claim{ID: task.ID, Attempt: task.Attempt}, To: agentqtype.TaskStateCompleted}); ok || err != nil {
		t.Fatalf("a retried last step: ok %v, %v; want false, nil", ok, err)
	}
}
