package quotas

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

func TestLimitReadsAndWritesNumbersAndUnlimited(t *testing.T) {
	var ov map[string]Limit
	in := `{"tenant_rate":5,"usd_monthly":"unlimited","ai_tokens_monthly":0}`
	if err := json.Unmarshal([]byte(in), &ov); err != nil {
		t.Fatal(err)
	}
	if ov[TenantRate] != 5 || !ov[USDMonthly].Off() || ov[AITokensMonthly] != 0 || ov[AITokensMonthly].Off() {
		t.Fatalf("decoded %v", ov)
	}
	out, _ := json.Marshal(ov)
	if string(out) != `{"ai_tokens_monthly":0,"tenant_rate":5,"usd_monthly":"unlimited"}` {
		t.Fatalf("encoded %s", out)
	}
	y, _ := yaml.Marshal(ov)
	var back map[string]Limit
	if err := yaml.Unmarshal(y, &back); err != nil || back[USDMonthly] != Unlimited || back[TenantRate] != 5 {
		t.Fatalf("yaml round trip %q: %v %v", y, back, err)
	}
	for _, bad := range []string{`{"x":-1}`, `{"x":"lots"}`, `{"x":null}`, `{"x":true}`} {
		if err := json.Unmarshal([]byte(bad), &ov); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	for name, ov := range map[string]map[string]Limit{
		"burst unlimited": {"tenant_rate_burst": Unlimited}, "burst 0": {"tenant_rate_burst": 0},
		"running 0": {Running: 0}, "negative": {TenantRate: -2},
	} {
		if ValidateOverrides(ov) == nil {
			t.Errorf("%s accepted", name)
		}
	}
	if err := ValidateOverrides(map[string]Limit{USDMonthly: 0, Running: Unlimited, ConcurrentSessions: 0}); err != nil {
		t.Fatal(err)
	}
}

func TestCatalogueZeroIsZeroUnlimitedIsOff(t *testing.T) {
	c, err := LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	free, _ := c.Effective("free", nil)
	if l := LimitsOf(free); l.USDMonthlyMicro != 0 || l.KeyAgentRate != Off || l.LongRunning != 0 {
		t.Fatalf("free: usd %d (want a $0 limit), key-agent %v (want off), long-running %d", l.USDMonthlyMicro, l.KeyAgentRate, l.LongRunning)
	}
	ent, _ := c.Effective("enterprise", map[string]Limit{ConcurrentSessions: 0})
	if l := LimitsOf(ent); l.TokensMonthly != Off || l.USDMonthlyMicro != Off || l.Sessions != 0 {
		t.Fatalf("enterprise: tokens %d usd %d (want off), sessions %d (want 0)", l.TokensMonthly, l.USDMonthlyMicro, l.Sessions)
	}
	if l := LimitsOf(map[string]Limit{}); l != NoLimits() {
		t.Fatalf("limits a map leaves out are off: %+v", l)
	}
	// unlimited beats any number in "upgrade for N"
	if next, ok := c.NextLimit(AITokensMonthly, 20_000_000); !ok || !next.Off() {
		t.Fatalf("next after 20M tokens: %v %v, want unlimited", next, ok)
	}
	if next, ok := c.NextLimit(ConcurrentSessions, 3); !ok || next != 20 {
		t.Fatalf("next after 3 sessions: %v %v", next, ok)
	}
	if _, ok := c.NextLimit(USDMonthly, 1e9); !ok {
		t.Fatal("enterprise's unlimited usd is above any number")
	}
	// the environment keeps "0 disables"
	zero := 0.0
	if err := c.ApplyGlobals(Globals{KeyRPS: &zero, TenantRPS: &zero, TenantMaxInflight: &zero}); err != nil {
		t.Fatal(err)
	}
	if p, _ := c.Plan("pro"); !p.Limits[KeyRate].Off() || !p.Limits[ConcurrentSessions].Off() {
		t.Fatalf("AGENTQ_RATE_KEY_RPS=0 / AGENTQ_TENANT_MAX_INFLIGHT=0 must turn the limits off: %v", p.Limits)
	}
	doc := "plans:\n  p:\n    limits: {key_rate: unlimited, tenant_rate: 5}\n" +
		"    budget:\n      default: {max_steps: 1, max_wallclock_s: 1, max_cost_usd: 1}\n" +
		"      ceiling: {max_steps: 1, max_wallclock_s: 1, max_cost_usd: 1}\n"
	c, err = ParseCatalogue([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ApplyGlobals(Globals{}); err == nil || !strings.Contains(err.Error(), "disables key limits") {
		t.Fatalf("key_rate unlimited with a tenant rate: %v", err)
	}
}

func TestPeriodIDsGrowWithTime(t *testing.T) {
	anchor := time.Date(2026, 1, 31, 0, 0, 0, 0, time.UTC)
	prev := PeriodAt(anchor, anchor)
	for range 30 {
		next := PeriodAt(anchor, prev.End)
		if next.ID <= prev.ID || len(next.ID) != 8 || next.Start != prev.End {
			t.Fatalf("period %s after %s", next.ID, prev.ID)
		}
		prev = next
	}
}

func TestPeriodAt(t *testing.T) {
	cases := []struct{ anchor, now, start, end string }{
		{"2026-01-15", "2026-11-30", "2026-11-15", "2026-12-15"},
		{"2026-01-15", "2026-11-14", "2026-10-15", "2026-11-15"},
		{"2026-01-31", "2026-02-28", "2026-02-28", "2026-03-31"},
		{"2026-01-31", "2026-03-01", "2026-02-28", "2026-03-31"},
		{"2026-01-01", "2026-12-31", "2026-12-01", "2027-01-01"},
	}
	for _, c := range cases {
		a, _ := time.Parse(time.DateOnly, c.anchor)
		n, _ := time.Parse(time.DateOnly, c.now)
		p := PeriodAt(a, n.Add(12*time.Hour))
		if p.Start.Format(time.DateOnly) != c.start || p.End.Format(time.DateOnly) != c.end {
			t.Errorf("anchor %s now %s: %s..%s, want %s..%s", c.anchor, c.now, p.Start.Format(time.DateOnly), p.End.Format(time.DateOnly), c.start, c.end)
		}
	}
}

func TestInflightLimitOfPlan(t *testing.T) {
	for _, c := range []struct {
		eff  map[string]Limit
		want int64
	}{{map[string]Limit{}, DefaultInflightRequests}, {map[string]Limit{InflightRequests: 5}, 5}, {map[string]Limit{InflightRequests: Unlimited}, 0}} {
		if got := InflightLimit(c.eff); got != c.want {
			t.Errorf("InflightLimit(%v) = %d, want %d", c.eff, got, c.want)
		}
	}
	cat, err := LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range cat.Names() {
		if p, _ := cat.Plan(name); p.Limits[InflightRequests] != 32 {
			t.Errorf("plan %s: inflight_requests %v, want 32", name, p.Limits[InflightRequests])
		}
	}
}
