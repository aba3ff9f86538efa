package runtime

import "sync"

// maxTenantLabels bounds the tenant_id values a worker process puts on a metric: the
// first this many tenants it meters keep their own series, the others share one,
// tenant_id "other". A metric labelled by tenant would otherwise grow a series for
// every tenant that ever ran, for the process's lifetime.
const maxTenantLabels = 100

// otherTenants is the tenant_id of the tenants past maxTenantLabels.
const otherTenants = "other"

// tenantLabels hands out bounded tenant_id label values. The zero value is ready.
type tenantLabels struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

// label is tenant's tenant_id value: its id while the set of tenants seen is not
// full, else "other".
func (l *tenantLabels) label(tenant string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[tenant]; ok {
		return tenant
	}
	if len(l.seen) >= maxTenantLabels {
		return otherTenants
	}
	if l.seen == nil {
		l.seen = map[string]struct{}{}
	}
	l.seen[tenant] = struct{}{}
	return tenant
}
