package e2e_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/quotas"
)

// A tenant may lower a budget field, never switch it off (0 or negative) nor raise it
// past the plan's ceiling; omitted fields take the plan's default, and the stored
// budget always has every field set.
func TestBudgetFieldsCannotBeSwitchedOffOrRaised(t *testing.T) {
	t.Parallel()
	h := start(t, apiOnly)
	key := h.tenantWith("bud", "pro", nil, nil)
	refused := []struct {
		budget string
		field  string
	}{
		{`{"max_cost_usd":0}`, "max_cost_usd"},
		{`{"max_cost_usd":-1}`, "max_cost_usd"},
		{`{"max_cost_usd":1.5}`, "max_cost_usd"}, // pro ceiling $1
		{`{"max_steps":0}`, "max_steps"},
		{`{"max_steps":-3}`, "max_steps"},
		{`{"max_steps":21}`, "max_steps"}, // pro ceiling 20
		{`{"max_wallclock_s":0}`, "max_wallclock_s"},
		{`{"max_wallclock_s":-1}`, "max_wallclock_s"},
		{`{"max_wallclock_s":301}`, "max_wallclock_s"}, // pro ceiling 5 min
		{`{"max_steps":2,"max_cost_usd":0}`, "max_cost_usd"},
	}
	for _, tc := range refused {
		var e errBody
		st, _ := h.do("POST", "/v1/tasks", key, `{"agent":"sim","budget":`+tc.budget+`}`, &e)
		if st != 400 || e.Error.Code != "INVALID_REQUEST" || !strings.Contains(e.Error.Message, "budget."+tc.field) {
			t.Errorf("budget %s: %d %+v; want 400 INVALID_REQUEST naming budget.%s", tc.budget, st, e, tc.field)
		}
	}
	var e errBody
	h.do("POST", "/v1/tasks", key, `{"agent":"sim","budget":{"max_steps":21}}`, &e)
	if !strings.Contains(e.Error.Message, "20") {
		t.Errorf("over-ceiling message does not name the ceiling: %q", e.Error.Message)
	}

	accepted := []struct {
		budget string
		want   client.Budget
	}{
		{``, client.Budget{MaxSteps: 20, MaxWallclockS: 300, MaxCostUSD: 1}},
		{`{}`, client.Budget{MaxSteps: 20, MaxWallclockS: 300, MaxCostUSD: 1}},
		{`{"max_cost_usd":0.25}`, client.Budget{MaxSteps: 20, MaxWallclockS: 300, MaxCostUSD: 0.25}},
		{`{"max_steps":1,"max_wallclock_s":0.5}`, client.Budget{MaxSteps: 1, MaxWallclockS: 0.5, MaxCostUSD: 1}},
		{`{"max_steps":20,"max_wallclock_s":300,"max_cost_usd":1}`, client.Budget{MaxSteps: 20, MaxWallclockS: 300, MaxCostUSD: 1}},
	}
	for _, tc := range accepted {
		body := `{"agent":"sim"}`
		if tc.budget != "" {
			body = `{"agent":"sim","budget":` + tc.budget + `}`
		}
		var task client.Task
		if st, _ := h.do("POST", "/v1/tasks", key, body, &task); st != 202 {
			t.Fatalf("budget %s: %d", tc.budget, st)
		}
		got, err := h.app.Store().GetTask(context.Background(), storeParams(task.TenantID, task.ID))
		if err != nil {
			t.Fatal(err)
		}
		var stored client.Budget
		if err := json.Unmarshal(got.Budget, &stored); err != nil || stored != tc.want {
			t.Errorf("budget %s: stored %s, want %+v", tc.budget, got.Budget, tc.want)
		}
	}
}

// A task is long-running only when it asks for more than 5 minutes of wall clock: the
// enterprise default budget does not take a long_running_inflight lease.
func TestDefaultBudgetIsNotLongRunning(t *testing.T) {
	t.Parallel()
	h := start(t, apiOnly)
	key := h.tenantWith("ent", "enterprise", map[string]client.Limit{"long_running_inflight": 2}, nil)
	for i := range 5 {
		var task client.Task
		var e errBody
		st, _ := h.do("POST", "/v1/tasks", key, `{"agent":"sim"}`, &task)
		if st != 202 {
			h.do("POST", "/v1/tasks", key, `{"agent":"sim"}`, &e)
			t.Fatalf("default-budget task %d: %d %+v", i+1, st, e)
		}
		if task.Budget == nil || task.Budget.MaxWallclockS > 300 {
			t.Fatalf("default budget %+v is above 5 minutes", task.Budget)
		}
	}
	admitted := 0
	for i := range 3 {
		var e errBody
		st, _ := h.do("POST", "/v1/tasks", key, `{"agent":"sim","budget":{"max_wallclock_s":1200}}`, &e)
		switch st {
		case 202:
			admitted++
		case 429:
			if i < 2 {
				t.Fatalf("long task %d refused: %+v", i+1, e)
			}
		default:
			t.Fatalf("long task %d: %d %+v", i+1, st, e)
		}
	}
	if admitted != 2 {
		t.Fatalf("%d long-running tasks admitted with long_running_inflight 2", admitted)
	}
	u := h.usage(key)
	if u["long_running_inflight"]["used"] != 2.0 || u["concurrent_sessions"]["used"] != 7.0 {
		t.Fatalf("long_running_inflight used %v, sessions used %v; want 2 and 7", u["long_running_inflight"]["used"], u["concurrent_sessions"]["used"])
	}
}

// The runtime stops a task at its wall clock budget, the plan default included.
func TestDefaultWallclockBudgetStopsTheTask(t *testing.T) {
	t.Parallel()
	// The pro plan's default wall clock becomes 1 s, and every plan stops at its
	// limits; everything else as shipped.
	plans := shippedPlans(t)
	for n, p := range plans {
		p.OnLimit = quotas.OnLimits{Default: quotas.OnLimitStop}
		if n == "pro" {
			p.Budget.Default.MaxWallclockS = 1
		}
		plans[n] = p
	}
	file := plansFile(t, plans)
	h := start(t, func(o *agentq.Options) { o.Config.PlansFile = file })
	c, _ := h.tenantClient("wall", "pro", nil)
	began := time.Now()
	task := run(t, c, client.SubmitTaskRequest{Agent: "sim", Input: map[string]any{"steps": 1, "step_ms": 20000}})
	if task.State != "budget_exceeded" || !strings.Contains(deref(task.Error), "max_wallclock_s 1") {
		t.Fatalf("%s %q; want budget_exceeded naming max_wallclock_s 1", task.State, deref(task.Error))
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Fatalf("a 1 s budget took %v to stop the task", took)
	}
}
