package audit

import (
	"context"
	"time"

	"github.com/agentq/agentq/internal/store"
)

// Actions of the rows.
const (
	ActionTenantCreate = "tenant.create"
	ActionTenantUpdate = "tenant.update"
	ActionTenantRevert = "tenant.revert"
)

// LimitChange is a change to a tenant's own limits as the tenant sees it: what
// changed and when, never who or why.
type LimitChange struct {
	At      time.Time
	Changes []FieldChange
}

// limitFields are the fields of a tenant's state its panel shows changes of.
var limitFields = map[string]bool{"plan": true, "weight": true, "overrides": true, "status": true,
	"billing_day": true, "time_zone": true}

// TenantLimitChanges returns the newest changes (at most limit) to tenant's limits:
// its plan, weight, overrides, status and billing anchor.
func (l *Log) TenantLimitChanges(ctx context.Context, tenant string, limit int) ([]LimitChange, error) {
	rs, err := l.st.ListTenantAudit(ctx, store.ListTenantAuditParams{
		TenantID: tenant, Actions: []string{ActionTenantUpdate, ActionTenantRevert}, Limit: limit,
	})
	if err != nil {
		return nil, err
	}
	out := []LimitChange{}
	for _, r := range rs {
		d, err := Diff(orNull(r.Before), orNull(r.After))
		if err != nil {
			return nil, err
		}
		c := LimitChange{At: r.At.UTC()}
		for _, f := range d {
			if limitFields[f.Field] {
				c.Changes = append(c.Changes, f)
			}
		}
		if len(c.Changes) > 0 {
			out = append(out, c)
		}
	}
	return out, nil
}
