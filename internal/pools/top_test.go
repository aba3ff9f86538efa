package pools

import (
	"fmt"
	"testing"

	"github.com/agentq/agentq/quotas"
)

// The entitlement gauge shows at most maxEntitlementSeries waiting tenants of a pool,
// those with the largest shares.
func TestTopWaitingIsBounded(t *testing.T) {
	t.Parallel()
	var ws []quotas.PoolWaiter
	for i := range 3 * maxEntitlementSeries {
		ws = append(ws, quotas.PoolWaiter{Tenant: fmt.Sprintf("t%03d", i), Weight: i + 1, Share: float64(i+1) / 1000})
	}
	top := topWaiting(ws, maxEntitlementSeries)
	if len(top) != maxEntitlementSeries || top[0].Tenant != ws[len(ws)-1].Tenant {
		t.Fatalf("top %d waiting, first %s; want %d, the largest share first", len(top), top[0].Tenant, maxEntitlementSeries)
	}
}
