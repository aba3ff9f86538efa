package e2e_test

import (
	"os"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/agentq/agentq/quotas"
)

// shippedPlans is the shipped plan catalogue as Go values, for a test to change.
func shippedPlans(t *testing.T) map[string]quotas.Plan {
	t.Helper()
	plans, err := loadShippedPlans()
	if err != nil {
		t.Fatal(err)
	}
	return plans
}

func loadShippedPlans() (map[string]quotas.Plan, error) {
	c, err := quotas.LoadCatalogue("")
	if err != nil {
		return nil, err
	}
	plans := make(map[string]quotas.Plan)
	for _, n := range c.Names() {
		plans[n], _ = c.Plan(n)
	}
	return plans, nil
}

// writePlans writes plans as a plan catalogue file (Config.PlansFile) at path.
func writePlans(path string, plans map[string]quotas.Plan) error {
	src, err := yaml.Marshal(map[string]any{"plans": plans})
	if err != nil {
		return err
	}
	if _, err := quotas.ParseCatalogue(src); err != nil {
		return err
	}
	return os.WriteFile(path, src, 0o600)
}

// plansFile writes plans to a catalogue file of the test's own and returns its path.
func plansFile(t *testing.T, plans map[string]quotas.Plan) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "plans-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := writePlans(f.Name(), plans); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}
