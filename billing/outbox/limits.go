package outbox

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"time"

	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// TypeLimitsChanged is the event of a change to a tenant's limits: its plan, weight,
// status, overrides or billing anchor.
const TypeLimitsChanged = "tenant.limits_changed"

// LimitsState is what a tenant.limits_changed shows of a tenant, before and after.
type LimitsState struct {
	Plan string `json:"plan"`
	// Weight is the tenant's own weight, null when it takes its plan's.
	Weight    *int                    `json:"weight"`
	Status    string                  `json:"status"`
	Overrides map[string]quotas.Limit `json:"overrides"`
	// BillingDay and TimeZone are the billing anchor in force.
	BillingDay int    `json:"billing_day"`
	TimeZone   string `json:"time_zone"`
}

// LimitsOf is t's state as the event shows it.
func LimitsOf(t store.Tenant) LimitsState {
	a := t.Anchor()
	ov := t.Overrides
	if ov == nil {
		ov = map[string]quotas.Limit{}
	}
	return LimitsState{Plan: t.Plan, Weight: t.Weight, Status: t.Status, Overrides: ov, BillingDay: a.Day, TimeZone: a.ZoneName()}
}

// AuditRef names the audit log's row of a change: the chain's head once it was
// written.
type AuditRef struct {
	ID   int64  `json:"id"`
	Hash string `json:"hash"`
}

// ActorRef is who made a change: the authority it proved (kind, name, role).
type ActorRef struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
	Role string `json:"role,omitempty"`
}

// LimitsChangedData is the data of a tenant.limits_changed. Actor, ClaimedActor and
// Reason are in the operators' copy only.
type LimitsChangedData struct {
	TenantID     string      `json:"tenant_id"`
	Changed      []string    `json:"changed"` // the fields of before and after that differ
	Before       LimitsState `json:"before"`
	After        LimitsState `json:"after"`
	Audit        AuditRef    `json:"audit"`
	Actor        *ActorRef   `json:"actor,omitempty"`
	ClaimedActor string      `json:"claimed_actor,omitempty"`
	Reason       string      `json:"reason,omitempty"`
}

// LimitsChange is a change of a tenant's limits to announce.
type LimitsChange struct {
	TenantID      string
	Before, After LimitsState
	Audit         AuditRef
	Actor         ActorRef
	ClaimedActor  string
	Reason        string
	At            time.Time
}

// Changed lists the fields that differ between c's before and after, nil when none
// does (no event is owed).
func (c LimitsChange) Changed() []string {
	b, _ := json.Marshal(c.Before)
	a, _ := json.Marshal(c.After)
	var bm, am map[string]json.RawMessage
	_ = json.Unmarshal(b, &bm)
	_ = json.Unmarshal(a, &am)
	var out []string
	for k, v := range am {
		if string(bm[k]) != string(v) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// LimitsChanged returns the two copies of c's tenant.limits_changed: the operators'
// (the admin feed, the operator's endpoints), naming who made the change and why,
// and the tenant's (its feed, its own endpoints), without them. Each is keyed by the
// change's audit row, so writing one again writes nothing.
func (e Events) LimitsChanged(c LimitsChange) (operator, tenant Event, err error) {
	d := LimitsChangedData{TenantID: c.TenantID, Changed: c.Changed(), Before: c.Before, After: c.After, Audit: c.Audit}
	key := TypeLimitsChanged + "|" + strconv.FormatInt(c.Audit.ID, 10)
	if tenant, err = e.buildData(TypeLimitsChanged, key+"|tenant", c.TenantID, c.At, d); err != nil {
		return operator, tenant, err
	}
	actor := c.Actor
	d.Actor, d.ClaimedActor, d.Reason = &actor, c.ClaimedActor, c.Reason
	if operator, err = e.buildData(TypeLimitsChanged, key+"|operator", c.TenantID, c.At, d); err != nil {
		return operator, tenant, err
	}
	tenant.Audience, operator.Audience = store.AudienceTenant, store.AudienceOperator
	return operator, tenant, nil
}

// LimitsAnnouncer writes a tenant's tenant.limits_changed on the transaction of its
// change (the tenant service's Announcer), as done by the actor of the change's
// context.
type LimitsAnnouncer struct{ Events Events }

// LimitsChanged writes the two copies of the tenant.limits_changed of a change from
// old to t, whose audit row is auditID (hash auditHash), on tx; nothing when the
// limits did not move.
func (a LimitsAnnouncer) LimitsChanged(ctx context.Context, tx *store.Store, old, t store.Tenant, auditID int64, auditHash string) error {
	who := audit.ActorOf(ctx)
	c := LimitsChange{TenantID: t.ID, Before: LimitsOf(old), After: LimitsOf(t), Audit: AuditRef{ID: auditID, Hash: auditHash},
		Actor: ActorRef{Kind: string(who.Kind), Name: who.Name, Role: string(who.Role)}, ClaimedActor: who.ClaimedActor,
		Reason: who.Reason, At: t.UpdatedAt}
	if len(c.Changed()) == 0 {
		return nil
	}
	op, own, err := a.Events.LimitsChanged(c)
	if err != nil {
		return err
	}
	if _, err := WriteEvent(ctx, tx, op); err != nil {
		return err
	}
	_, err = WriteEvent(ctx, tx, own)
	return err
}
