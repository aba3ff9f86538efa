package quotas

import (
	"strings"
	"testing"
)

func TestSLADefaults(t *testing.T) {
	c, err := LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	for plan, want := range map[string]SLA{
		"free":       NoSLA,
		"pro":        {StartWithinS: 60, PoolWaitWithinS: 30},
		"enterprise": {StartWithinS: 10, PoolWaitWithinS: 10},
	} {
		if got := c.SLAOf(plan, nil); got != want {
			t.Errorf("%s: %+v, want %+v", plan, got, want)
		}
	}
	got := c.SLAOf("pro", map[string]Limit{SLAStartWithin: 5, SLAPoolWaitWithin: Unlimited})
	if got != (SLA{StartWithinS: 5, PoolWaitWithinS: Unlimited}) {
		t.Errorf("overridden: %+v", got)
	}
	if got := c.SLAOf("gone", nil); got != NoSLA {
		t.Errorf("unknown plan: %+v", got)
	}
	if d, ok := Within(60); !ok || d.Seconds() != 60 {
		t.Errorf("Within(60) = %v %v", d, ok)
	}
	if _, ok := Within(Unlimited); ok {
		t.Error("unlimited is a commitment")
	}
}

func TestSLAOverridesValidated(t *testing.T) {
	for _, ok := range []map[string]Limit{{SLAStartWithin: 1}, {SLAPoolWaitWithin: 0.5}, {SLAStartWithin: Unlimited}} {
		if err := ValidateOverrides(ok); err != nil {
			t.Errorf("%v: %v", ok, err)
		}
	}
	for _, bad := range []map[string]Limit{{SLAStartWithin: 0}, {SLAPoolWaitWithin: -2}, {"sla_other_s": 5}} {
		if err := ValidateOverrides(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestSLACatalogue(t *testing.T) {
	base := "plans:\n  p:\n    limits: {running: 1}\n    budget: {default: {max_steps: 1, max_wallclock_s: 1, max_cost_usd: 1}, ceiling: {max_steps: 1, max_wallclock_s: 1, max_cost_usd: 1}}\n"
	c, err := ParseCatalogue([]byte(base + "    sla: {start_within_s: 20}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.SLAOf("p", nil); got != (SLA{StartWithinS: 20, PoolWaitWithinS: Unlimited}) {
		t.Errorf("a field left out must be no commitment: %+v", got)
	}
	for _, bad := range []string{
		base + "    sla: {start_within_s: 0}\n",
		base + "    sla: {start_within_s: soon}\n",
		base + "    sla: {start_in: 5}\n",
		strings.Replace(base, "{running: 1}", "{running: 1, sla_start_within_s: 5}", 1),
	} {
		if _, err := ParseCatalogue([]byte(bad)); err == nil {
			t.Errorf("accepted:\n%s", bad)
		}
	}
}
