package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/quotas"
)

func ptr[T any](v T) *T { return &v }

// The library's tenant operations refuse what the admin API refuses, with the same
// sentence, and write nothing.
func TestLibraryTenantsRefuseWhatTheAPIRefuses(t *testing.T) {
	t.Parallel()
	h := start(t, func(o *agentq.Options) { o.Config.Roles = []string{agentq.RoleAPI} })
	ctx := context.Background()
	if _, err := h.app.CreateTenant(ctx, agentq.NewTenant{ID: "acme", Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		method string
		path   string
		body   string
		lib    func() error
		field  string
	}{
		{"bad id", "POST", "/v1/admin/tenants", `{"id":"bad id!","plan":"pro"}`,
			func() error {
				_, err := h.app.CreateTenant(ctx, agentq.NewTenant{ID: "bad id!", Plan: "pro"})
				return err
			}, "id"},
		{"no plan", "POST", "/v1/admin/tenants", `{"id":"p0"}`,
			func() error { _, err := h.app.CreateTenant(ctx, agentq.NewTenant{ID: "p0"}); return err }, "plan"},
		{"unknown plan", "POST", "/v1/admin/tenants", `{"id":"p1","plan":"gold"}`,
			func() error { _, err := h.app.CreateTenant(ctx, agentq.NewTenant{ID: "p1", Plan: "gold"}); return err }, "plan"},
		{"weight 0", "POST", "/v1/admin/tenants", `{"id":"w1","plan":"pro","weight":0}`,
			func() error {
				_, err := h.app.CreateTenant(ctx, agentq.NewTenant{ID: "w1", Plan: "pro", Weight: ptr(0)})
				return err
			}, "weight"},
		{"key_rate unlimited alone", "POST", "/v1/admin/tenants", `{"id":"k1","plan":"pro","overrides":{"key_rate":"unlimited"}}`,
			func() error {
				_, err := h.app.CreateTenant(ctx, agentq.NewTenant{ID: "k1", Plan: "pro",
					Overrides: map[string]quotas.Limit{quotas.KeyRate: quotas.Unlimited}})
				return err
			}, "overrides"},
		{"update: bad status", "PATCH", "/v1/admin/tenants/acme", `{"status":"gone"}`,
			func() error {
				_, err := h.app.UpdateTenant(ctx, "acme", agentq.TenantUpdate{Status: ptr("gone")})
				return err
			}, "status"},
		{"key: control character in a scope", "POST", "/v1/admin/tenants/acme/keys", `{"scopes":{"agents":["si\u0001m"]}}`,
			func() error {
				_, err := h.app.CreateAPIKey(ctx, agentq.NewAPIKey{TenantID: "acme", Agents: []string{"si\x01m"}})
				return err
			}, "scopes"},
	} {
		var eb errBody
		st, _ := h.do(tc.method, tc.path, h.admin, tc.body, &eb)
		err := tc.lib()
		var inv *agentq.InvalidError
		if st != 400 || !errors.As(err, &inv) || inv.Message != eb.Error.Message || inv.Field != tc.field {
			t.Errorf("%s: API %d %q, library %v (%+v), want the API's 400 as an *InvalidError of field %s", tc.name, st, eb.Error.Message, err, inv, tc.field)
		}
	}
	ts, err := h.app.ListTenants(ctx)
	if err != nil || len(ts) != 1 || ts[0].ID != "acme" || ts[0].Status != "active" || ts[0].EffectiveWeight != 2 {
		t.Fatalf("tenants after the refusals: %+v %v", ts, err)
	}
	if _, err := h.app.CreateTenant(ctx, agentq.NewTenant{ID: "acme", Plan: "free"}); !errors.Is(err, agentq.ErrExists) {
		t.Errorf("creating acme twice: %v, want ErrExists", err)
	}
	if _, err := h.app.GetTenant(ctx, "ghost"); !errors.Is(err, agentq.ErrNotFound) {
		t.Errorf("GetTenant(ghost): %v, want ErrNotFound", err)
	}

	// A key the library made works on the HTTP API.
	k, err := h.app.CreateAPIKey(ctx, agentq.NewAPIKey{TenantID: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := h.do("GET", "/v1/tasks", k.Token, nil, nil); st != 200 {
		t.Errorf("GET /v1/tasks with the library's key: %d", st)
	}
	if _, err := h.app.CreateAPIKey(ctx, agentq.NewAPIKey{TenantID: "ghost"}); !errors.Is(err, agentq.ErrNotFound) {
		t.Errorf("a key for ghost: %v, want ErrNotFound", err)
	}
}

// The library's task operations refuse what POST /v1/tasks refuses, and a task it
// submits is the API's task.
func TestLibraryTasksRefuseWhatTheAPIRefuses(t *testing.T) {
	t.Parallel()
	h := start(t)
	ctx := context.Background()
	key := h.setupTenant("acme", "free", nil)
	for _, tc := range []struct {
		name  string
		body  string
		lib   agentq.NewTask
		field string
	}{
		{"no agent", `{"input":{}}`, agentq.NewTask{TenantID: "acme"}, "agent"},
		{"priority 10", `{"agent":"sim","input":{"steps":1},"priority":10}`,
			agentq.NewTask{TenantID: "acme", Agent: "sim", Input: json.RawMessage(`{"steps":1}`), Priority: ptr(10)}, "priority"},
		{"budget above the ceiling", `{"agent":"sim","input":{"steps":1},"budget":{"max_steps":100000000}}`,
			agentq.NewTask{TenantID: "acme", Agent: "sim", Input: json.RawMessage(`{"steps":1}`), Budget: &agentq.TaskBudget{MaxSteps: ptr(100000000)}}, "budget"},
		{"input the agent refuses", `{"agent":"sim","input":{"steps":0}}`,
			agentq.NewTask{TenantID: "acme", Agent: "sim", Input: json.RawMessage(`{"steps":0}`)}, "input"},
		{"negative start deadline", `{"agent":"sim","input":{"steps":1},"start_within_s":-1}`,
			agentq.NewTask{TenantID: "acme", Agent: "sim", Input: json.RawMessage(`{"steps":1}`), StartWithin: -time.Second}, "start_within_s"},
		{"start deadline beyond a week", `{"agent":"sim","input":{"steps":1},"start_within_s":604801}`,
			agentq.NewTask{TenantID: "acme", Agent: "sim", Input: json.RawMessage(`{"steps":1}`), StartWithin: 7*24*time.Hour + time.Second}, "start_within_s"},
	} {
		var eb errBody
		st, _ := h.do("POST", "/v1/tasks", key, tc.body, &eb)
		_, err := h.app.SubmitTask(ctx, tc.lib)
		var inv *agentq.InvalidError
		if st != 400 || !errors.As(err, &inv) || inv.Message != eb.Error.Message || inv.Field != tc.field {
			t.Errorf("%s: API %d %q, library %v, want the API's 400 as an *InvalidError of field %s", tc.name, st, eb.Error.Message, err, tc.field)
		}
	}
	var unknown *agentq.UnknownAgentError
	if _, err := h.app.SubmitTask(ctx, agentq.NewTask{TenantID: "acme", Agent: "nope"}); !errors.As(err, &unknown) {
		t.Errorf("unknown agent: %v", err)
	}
	if _, err := h.app.SubmitTask(ctx, agentq.NewTask{TenantID: "ghost", Agent: "sim"}); !errors.Is(err, agentq.ErrNotFound) {
		t.Errorf("a task of ghost: %v, want ErrNotFound", err)
	}
	var inv *agentq.InvalidError
	if _, err := h.app.SubmitTask(ctx, agentq.NewTask{Agent: "sim"}); !errors.As(err, &inv) || inv.Field != "tenant" {
		t.Errorf("a task of no tenant: %v, want an *InvalidError", err)
	}
	if _, err := h.app.ListTasks(ctx, agentq.TaskQuery{TenantID: "acme", State: "done"}); !errors.As(err, &inv) || inv.Field != "state" {
		t.Errorf("listing an unknown state: %v", err)
	}

	// Submitted through the library, run by the workers, read through the API.
	task, err := h.app.SubmitTask(ctx, agentq.NewTask{TenantID: "acme", Agent: "sim", User: "u1",
		Input: json.RawMessage(`{"steps":2,"step_ms":5}`), Priority: ptr(7)})
	if err != nil {
		t.Fatal(err)
	}
	if task.State != agentq.TaskQueued || task.Priority != 7 || task.User != "u1" || task.Budget.MaxSteps == 0 {
		t.Fatalf("submitted %+v", task)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !task.Ended() {
		if time.Now().After(deadline) {
			t.Fatalf("the task is still %s", task.State)
		}
		time.Sleep(20 * time.Millisecond)
		if task, err = h.app.GetTask(ctx, "acme", task.ID); err != nil {
			t.Fatal(err)
		}
	}
	var viaAPI struct {
		State string `json:"state"`
		Usage struct {
			Steps int `json:"steps"`
		} `json:"usage"`
	}
	if st, _ := h.do("GET", "/v1/tasks/"+task.ID.String(), key, nil, &viaAPI); st != 200 || viaAPI.State != agentq.TaskCompleted ||
		task.State != agentq.TaskCompleted || task.Usage.Steps != 2 || viaAPI.Usage.Steps != 2 || task.FinishedAt == nil {
		t.Fatalf("library %+v, API %d %+v", task, st, viaAPI)
	}
	if _, err := h.app.GetTask(ctx, "other", task.ID); !errors.Is(err, agentq.ErrNotFound) {
		t.Errorf("another tenant's read: %v, want ErrNotFound", err)
	}
	var ended *agentq.TaskEndedError
	if _, err := h.app.CancelTask(ctx, "acme", task.ID); !errors.As(err, &ended) || ended.State != agentq.TaskCompleted {
		t.Errorf("cancelling a completed task: %v", err)
	}
	if _, err := h.app.CancelTask(ctx, "acme", uuid.New()); !errors.Is(err, agentq.ErrNotFound) {
		t.Errorf("cancelling no task: %v", err)
	}
	var notPaused *agentq.TaskNotPausedError
	if _, err := h.app.ResumeTask(ctx, "acme", task.ID, nil); !errors.As(err, &notPaused) || notPaused.State != agentq.TaskCompleted {
		t.Errorf("resuming a completed task: %v", err)
	}
}

// The task states the library names are the states tasks have.
func TestLibraryTaskStates(t *testing.T) {
	ended := map[string]bool{
		agentq.TaskQueued: false, agentq.TaskRunning: false, agentq.TaskPaused: false, agentq.TaskCompleted: true, agentq.TaskFailed: true,
		agentq.TaskKilled: true, agentq.TaskBudgetExceeded: true, agentq.TaskAbandoned: true, agentq.TaskExpired: true,
	}
	for st, want := range ended {
		if !tasks.IsState(st) {
			t.Errorf("%q is not a task state", st)
		}
		if got := (agentq.Task{State: st}).Ended(); got != want {
			t.Errorf("Task{State: %q}.Ended() = %v", st, got)
		}
	}
}

// A submission refused by a limit, by a suspension or by an idempotency conflict is
// refused with the library's own error, which carries what the caller needs.
func TestLibrarySubmissionRefusals(t *testing.T) {
	t.Parallel()
	h := start(t, func(o *agentq.Options) { o.Config.Roles = []string{agentq.RoleAPI} })
	ctx := context.Background()
	if _, err := h.app.CreateTenant(ctx, agentq.NewTenant{ID: "acme", Plan: "pro",
		Overrides: map[string]quotas.Limit{quotas.UserTasksHourly: 1}}); err != nil {
		t.Fatal(err)
	}
	submit := func(tenant, user, idem string, steps int) error {
		_, err := h.app.SubmitTask(ctx, agentq.NewTask{TenantID: tenant, Agent: "sim", User: user, IdempotencyKey: idem,
			Input: json.RawMessage(fmt.Sprintf(`{"steps":%d}`, steps))})
		return err
	}
	if err := submit("acme", "u1", "", 1); err != nil {
		t.Fatal(err)
	}
	var limit *agentq.LimitError
	if err := submit("acme", "u1", "", 1); !errors.As(err, &limit) || !slices.Contains(limit.Decision.Violated, quotas.UserTasksHourly) {
		t.Errorf("u1's second task in the hour: %v, want a *LimitError naming %s", err, quotas.UserTasksHourly)
	} else if sc := limit.Decision.Scopes; !slices.ContainsFunc(sc, func(s quotas.Scope) bool { return s.Violated && s.RetryAfter > 0 }) {
		t.Errorf("the refusal says no retry time: %+v", sc)
	}

	if err := submit("acme", "", "order-1", 1); err != nil {
		t.Fatal(err)
	}
	var conflict *agentq.IdempotencyConflictError
	if err := submit("acme", "", "order-1", 2); !errors.As(err, &conflict) || conflict.Key != "order-1" {
		t.Errorf("order-1 with another input: %v, want an *IdempotencyConflictError", err)
	}

	if _, err := h.app.UpdateTenant(ctx, "acme", agentq.TenantUpdate{Status: ptr("suspended")}); err != nil {
		t.Fatal(err)
	}
	var suspended *agentq.SuspendedError
	if err := submit("acme", "", "", 1); !errors.As(err, &suspended) || suspended.TenantID != "acme" {
		t.Errorf("a task of a suspended tenant: %v, want a *SuspendedError", err)
	}
}
