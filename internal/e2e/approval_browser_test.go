package e2e_test

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/agentq/agentq/internal/browsertest"
)

// The approval page of a paused task, in a browser: it says in words what the task
// is, why it paused (its cost budget, what was spent of it, what the next step is
// expected to cost), the raise that lets it run on with a suggested value, when the
// link expires and what approving does; it is styled like the panel, shows no
// limit's code name and no status line; and approving the suggested raise resumes
// the task to its end.
func TestApprovalPageInBrowser(t *testing.T) {
	t.Parallel()
	h := start(t)
	key := h.tenantWith("ap-page", "pro", nil, nil)
	id := h.submitSim(key, `{"agent":"sim","budget":{"max_cost_usd":0.05},"input":{"steps":4,"step_ms":5,"cost_usd_per_step":0.02}}`)
	h.waitState(key, id, 20*time.Second, "paused")
	link := h.approvalLink(key, id)

	bctx := browsertest.New(t)
	nctx, cancel := browsertest.Within(bctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(nctx, chromedp.Navigate(link), chromedp.WaitVisible(`#why`)); err != nil {
		t.Fatal(err)
	}
	text, err := chromedp.Run(nctx, chromedp.Text("body"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"A task is waiting for your approval", "sim",
		"its cost budget: $0.04 of $0.05 spent; the next step is expected to cost about $0.02",
		"a cost budget of at least $0.06", "$0.10 is suggested",
		"This link expires", "On approve, the task's budget takes these values",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the page does not say %q:\n%s", want, text)
		}
	}
	for _, not := range []string{"task_max_cost_usd", "HTTP 200"} {
		if strings.Contains(text, not) {
			t.Errorf("the page shows %q:\n%s", not, text)
		}
	}
	// Styled: the panel's stylesheet applies (its font, its cards).
	style, err := chromedp.Run(nctx, chromedp.Evaluate[string](
		`getComputedStyle(document.body).fontFamily + "|" + getComputedStyle(document.querySelector(".card.why")).borderLeftWidth + "|" + getComputedStyle(document.querySelector(".card")).backgroundColor`))
	if err != nil {
		t.Fatal(err)
	}
	if parts := strings.Split(style, "|"); len(parts) != 3 || !strings.Contains(parts[0], "system-ui") || parts[1] != "5px" || parts[2] == "rgba(0, 0, 0, 0)" {
		t.Errorf("the page is not styled: font, card border, card background %q", style)
	}
	suggested, err := chromedp.Run(nctx, chromedp.Evaluate[string](`document.querySelector('input[name="max_cost_usd"]').value`))
	if err != nil || suggested != "0.1" {
		t.Fatalf("the suggested raise in the form: %q %v", suggested, err)
	}
	if err := chromedp.Do(nctx, chromedp.Click(`button[type="submit"]`), chromedp.WaitVisible(`#message`)); err != nil {
		t.Fatal(err)
	}
	msg, err := chromedp.Run(nctx, chromedp.Text(`#message`))
	if err != nil || !strings.Contains(msg, "Approved") {
		t.Fatalf("after approving: %q %v", msg, err)
	}
	if d := h.waitState(key, id, 20*time.Second, "completed", "budget_exceeded", "paused"); d.State != "completed" || d.Usage.Steps != 4 || d.Budget.MaxCostUSD != 0.1 {
		t.Fatalf("after the approval: %+v", d)
	}
}
