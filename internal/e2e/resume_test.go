package e2e_test

import (
	"context"
	"errors"
	"maps"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/rkeys"
)

// roomBody is the error body of a resume refused for want of room.
type roomBody struct {
	Error struct {
		Code         string  `json:"code"`
		Message      string  `json:"message"`
		LimitType    string  `json:"limit_type"`
		LimitValue   float64 `json:"limit_value"`
		CurrentUsage float64 `json:"current_usage"`
		RoomNeeded   float64 `json:"room_needed"`
		LimitNeeded  float64 `json:"limit_needed"`
	} `json:"error"`
}

// stillPaused checks, for a while, that the task stays paused with its usage.
func (h *harness) stillPaused(key, id string, steps int, cost float64, within time.Duration) {
	h.t.Helper()
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		var p pauseTask
		h.do("GET", "/v1/tasks/"+id, key, nil, &p)
		if p.State != "paused" || p.Usage.Steps != steps || p.Usage.CostUSD > cost+1e-9 {
			h.t.Fatalf("the task is %s with %+v, want still paused at %d steps and $%g", p.State, p.Usage, steps, cost)
		}
	}
}

// A resume without a raise, where the budget has no room for the step that paused
// the task, is refused with the room needed (through the API, the library and the
// link alike) and the task stays paused; a raise that covers it runs it to its end,
// every step within budget.
func TestResumeNeedsRoomForTheNextStep(t *testing.T) {
	t.Parallel()
	h := start(t)
	key := h.tenantWith("rm-cost", "pro", nil, nil)
	id := h.submitSim(key, `{"agent":"sim","budget":{"max_cost_usd":0.035},"input":{"steps":6,"step_ms":5,"cost_usd_per_step":0.01,"tokens_per_step":10}}`)
	if p := h.waitState(key, id, 20*time.Second, "paused", "completed", "budget_exceeded"); p.State != "paused" || p.Usage.Steps != 3 {
		t.Fatalf("at $0.035: %+v, want paused after 3 steps", p)
	}
	var e roomBody
	if st, _ := h.do("POST", "/v1/tasks/"+id+"/resume", key, `{}`, &e); st != 409 || e.Error.Code != "RESUME_NEEDS_ROOM" ||
		e.Error.LimitType != "task_max_cost_usd" || e.Error.RoomNeeded != 0.01 || e.Error.LimitNeeded != 0.04 ||
		e.Error.LimitValue != 0.035 || e.Error.CurrentUsage != 0.03 {
		t.Fatalf("a resume without a raise: %d %+v, want 409 RESUME_NEEDS_ROOM needing $0.01 (max_cost_usd at least 0.04)", st, e)
	}
	// A raise that still leaves too little room is refused alike, and changes nothing.
	if st, _ := h.do("POST", "/v1/tasks/"+id+"/resume", key, `{"budget":{"max_cost_usd":0.039}}`, &e); st != 409 || e.Error.Code != "RESUME_NEEDS_ROOM" {
		t.Fatalf("a raise short of the room: %d %+v", st, e)
	}
	var needs *agentq.ResumeNeedsRoomError
	if _, err := h.app.ResumeTask(context.Background(), "rm-cost", uuid.MustParse(id), nil); !errors.As(err, &needs) || needs.LimitType != "task_max_cost_usd" {
		t.Fatalf("library resume without a raise: %v", err)
	}
	link := h.approvalLink(key, id)
	if st, _ := getPage(t, "POST", link, url.Values{}); st != 409 {
		t.Fatalf("an approval without a raise: %d, want 409", st)
	}
	h.stillPaused(key, id, 3, 0.03, 2*time.Second)
	var p pauseTask
	h.do("GET", "/v1/tasks/"+id, key, nil, &p)
	if p.Budget.MaxCostUSD != 0.035 {
		t.Fatalf("a refused resume changed the budget: %+v", p.Budget)
	}
	if st, _ := h.do("POST", "/v1/tasks/"+id+"/resume", key, `{"budget":{"max_cost_usd":0.2}}`, nil); st != 200 {
		t.Fatalf("a resume with a raise: %d", st)
	}
	if d := h.waitState(key, id, 20*time.Second, "completed", "failed", "budget_exceeded", "paused"); d.State != "completed" || d.Usage.Steps != 6 || d.Usage.CostUSD != 0.06 {
		t.Fatalf("after the raise: %+v, want completed with 6 steps and $0.06", d)
	}
}

// A raise just enough for the next step runs that step, and the task pauses again
// before the one after it: the estimate the pause kept is what the step reserves.
func TestResumeWithAnExactRaiseRunsOneStep(t *testing.T) {
	t.Parallel()
	h := start(t)
	key := h.tenantWith("rm-exact", "pro", nil, nil)
	id := h.submitSim(key, `{"agent":"sim","budget":{"max_cost_usd":0.025},"input":{"steps":6,"step_ms":5,"cost_usd_per_step":0.01}}`)
	h.waitState(key, id, 20*time.Second, "paused")
	if st, _ := h.do("POST", "/v1/tasks/"+id+"/resume", key, `{"budget":{"max_cost_usd":0.03}}`, nil); st != 200 {
		t.Fatalf("resume with an exact raise: %d", st)
	}
	time.Sleep(300 * time.Millisecond)
	if p := h.waitState(key, id, 20*time.Second, "paused", "completed", "budget_exceeded"); p.State != "paused" || p.Usage.Steps != 3 || p.Usage.CostUSD != 0.03 {
		t.Fatalf("after a raise to $0.03: %+v, want paused again at 3 steps and $0.03", p)
	}
}

// The pause watcher resumes a task paused at its tenant's monthly money only when
// the room covers its next step: a refund of a few cents that lowers the use does not
// resume a task whose step costs more; a raise of the quota does.
func TestPauseWatcherNeedsRoomForTheNextStep(t *testing.T) {
	t.Parallel()
	h := start(t)
	key := h.tenantWith("rm-usd", "pro", map[string]client.Limit{"usd_monthly": 0.05}, nil)
	id := h.submitSim(key, `{"agent":"sim","input":{"steps":8,"step_ms":5,"cost_usd_per_step":0.02}}`)
	if p := h.waitState(key, id, 20*time.Second, "paused", "completed", "budget_exceeded"); p.State != "paused" || p.Usage.Steps != 2 || *p.PausedReason != "usd_monthly" {
		t.Fatalf("at its monthly money: %+v", p)
	}
	// A settlement refund: the counter falls by half a cent, leaving $0.015 of room.
	ctx := context.Background()
	st := h.app.Keys().AdmissionState("rm-usd")
	fields, err := h.app.Redis().HKeys(ctx, st).Result()
	if err != nil {
		t.Fatal(err)
	}
	refunded := false
	for _, f := range fields {
		if strings.HasPrefix(f, rkeys.USDPrefix) {
			if err := h.app.Redis().HIncrBy(ctx, st, f, -5000).Err(); err != nil {
				t.Fatal(err)
			}
			refunded = true
		}
	}
	if !refunded {
		t.Fatalf("no monthly money counter among %v", fields)
	}
	h.stillPaused(key, id, 2, 0.04, 3*time.Second)
	// Through the API too: the quota has no room for the step.
	var e roomBody
	if code, _ := h.do("POST", "/v1/tasks/"+id+"/resume", key, `{}`, &e); code != 409 || e.Error.Code != "RESUME_NEEDS_ROOM" || e.Error.LimitType != "usd_monthly" {
		t.Fatalf("an API resume under a full money quota: %d %+v", code, e)
	}
	ov := maps.Clone(generous)
	ov["usd_monthly"] = 1
	if code, _ := h.do("PATCH", "/v1/admin/tenants/rm-usd", h.admin, map[string]any{"overrides": ov}, nil); code != 200 {
		t.Fatalf("raise: %d", code)
	}
	if d := h.waitState(key, id, 20*time.Second, "completed", "budget_exceeded"); d.State != "completed" || d.Usage.Steps != 8 {
		t.Fatalf("after the raise: %+v", d)
	}
}

// Where the plan's ceiling leaves no room for the next step (pro's default budget is
// its ceiling), a raise could only pause the task again: it stops instead.
func TestLimitAtTheCeilingStops(t *testing.T) {
	t.Parallel()
	h := start(t)
	key := h.tenantWith("rm-ceil", "pro", nil, nil)
	id := h.submitSim(key, `{"agent":"sim","input":{"steps":5,"step_ms":5,"cost_usd_per_step":0.3}}`)
	if p := h.waitState(key, id, 20*time.Second, "paused", "completed", "budget_exceeded"); p.State != "budget_exceeded" || p.Usage.Steps != 3 {
		t.Fatalf("at the ceiling ($1): %+v, want budget_exceeded after 3 steps", p)
	}
}

// Get, cancel, resume and the event stream answer 404 for a task outside the key's
// scopes; a suspended tenant's tasks are resumed neither by the API, nor by a link,
// nor by the pause watcher; an approval link only raises, and a raise through it
// resumes the task.
func TestResumeScopesSuspensionAndLinkRaises(t *testing.T) {
	t.Parallel()
	h := start(t)
	alice := h.tenantWith("rs", "pro", nil, map[string]any{"principals": []string{"alice"}})
	var k struct{ Key string }
	h.do("POST", "/v1/admin/tenants/rs/keys", h.admin, map[string]any{"scopes": map[string]any{"principals": []string{"bob"}}}, &k)
	bob := k.Key
	h.do("POST", "/v1/admin/tenants/rs/keys", h.admin, map[string]any{"scopes": map[string]any{"agents": []string{"other"}}}, &k)
	other := k.Key
	id := h.submitSim(alice, `{"agent":"sim","user":"alice","budget":{"max_cost_usd":0.015},"input":{"steps":4,"step_ms":5,"cost_usd_per_step":0.01}}`)
	h.waitState(alice, id, 20*time.Second, "paused")
	for name, key := range map[string]string{"bob": bob, "another agent's": other} {
		var e errBody
		if st, _ := h.do("GET", "/v1/tasks/"+id, key, nil, &e); st != 404 || e.Error.Code != "NOT_FOUND" {
			t.Errorf("%s key reads alice's task: %d %+v", name, st, e)
		}
		if st, _ := h.do("POST", "/v1/tasks/"+id+"/resume", key, `{"budget":{"max_cost_usd":0.05}}`, &e); st != 404 {
			t.Errorf("%s key resumes alice's task: %d %+v", name, st, e)
		}
		if st, _ := h.do("POST", "/v1/tasks/"+id+"/cancel", key, nil, &e); st != 404 {
			t.Errorf("%s key cancels alice's task: %d %+v", name, st, e)
		}
		resp, err := h.openStream(context.Background(), key, id)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Errorf("%s key streams alice's task: %d", name, resp.StatusCode)
		}
		var list struct {
			Tasks []pauseTask `json:"tasks"`
		}
		h.do("GET", "/v1/tasks?state=paused", key, nil, &list)
		if len(list.Tasks) != 0 {
			t.Errorf("%s key lists alice's task: %+v", name, list.Tasks)
		}
	}
	h.stillPaused(alice, id, 1, 0.01, 200*time.Millisecond)
	link := h.approvalLink(alice, id)

	// An approval link only raises: a lower field is refused and changes nothing.
	for _, form := range []url.Values{{"max_steps": {"1"}}, {"max_cost_usd": {"0.012"}}, {"max_cost_usd": {"0.05"}, "max_wallclock_s": {"10"}}} {
		if st, page := getPage(t, "POST", link, form); st != 400 {
			t.Errorf("an approval that lowers %v: %d %s", form, st, page)
		}
	}
	if p := h.waitState(alice, id, time.Second, "paused"); p.Budget.MaxSteps != 20 || p.Budget.MaxCostUSD != 0.015 {
		t.Fatalf("a refused approval changed the budget: %+v", p.Budget)
	}

	// Suspended: no resume by the API, the link or the watcher.
	kq := h.tenantWith("rs-q", "pro", map[string]client.Limit{"agent_steps_daily": 2}, nil)
	qid := h.submitSim(kq, `{"agent":"sim","input":{"steps":4,"step_ms":5}}`)
	h.waitState(kq, qid, 20*time.Second, "paused")
	for _, tn := range []string{"rs", "rs-q"} {
		if st, _ := h.do("PATCH", "/v1/admin/tenants/"+tn, h.admin, map[string]any{"status": "suspended"}, nil); st != 200 {
			t.Fatalf("suspend %s: %d", tn, st)
		}
	}
	var e errBody
	if st, _ := h.do("POST", "/v1/tasks/"+id+"/resume", alice, `{"budget":{"max_cost_usd":0.05}}`, &e); st != 403 || e.Error.Code != "TENANT_SUSPENDED" {
		t.Errorf("a suspended tenant's resume: %d %+v, want 403 TENANT_SUSPENDED", st, e)
	}
	if st, _ := getPage(t, "POST", link, url.Values{"max_cost_usd": {"0.05"}}); st != 403 {
		t.Errorf("a suspended tenant's approval: %d, want 403", st)
	}
	ov := maps.Clone(generous)
	if st, _ := h.do("PATCH", "/v1/admin/tenants/rs-q", h.admin, map[string]any{"overrides": ov}, nil); st != 200 {
		t.Fatalf("raise rs-q's steps: %d", st)
	}
	h.stillPaused(alice, id, 1, 0.01, 200*time.Millisecond)
	h.stillPaused(kq, qid, 2, 0, 2500*time.Millisecond)
	for _, tn := range []string{"rs", "rs-q"} {
		h.do("PATCH", "/v1/admin/tenants/"+tn, h.admin, map[string]any{"status": "active"}, nil)
	}
	if d := h.waitState(kq, qid, 20*time.Second, "completed", "budget_exceeded"); d.State != "completed" || d.Usage.Steps != 4 {
		t.Fatalf("rs-q's task once active again: %+v", d)
	}
	// A raise through the link resumes the task like the API does.
	if st, page := getPage(t, "POST", link, url.Values{"max_cost_usd": {"0.05"}}); st != 200 {
		t.Fatalf("a raise through the link: %d %s", st, page)
	}
	if d := h.waitState(alice, id, 20*time.Second, "completed", "budget_exceeded", "paused"); d.State != "completed" || d.Usage.Steps != 4 {
		t.Fatalf("after the link's raise: %+v", d)
	}
}
