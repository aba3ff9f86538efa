package runtime

import (
	"fmt"
	"testing"
)

// A worker puts at most maxTenantLabels tenant ids on a metric: the tenants past them
// share "other", and a tenant seen before keeps its own.
func TestTenantLabelsAreBounded(t *testing.T) {
	t.Parallel()
	var l tenantLabels
	distinct := map[string]bool{}
	for i := range 3 * maxTenantLabels {
		distinct[l.label(fmt.Sprintf("t%d", i))] = true
	}
	if len(distinct) != maxTenantLabels+1 || !distinct[otherTenants] {
		t.Fatalf("%d label values for %d tenants; want %d and %q", len(distinct), 3*maxTenantLabels, maxTenantLabels+1, otherTenants)
	}
	if got := l.label("t0"); got != "t0" {
		t.Fatalf("a tenant seen first is labelled %q", got)
	}
}
