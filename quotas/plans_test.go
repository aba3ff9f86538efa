package quotas

import (
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

func TestCatalogueDefaultsAndOverrides(t *testing.T) {
	c, err := LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	for plan, want := range map[string][3]Limit{ // tenant_rate, concurrent_sessions, agent_steps_daily
		"free": {5, 1, 50}, "pro": {100, 3, 500}, "enterprise": {1000, 20, 10000},
	} {
		eff, err := c.Effective(plan, nil)
		if err != nil {
			t.Fatal(err)
		}
		if eff[TenantRate] != want[0] || eff[ConcurrentSessions] != want[1] || eff[AgentStepsDaily] != want[2] {
			t.Errorf("%s: %v", plan, eff)
		}
	}
	for plan, want := range map[string]Limit{"free": 0, "pro": 2, "enterprise": 10} {
		if eff, _ := c.Effective(plan, nil); eff[WebhookEndpoints] != want {
			t.Errorf("%s: webhook_endpoints %v, want %v", plan, eff[WebhookEndpoints], want)
		}
	}
	if err := ValidateOverrides(map[string]Limit{WebhookEndpoints: 5}); err != nil {
		t.Errorf("webhook_endpoints override: %v", err)
	}
	if err := ValidateOverrides(map[string]Limit{WebhookEndpoints: Unlimited}); err != nil {
		t.Errorf("webhook_endpoints unlimited: %v", err)
	}
	eff, _ := c.Effective("pro", map[string]Limit{TenantRate: 5, "tenant_rate_burst": 7})
	if l := LimitsOf(eff); l.TenantRate != 5 || l.TenantBurst != 7 || l.KeyRate != 20 || l.KeyBurst != 40 {
		t.Fatalf("overridden limits: %+v", l)
	}
	if l := LimitsOf(map[string]Limit{TenantRate: 5}); l.TenantBurst != 10 {
		t.Fatalf("tenant burst defaults to 2x the rate, got %v", l.TenantBurst)
	}
}

func TestApplyGlobals(t *testing.T) {
	c, _ := LoadCatalogue("")
	six := 6.0
	if err := c.ApplyGlobals(Globals{TenantRPS: &six}); err != nil {
		t.Fatal(err)
	}
	if p, _ := c.Plan("enterprise"); p.Limits[TenantRate] != 6 {
		t.Fatalf("global tenant rate not applied: %v", p.Limits[TenantRate])
	}
	zero := 0.0
	c, _ = LoadCatalogue("")
	err := c.ApplyGlobals(Globals{KeyRPS: &zero})
	if err == nil || !strings.Contains(err.Error(), "disables key limits") {
		t.Fatalf("key limits off with tenant limits on: %v", err)
	}
	c, _ = LoadCatalogue("")
	if err := c.ApplyGlobals(Globals{KeyRPS: &zero, TenantRPS: &zero}); err != nil {
		t.Fatalf("both off is allowed: %v", err)
	}
}

func TestParseCatalogueRejectsBadFiles(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown limit": "plans:\n  p:\n    weight: 1\n    limits: {bogus: 1}\n",
		"unknown field": "plans:\n  p:\n    weight: 1\n    color: red\n",
		"negative":      "plans:\n  p:\n    limits: {tenant_rate: -1}\n",
		"empty":         "plans: {}\n",
	} {
		if _, err := ParseCatalogue([]byte(doc)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestCatalogueBudgetsHaveDefaultsWithinCeilings(t *testing.T) {
	c, err := LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	for plan, ceil := range map[string]TaskBudget{ // the shipped ceilings
		"free": {5, 60, 0.10}, "pro": {20, 300, 1}, "enterprise": {50, 1800, 10},
	} {
		p, _ := c.Plan(plan)
		if p.Budget.Ceiling != ceil || p.Budget.Default.MaxWallclockS > LongRunningThreshold.Seconds() {
			t.Errorf("%s: budget %+v; want ceiling %+v and a default wall clock of at most 5 min", plan, p.Budget, ceil)
		}
	}
	const ok = "{max_steps: 5, max_wallclock_s: 60, max_cost_usd: 1}"
	doc := func(def, ceil string) string {
		return "plans:\n  p:\n    limits: {tenant_rate: 5}\n    budget:\n      default: " + def + "\n      ceiling: " + ceil + "\n"
	}
	if _, err := ParseCatalogue([]byte(doc(ok, ok))); err != nil {
		t.Fatalf("a sound budget refused: %v", err)
	}
	for name, tc := range map[string]struct{ doc, want string }{
		"default steps above the ceiling": {doc("{max_steps: 6, max_wallclock_s: 60, max_cost_usd: 1}", ok), "budget.default.max_steps 6 is above the ceiling's 5"},
		"default cost above the ceiling":  {doc("{max_steps: 5, max_wallclock_s: 60, max_cost_usd: 2}", ok), "max_cost_usd 2 is above the ceiling's 1"},
		"default wall clock above 5 min": {doc("{max_steps: 5, max_wallclock_s: 301, max_cost_usd: 1}", "{max_steps: 5, max_wallclock_s: 900, max_cost_usd: 1}"),
			"budget.default.max_wallclock_s 301 is above 300"},
		"a ceiling field of 0":    {doc(ok, "{max_steps: 5, max_wallclock_s: 60, max_cost_usd: 0}"), "budget.ceiling.max_cost_usd must be a number above 0"},
		"a default field missing": {doc("{max_steps: 5, max_cost_usd: 1}", ok), "budget.default.max_wallclock_s must be a number above 0"},
		"no budget":               {"plans:\n  p:\n    limits: {tenant_rate: 5}\n", "budget.default.max_steps must be at least 1"},
		"limits without default":  {"plans:\n  p:\n    budget: {max_steps: 5, max_wallclock_s: 60, max_cost_usd: 1}\n", "a budget holds a default and a ceiling"},
		"an unknown budget field": {"plans:\n  p:\n    budget: {defaults: {}}\n", `unknown field "defaults"`},
	} {
		_, err := ParseCatalogue([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error naming %q", name, err, tc.want)
		}
	}
}

func TestFillGivesEveryFieldACap(t *testing.T) {
	b := Budget{Default: TaskBudget{3, 30, 0.5}, Ceiling: TaskBudget{10, 600, 5}}
	if got := b.Fill(TaskBudget{MaxSteps: 0, MaxWallclockS: -1, MaxCostUSD: 2}); got != (TaskBudget{3, 30, 2}) {
		t.Fatalf("Fill = %+v", got)
	}
}

// on_limit is one word or a map with a default; the shipped plans stop on free, and
// on pro and enterprise pause at every limit but max_steps. Bad answers, limits a
// task does not pause at and timeouts out of range are refused.
func TestOnLimitAndPauseTimeout(t *testing.T) {
	c, err := LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	for plan, want := range map[string]map[string]OnLimit{
		"free":       {TaskMaxSteps: OnLimitStop, TaskMaxCostUSD: OnLimitStop, AgentStepsDaily: OnLimitStop},
		"pro":        {TaskMaxSteps: OnLimitStop, TaskMaxCostUSD: OnLimitPause, TaskMaxWallclock: OnLimitPause, AgentStepsDaily: OnLimitPause, USDMonthly: OnLimitPause},
		"enterprise": {TaskMaxSteps: OnLimitStop, AITokensMonthly: OnLimitPause},
	} {
		p, _ := c.Plan(plan)
		for limit, a := range want {
			if got := p.OnLimit.For(limit); got != a {
				t.Errorf("%s at %s: %s, want %s", plan, limit, got, a)
			}
		}
		if p.PauseTimeout() != DefaultPauseTimeout {
			t.Errorf("%s: pause timeout %s", plan, p.PauseTimeout())
		}
	}
	one, err := ParseCatalogue([]byte("plans:\n  p:\n    on_limit: pause\n    pause_timeout_s: 60\n" + budgetYAML))
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := one.Plan("p"); p.OnLimit.For(USDMonthly) != OnLimitPause || p.PauseTimeout().Seconds() != 60 {
		t.Errorf("one word: %+v %s", p.OnLimit, p.PauseTimeout())
	}
	for name, doc := range map[string]string{
		"unknown answer":     "    on_limit: wait\n",
		"unknown in a map":   "    on_limit: {default: pause, task_max_steps: later}\n",
		"not a pause limit":  "    on_limit: {tenant_rate: pause}\n",
		"negative timeout":   "    pause_timeout_s: -1\n",
		"timeout past month": "    pause_timeout_s: 2592001\n",
	} {
		if _, err := ParseCatalogue([]byte("plans:\n  p:\n" + doc + budgetYAML)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

const budgetYAML = "    budget:\n      default: {max_steps: 1, max_wallclock_s: 1, max_cost_usd: 1}\n      ceiling: {max_steps: 1, max_wallclock_s: 1, max_cost_usd: 1}\n"

// A catalogue built from Go values (tests build theirs so) is written as YAML that
// reads back to the same plans: the shipped one, and a plan whose on_limit is one word.
func TestPlansWriteAsTheCatalogueReadsThem(t *testing.T) {
	c, err := LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	plans := map[string]Plan{}
	for _, n := range c.Names() {
		plans[n], _ = c.Plan(n)
	}
	stop := plans["pro"]
	stop.OnLimit = OnLimits{Default: OnLimitStop}
	plans["pro_stop"] = stop
	out, err := yaml.Marshal(map[string]any{"plans": plans})
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseCatalogue(out)
	if err != nil {
		t.Fatalf("the written catalogue does not read: %v\n%s", err, out)
	}
	for n, p := range plans {
		p.Name = n
		if got, _ := back.Plan(n); !reflect.DeepEqual(got, p) {
			t.Errorf("plan %s reads back as %+v, want %+v", n, got, p)
		}
	}
}
