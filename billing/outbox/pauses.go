package outbox

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// Pauses writes the events of tasks paused at a limit.
type Pauses struct {
	Events Events
	// Timeout is how long a task of the tenant may stay paused (its plan's
	// pause_timeout_s): the approval link expires with the pause.
	Timeout func(store.Tenant) time.Duration
	// Link returns the approval link of a task's pause, valid until expires; nil
	// writes the event without one.
	Link func(tenantID string, task uuid.UUID, pause int, expires time.Time) string
}

// Paused writes, on tx (the transaction that paused task t), the pause's
// usage.limit_hit: enforcement "paused", the limit that paused it, the task and the
// approval link of this pause. Every pause is its own event (its key names the task
// and the pause), because each carries the one link that resumes it; refusals and
// stops of the same limit keep their own windows.
func (p Pauses) Paused(ctx context.Context, tx *store.Store, t store.Task, stop *quotas.Stop) error {
	if t.State != agentqtype.TaskStatePaused || stop == nil {
		return nil
	}
	tenant, err := tx.GetTenant(ctx, t.TenantID)
	if err != nil {
		return fmt.Errorf("billing: the tenant of a limit_hit: %w", err)
	}
	at := time.Now()
	if t.Pause.At != nil {
		at = *t.Pause.At
	}
	r := budgetRefusal(t, tenant, at, stop)
	r.Enforcement, r.TaskID, r.RootID = EnforcementPaused, t.ID.String(), rootOf(t)
	d, _, err := refusalData(r)
	if err != nil {
		return err
	}
	if p.Link != nil {
		timeout := quotas.DefaultPauseTimeout
		if p.Timeout != nil {
			timeout = p.Timeout(tenant)
		}
		exp := at.Add(timeout).Truncate(time.Second).UTC()
		d.ApprovalURL, d.ApprovalExpires = p.Link(t.TenantID, t.ID, t.Pause.Count, exp), &exp
	}
	key := PauseKey(t.TenantID, stop.LimitType, t.ID, t.Pause.Count)
	ev, err := p.Events.build(TypeLimitHit, key, at, d)
	if err != nil {
		return err
	}
	_, err = WriteEvent(ctx, tx, ev)
	return err
}

// PauseKey is the dedupe key of a task's pause: "tenant|limit_type|task|pause n|paused".
func PauseKey(tenant, limitType string, task uuid.UUID, pause int) string {
	return tenant + "|" + limitType + "|" + task.String() + "|pause " + strconv.Itoa(pause) + "|paused"
}
