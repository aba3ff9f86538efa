package quotas

import (
	"strings"
	"testing"
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
