package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/quotas"
)

// pauseTask is the task JSON fields the pause tests read.
type pauseTask struct {
	ID           string  `json:"id"`
	State        string  `json:"state"`
	PausedReason *string `json:"paused_reason"`
	WaitedS      float64 `json:"waited_s"`
	Usage        struct {
		Steps   int     `json:"steps"`
		Tokens  int64   `json:"tokens"`
		CostUSD float64 `json:"cost_usd"`
	} `json:"usage"`
	Budget client.Budget `json:"budget"`
}

// waitState polls the task until it is in one of states, or fails the test.
func (h *harness) waitState(key, id string, within time.Duration, states ...string) pauseTask {
	h.t.Helper()
	var t pauseTask
	for end := time.Now().Add(within); ; {
		h.do("GET", "/v1/tasks/"+id, key, nil, &t)
		for _, s := range states {
			if t.State == s {
				return t
			}
		}
		if time.Now().After(end) {
			h.t.Fatalf("task %s is %s after %s, want one of %v", id, t.State, within, states)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// submitSim submits a sim task and returns its id.
func (h *harness) submitSim(key, body string) string {
	h.t.Helper()
	var t pauseTask
	if st, _ := h.do("POST", "/v1/tasks", key, body, &t); st != 202 {
		h.t.Fatalf("submit %s: %d", body, st)
	}
	return t.ID
}

// approvalLink finds the approval link in the pause's usage.limit_hit event.
func (h *harness) approvalLink(key, taskID string) string {
	h.t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		var feed struct {
			Events []struct {
				Data map[string]any `json:"data"`
			} `json:"events"`
		}
		h.do("GET", "/v1/events?type=usage.limit_hit", key, nil, &feed)
		for _, ev := range feed.Events {
			if ev.Data["task_id"] == taskID && ev.Data["enforcement"] == "paused" {
				link, _ := ev.Data["approval_url"].(string)
				if ev.Data["sla_classification"] != "enforced_limit" {
					h.t.Errorf("a pause's event is %v, want enforced_limit", ev.Data["sla_classification"])
				}
				return link
			}
		}
	}
	h.t.Fatalf("no paused limit_hit for task %s", taskID)
	return ""
}

func getPage(t *testing.T, method, link string, form url.Values) (int, string) {
	t.Helper()
	var resp *http.Response
	var err error
	if method == "POST" {
		resp, err = http.PostForm(link, form)
	} else {
		resp, err = http.Get(link)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String()
}

// A pro task whose next step would pass its cost budget pauses with its usage and
// state, holding no worker slot and no session; its approval link shows it, a forged
// one is refused, a raise past the ceiling is refused, and a raise within it resumes
// it at its next step, its usage exact across the pause.
func TestPauseAtCostBudgetAndResumeWithRaise(t *testing.T) {
	t.Parallel()
	h := start(t)
	key := h.tenantWith("pz-cost", "pro", nil, nil)
	id := h.submitSim(key, `{"agent":"sim","budget":{"max_cost_usd":0.05},"input":{"steps":5,"step_ms":5,"cost_usd_per_step":0.02,"tokens_per_step":10}}`)
	p := h.waitState(key, id, 20*time.Second, "paused", "completed", "budget_exceeded")
	if p.State != "paused" || p.Usage.Steps != 2 || p.Usage.Tokens != 20 || p.PausedReason == nil || *p.PausedReason != "task_max_cost_usd" {
		t.Fatalf("at its budget: %+v, want paused at task_max_cost_usd after 2 steps", p)
	}
	ctx := context.Background()
	// No session and no running slot while paused.
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		sess, long, err := h.app.Quotas().Leases(ctx, "pz-cost")
		run, rerr := h.app.Scheduler().Running(ctx, "pz-cost")
		if err == nil && rerr == nil && len(sess)+len(long) == 0 && run == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("a paused task holds sessions %v %v, running %d", sess, long, run)
		}
	}

	link := h.approvalLink(key, id)
	if !strings.HasPrefix(link, "http://") || !strings.Contains(link, "/approve?token=") {
		t.Fatalf("approval link %q", link)
	}
	if st, page := getPage(t, "GET", link, nil); st != 200 || !strings.Contains(page, id) || !strings.Contains(page, "$0.04") {
		t.Fatalf("approval page: %d %s", st, page)
	}
	forged := link[:len(link)-2] + "AA"
	if strings.HasSuffix(link, "AA") {
		forged = link[:len(link)-2] + "BB"
	}
	if st, _ := getPage(t, "GET", forged, nil); st != 401 {
		t.Errorf("forged approval link: %d, want 401", st)
	}
	if st, _ := getPage(t, "POST", forged, url.Values{"max_cost_usd": {"0.2"}}); st != 401 {
		t.Errorf("forged approval POST: %d, want 401", st)
	}
	// Past the ceiling ($1 on pro): refused, through the API and the link alike.
	var e errBody
	if st, _ := h.do("POST", "/v1/tasks/"+id+"/resume", key, `{"budget":{"max_cost_usd":5}}`, &e); st != 400 || e.Error.Code != "INVALID_REQUEST" {
		t.Fatalf("resume past the ceiling: %d %+v", st, e)
	}
	if st, _ := getPage(t, "POST", link, url.Values{"max_cost_usd": {"5"}}); st != 400 {
		t.Fatalf("approval past the ceiling: %d", st)
	}
	if q := h.waitState(key, id, time.Second, "paused"); q.Usage.Steps != 2 {
		t.Fatalf("a refused resume changed the task: %+v", q)
	}
	// Within it, through the link.
	if st, page := getPage(t, "POST", link, url.Values{"max_cost_usd": {"0.2"}}); st != 200 || !strings.Contains(page, "Approved") {
		t.Fatalf("approve: %d %s", st, page)
	}
	done := h.waitState(key, id, 20*time.Second, "completed", "failed", "budget_exceeded", "paused")
	if done.State != "completed" || done.Usage.Steps != 5 || done.Usage.Tokens != 50 || done.Budget.MaxCostUSD != 0.2 {
		t.Fatalf("after the approval: %+v", done)
	}
	if steps, tokens, cost := h.ledgerTotals("pz-cost"); steps != 5 || tokens != 50 || cost != 100_000 {
		t.Fatalf("ledger: %d steps, %d tokens, %d micro-USD; want 5, 50, 100000", steps, tokens, cost)
	}
	// The link was for that pause: it is spent.
	if st, _ := getPage(t, "POST", link, url.Values{"max_cost_usd": {"0.3"}}); st != 409 {
		t.Fatalf("a spent approval link: %d, want 409", st)
	}
	if st, _ := h.do("POST", "/v1/tasks/"+id+"/resume", key, nil, &e); st != 409 || e.Error.Code != "TASK_NOT_PAUSED" {
		t.Fatalf("resume of a completed task: %d %+v", st, e)
	}
}

// A task paused at its wall clock resumes through the API with a raise, the pause not
// charged to its wall clock; one paused by its tenant's daily steps resumes by itself
// when an admin raises the quota; a task at its step cap (pro stops there: the guard
// against an agent that never ends), a pro_stop task and a free task stop.
func TestPauseCausesAndResumes(t *testing.T) {
	t.Parallel()
	h := start(t)
	key := h.tenantWith("pz-wall", "pro", nil, nil)
	id := h.submitSim(key, `{"agent":"sim","budget":{"max_wallclock_s":1},"input":{"steps":4,"step_ms":400,"tokens_per_step":7}}`)
	p := h.waitState(key, id, 20*time.Second, "paused", "completed", "budget_exceeded")
	if p.State != "paused" || p.Usage.Steps < 1 || p.Usage.Steps > 3 || *p.PausedReason != "task_max_wallclock_s" {
		t.Fatalf("at its wall clock: %+v", p)
	}
	time.Sleep(1200 * time.Millisecond) // paused longer than its whole wall clock
	var r pauseTask
	if st, _ := h.do("POST", "/v1/tasks/"+id+"/resume", key, `{"budget":{"max_wallclock_s":30}}`, &r); st != 200 || r.State != "queued" || r.Budget.MaxWallclockS != 30 || r.WaitedS < 1 {
		t.Fatalf("resume: %d %+v", st, r)
	}
	if d := h.waitState(key, id, 20*time.Second, "completed", "paused", "budget_exceeded"); d.State != "completed" || d.Usage.Steps != 4 || d.Usage.Tokens != 28 {
		t.Fatalf("after resume: %+v", d)
	}
	for _, plan := range []string{"pro", "pro_stop"} {
		ks := h.tenantWith("pz-steps-"+strings.ReplaceAll(plan, "_", "-"), plan, nil, nil)
		sid := h.submitSim(ks, `{"agent":"sim","budget":{"max_steps":2,"max_cost_usd":0.01},"input":{"steps":4,"step_ms":5}}`)
		if s := h.waitState(ks, sid, 20*time.Second, "budget_exceeded", "paused", "completed"); s.State != "budget_exceeded" || s.Usage.Steps != 2 {
			t.Fatalf("%s at its step cap: %+v", plan, s)
		}
	}

	kq := h.tenantWith("pz-quota", "pro", map[string]client.Limit{"agent_steps_daily": client.Limit(3)}, nil)
	qid := h.submitSim(kq, `{"agent":"sim","input":{"steps":5,"step_ms":5}}`)
	q := h.waitState(kq, qid, 20*time.Second, "paused", "completed", "budget_exceeded")
	if q.State != "paused" || q.Usage.Steps != 3 || *q.PausedReason != "agent_steps_daily" {
		t.Fatalf("at its daily steps: %+v", q)
	}
	// Unchanged, the quota keeps it paused.
	time.Sleep(1500 * time.Millisecond)
	h.waitState(kq, qid, time.Second, "paused")
	ov := maps.Clone(generous)
	ov["agent_steps_daily"] = 10
	if st, _ := h.do("PATCH", "/v1/admin/tenants/pz-quota", h.admin, map[string]any{"overrides": ov}, nil); st != 200 {
		t.Fatalf("raise: %d", st)
	}
	if d := h.waitState(kq, qid, 20*time.Second, "completed", "budget_exceeded"); d.State != "completed" || d.Usage.Steps != 5 {
		t.Fatalf("after the raise: %+v", d)
	}

	// Its monthly money: paused, then resumed by itself when the admin raises it.
	ku := h.tenantWith("pz-usd", "pro", map[string]client.Limit{"usd_monthly": 0.02}, nil)
	uid := h.submitSim(ku, `{"agent":"sim","input":{"steps":4,"step_ms":5,"cost_usd_per_step":0.01}}`)
	u := h.waitState(ku, uid, 20*time.Second, "paused", "completed", "budget_exceeded")
	if u.State != "paused" || u.Usage.Steps != 2 || *u.PausedReason != "usd_monthly" {
		t.Fatalf("at its monthly money: %+v", u)
	}
	ovu := maps.Clone(generous)
	ovu["usd_monthly"] = 1
	if st, _ := h.do("PATCH", "/v1/admin/tenants/pz-usd", h.admin, map[string]any{"overrides": ovu}, nil); st != 200 {
		t.Fatalf("raise: %d", st)
	}
	if d := h.waitState(ku, uid, 20*time.Second, "completed", "budget_exceeded"); d.State != "completed" || d.Usage.Steps != 4 || d.Usage.CostUSD != 0.04 {
		t.Fatalf("after the money raise: %+v", d)
	}

	kf := h.tenantWith("pz-free", "free", nil, nil)
	fid := h.submitSim(kf, `{"agent":"sim","budget":{"max_steps":2},"input":{"steps":4}}`)
	if f := h.waitState(kf, fid, 20*time.Second, "budget_exceeded", "paused", "completed"); f.State != "budget_exceeded" {
		t.Fatalf("a free task at its budget is %s", f.State)
	}
}

// A resume (with the raise its next step needs) is admitted against the tenant's
// sessions: refused (429) while they are full, the task staying paused; a paused task
// can be cancelled.
func TestResumeNeedsASessionAndCancelWorksOnPaused(t *testing.T) {
	t.Parallel()
	h := start(t)
	key := h.tenantWith("pz-sess", "pro", map[string]client.Limit{"concurrent_sessions": client.Limit(1)}, nil)
	id := h.submitSim(key, `{"agent":"sim","budget":{"max_cost_usd":0.01},"input":{"steps":3,"step_ms":5,"cost_usd_per_step":0.01}}`)
	h.waitState(key, id, 20*time.Second, "paused")
	long := h.submitSim(key, `{"agent":"sim","input":{"steps":1,"step_ms":3000}}`)
	var e errBody
	if st, hd := h.do("POST", "/v1/tasks/"+id+"/resume", key, `{"budget":{"max_cost_usd":0.05}}`, &e); st != 429 || e.Error.Code != "CONCURRENCY_LIMIT_EXCEEDED" || hd.Get("Retry-After") == "" {
		t.Fatalf("resume with sessions full: %d %+v", st, e)
	}
	// The library refuses it alike.
	var refused *agentq.ResumeRefusedError
	raise := 0.05
	if _, err := h.app.ResumeTask(context.Background(), "pz-sess", uuid.MustParse(id), &agentq.TaskBudget{MaxCostUSD: &raise}); !errors.As(err, &refused) || refused.LimitType != "concurrent_sessions" {
		t.Fatalf("library resume with sessions full: %v", err)
	}
	h.waitState(key, id, time.Second, "paused")
	var k pauseTask
	if st, _ := h.do("POST", "/v1/tasks/"+id+"/cancel", key, nil, &k); st != 200 || k.State != "killed" {
		t.Fatalf("cancel a paused task: %d %+v", st, k)
	}
	h.waitState(key, long, 20*time.Second, "completed")
}

// pausingPlans is the shipped catalogue with its paying plans (those that pause at
// limits) pausing at every limit, the step cap included, and their tasks paused at
// most timeout.
func pausingPlans(t *testing.T, timeout time.Duration) string {
	t.Helper()
	plans := shippedPlans(t)
	for n, p := range plans {
		if p.OnLimit.For(quotas.USDMonthly) == quotas.OnLimitPause {
			p.OnLimit = quotas.OnLimits{Default: quotas.OnLimitPause}
			p.PauseTimeoutS = timeout.Seconds()
			plans[n] = p
		}
	}
	return plansFile(t, plans)
}

// On a plan that pauses at every limit, a task at its step cap pauses too, and a
// raise of the cap resumes it to its end.
func TestPauseAtTheStepCapWhenThePlanSaysSo(t *testing.T) {
	t.Parallel()
	file := pausingPlans(t, 24*time.Hour)
	h := start(t, func(o *agentq.Options) { o.Config.PlansFile = file })
	key := h.tenantWith("pz-cap", "pro", nil, nil)
	id := h.submitSim(key, `{"agent":"sim","budget":{"max_steps":2},"input":{"steps":4,"step_ms":5,"tokens_per_step":3}}`)
	p := h.waitState(key, id, 20*time.Second, "paused", "completed", "budget_exceeded")
	if p.State != "paused" || p.Usage.Steps != 2 || *p.PausedReason != "task_max_steps" {
		t.Fatalf("at its step cap: %+v", p)
	}
	if st, _ := h.do("POST", "/v1/tasks/"+id+"/resume", key, `{"budget":{"max_steps":4}}`, nil); st != 200 {
		t.Fatalf("resume: %d", st)
	}
	if d := h.waitState(key, id, 20*time.Second, "completed", "paused", "budget_exceeded"); d.State != "completed" || d.Usage.Steps != 4 || d.Usage.Tokens != 12 {
		t.Fatalf("after the raise: %+v", d)
	}
}

// A task paused longer than its plan's pause_timeout_s ends budget_exceeded, and its
// approval link has expired with the pause.
func TestPauseTimesOut(t *testing.T) {
	t.Parallel()
	file := pausingPlans(t, 2*time.Second)
	h := start(t, func(o *agentq.Options) { o.Config.PlansFile = file })
	key := h.tenantWith("pz-time", "pro", nil, nil)
	id := h.submitSim(key, `{"agent":"sim","budget":{"max_cost_usd":0.01},"input":{"steps":2,"step_ms":5,"cost_usd_per_step":0.01}}`)
	h.waitState(key, id, 20*time.Second, "paused")
	link := h.approvalLink(key, id)
	end := h.waitState(key, id, 20*time.Second, "budget_exceeded")
	if end.Usage.Steps != 1 {
		t.Fatalf("timed out with %+v", end)
	}
	if st, _ := getPage(t, "GET", link, nil); st != 403 {
		t.Fatalf("an expired approval link: %d, want 403", st)
	}
	// The feeds show an event once the transactions before it ended: poll.
	var feed struct {
		Events []struct {
			Data map[string]any `json:"data"`
		} `json:"events"`
	}
	var stopped bool
	for wait := time.Now().Add(10 * time.Second); !stopped && time.Now().Before(wait); time.Sleep(100 * time.Millisecond) {
		h.do("GET", "/v1/events?type=usage.limit_hit", key, nil, &feed)
		for _, ev := range feed.Events {
			stopped = stopped || ev.Data["enforcement"] == "stopped" && ev.Data["limit_type"] == "task_max_cost_usd"
		}
	}
	if !stopped {
		b, _ := json.Marshal(feed)
		t.Fatalf("no stopped limit_hit for the timed-out pause: %s", b)
	}
}
