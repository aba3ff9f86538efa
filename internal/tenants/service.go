package tenants

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/golang-lru/v2/expirable"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// Tenant is a stored tenant.
type Tenant = store.Tenant

// ErrExists is returned when Create finds the id taken; a tenant that does not exist
// is agentqtype.ErrNotFound. Match them with errors.Is.
var ErrExists = store.ErrConflict

// invalid is a refused tenant field: id, name, plan, weight, overrides, status,
// billing_day or time_zone.
func invalid(field, format string, args ...any) *agentqtype.InvalidError {
	return agentqtype.Invalid(field, format, args...)
}

// Scheduler is what the service needs of the scheduler: applying a tenant's new
// weight and running cap to its queued backlog.
type Scheduler interface {
	Configure(ctx context.Context, tenantID string, weight, runningCap int) error
}

// Invalidator tells the other processes' tenant caches that a tenant changed, so
// they apply its new plan, limits or status at once rather than when their cache
// entry expires. The service drops its own entry itself.
type Invalidator interface {
	InvalidateTenant(ctx context.Context, id string) error
}

// Counters is what the service needs of the quota counters: re-seeding a tenant's
// monthly counters from the ledger for the period its new billing anchor puts now in
// (admission.Seeder.ReseedAnchor).
type Counters interface {
	ReseedAnchor(ctx context.Context, tenantID string, anchor quotas.Anchor) (bool, error)
}

// Announcer writes, on the transaction of a tenant's change from old to t, the event
// of its limits' change (tenant.limits_changed, billing/outbox), if they moved; auditID
// and auditHash name the change's audit row.
type Announcer interface {
	LimitsChanged(ctx context.Context, tx *store.Store, old, t Tenant, auditID int64, auditHash string) error
}

// Service creates, changes and reads tenants.
type Service struct {
	store     *store.Store
	plans     *quotas.Catalogue
	policies  *Policies
	sched     Scheduler
	inval     Invalidator
	counters  Counters
	announcer Announcer
	log       *slog.Logger
	cache     *expirable.LRU[string, Tenant]
}

// Options are a Service's optional collaborators.
type Options struct {
	// Scheduler, when set, gets a changed tenant's weight and running cap at once;
	// without it they apply at the tenant's next submission.
	Scheduler Scheduler
	// Invalidator, when set, tells other processes of a changed tenant; without it
	// they see the change when their cache entry expires.
	Invalidator Invalidator
	// Counters, when set, gets a tenant whose billing anchor changed, to re-seed its
	// monthly quota counters for the new period; without it they keep the old period's
	// until Redis loses them.
	Counters Counters
	// Announcer, when set, writes the event of a change of a tenant's limits with the
	// change; without it none is written.
	Announcer Announcer
	// Archetype is where the service logs; nil: the defaults.
	Archetype *baseservice.Archetype
	// CacheTTL bounds how long Lookup trusts a cached tenant (default 1s).
	CacheTTL time.Duration
}

// DefaultCacheTTL is Options.CacheTTL's default.
const DefaultCacheTTL = time.Second

// cacheSize bounds the cached tenants.
const cacheSize = 10000

// New returns a Service over st, judging tenants against plans (with the
// deployment's global limits applied).
func New(st *store.Store, plans *quotas.Catalogue, o Options) *Service {
	s := &Service{store: st, plans: plans, policies: NewPolicies(plans, cacheSize), sched: o.Scheduler, inval: o.Invalidator, counters: o.Counters, announcer: o.Announcer, log: o.Archetype.Defaults().Logger}
	ttl := o.CacheTTL
	if ttl <= 0 {
		ttl = DefaultCacheTTL
	}
	s.cache = expirable.NewLRU[string, Tenant](cacheSize, nil, ttl)
	return s
}

// Plans is the catalogue the service judges tenants against.
func (s *Service) Plans() *quotas.Catalogue { return s.plans }

// Policy is PolicyOf with the service's catalogue, remembered per tenant while its
// plan, weight and overrides stay the same (see Policies).
func (s *Service) Policy(t Tenant) (Policy, error) { return s.policies.Policy(t) }

var idRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_-]{0,62}$`)

// Weight bounds.
const (
	MinWeight = 1
	MaxWeight = 1000
)

// maxName is the longest name, in bytes.
const maxName = 200

// CreateParams are a new tenant's fields. A nil field is one not given.
type CreateParams struct {
	ID        string
	Name      *string // default: the id
	Plan      *string // required
	Weight    *int    // default: the plan's
	Overrides map[string]quotas.Limit
	// Status must be nil: a tenant starts active, and its status changes with Update.
	Status *string
	// BillingDay (1 to 31) and TimeZone (an IANA zone name) are the billing anchor:
	// periods start at 00:00 in the zone on that day of the month, clamped to the
	// month's last day. Defaults: the UTC day of the tenant's creation, UTC.
	BillingDay *int
	TimeZone   *string
}

// UpdateParams change the non-nil fields of tenant ID. Overrides, when set, replace
// the whole override map.
type UpdateParams struct {
	ID        string
	Name      *string
	Plan      *string
	Weight    *int
	Overrides map[string]quotas.Limit
	Status    *string // active or suspended
	// BillingDay and TimeZone change the billing anchor (see CreateParams). A change
	// rewrites the tenant's usage rollups from the ledger under the new anchor: the
	// current period's in the same transaction, the earlier ones after it commits, a
	// period at a time; and it re-seeds the tenant's monthly quota counters.
	BillingDay *int
	TimeZone   *string
}

// Create validates p and inserts the tenant. A refused field is an
// *agentqtype.InvalidError; an id already taken is ErrExists.
func (s *Service) Create(ctx context.Context, p CreateParams) (Tenant, error) {
	if !idRE.MatchString(p.ID) {
		return Tenant{}, invalid("id", "id is required: 1 to 63 letters, digits, '-' or '_', starting with a letter or digit.")
	}
	if p.Plan == nil {
		return Tenant{}, invalid("plan", "plan is required.")
	}
	if p.Status != nil {
		return Tenant{}, invalid("status", "status is set with PATCH, not at creation.")
	}
	if err := s.validateFields(p.Name, p.Plan, p.Weight, p.Overrides, p.Status); err != nil {
		return Tenant{}, err
	}
	if err := s.checkKeyLimits(*p.Plan, p.Overrides); err != nil {
		return Tenant{}, err
	}
	if err := validateAnchor(p.BillingDay, p.TimeZone); err != nil {
		return Tenant{}, err
	}
	name := p.ID
	if p.Name != nil {
		name = *p.Name
	}
	var t Tenant
	err := s.store.InTx(ctx, func(tx *store.Store) error {
		var err error
		t, err = tx.CreateTenant(ctx, store.CreateTenantParams{
			ID: p.ID, Name: name, Plan: *p.Plan, Weight: p.Weight, Overrides: p.Overrides,
			BillingDay: p.BillingDay, TimeZone: p.TimeZone,
		})
		if err != nil {
			return err
		}
		_, err = audit.Append(ctx, tx, audit.Entry{Action: audit.ActionTenantCreate, Object: object(t.ID), After: audit.Tenant(t)})
		return err
	})
	if err != nil {
		return Tenant{}, err
	}
	return t, nil
}

// object is tenant id as the audit log names it.
func object(id string) audit.Object {
	return audit.Object{Kind: audit.KindTenant, ID: id, Tenant: id}
}

// Update validates p and applies it, then hands the tenant's weight and running cap
// to the scheduler. A refused field is an *agentqtype.InvalidError; a missing tenant
// agentqtype.ErrNotFound.
func (s *Service) Update(ctx context.Context, p UpdateParams) (Tenant, error) {
	if p.ID == "" {
		return Tenant{}, agentqtype.ErrNotFound // no tenant has an empty id
	}
	if err := s.validateFields(p.Name, p.Plan, p.Weight, p.Overrides, p.Status); err != nil {
		return Tenant{}, err
	}
	if err := validateAnchor(p.BillingDay, p.TimeZone); err != nil {
		return Tenant{}, err
	}
	if p.Plan != nil || p.Overrides != nil {
		cur, err := s.store.GetTenant(ctx, p.ID)
		if err != nil {
			return Tenant{}, err
		}
		plan, ov := cur.Plan, cur.Overrides
		if p.Plan != nil {
			plan = *p.Plan
		}
		if p.Overrides != nil {
			ov = p.Overrides
		}
		if err := s.checkKeyLimits(plan, ov); err != nil {
			return Tenant{}, err
		}
	}
	t, _, err := s.change(ctx, p.ID, nil, func(tx *store.Store) (Tenant, error) {
		return tx.UpdateTenant(ctx, store.UpdateTenantParams{
			ID: p.ID, Name: p.Name, Plan: p.Plan, Weight: p.Weight, Overrides: p.Overrides, Status: p.Status,
			BillingDay: p.BillingDay, TimeZone: p.TimeZone,
		})
	})
	return t, err
}

// change makes one change of tenant id with write, in a transaction with its audit
// row (the revert of row revert, when set: refused unless the tenant is still as
// that row left it) and, when its limits moved, its tenant.limits_changed; then what
// follows from it.
func (s *Service) change(ctx context.Context, id string, revert *audit.Row, write func(tx *store.Store) (Tenant, error)) (Tenant, audit.Head, error) {
	var t Tenant
	var head audit.Head
	var moved bool
	err := s.store.InTx(ctx, func(tx *store.Store) error {
		old, err := tx.LockTenant(ctx, id)
		if err != nil {
			return err
		}
		if revert != nil {
			if err := audit.Check(*revert, audit.Tenant(old)); err != nil {
				return err
			}
		}
		if t, err = write(tx); err != nil {
			return err
		}
		moved = old.Anchor() != t.Anchor()
		if err := s.derive(ctx, tx, old, t); err != nil {
			return err
		}
		head, err = s.record(ctx, tx, old, t, revert)
		return err
	})
	if err != nil {
		return Tenant{}, head, err
	}
	s.changed(ctx, t, moved)
	return t, head, nil
}

// derive writes, in the change's transaction, what a tenant's change from old to t
// implies for its usage records.
func (s *Service) derive(ctx context.Context, tx *store.Store, old, t Tenant) error {
	if old.Anchor() != t.Anchor() {
		// The rollups' days and periods were cut by the old anchor: the current
		// period is rewritten here, the earlier ones once this commits (rebuild).
		if err := tx.UnscopedRebuildRollups(ctx, store.RebuildRollupsParams{
			TenantID: t.ID, From: t.UpdatedAt, To: t.UpdatedAt.Add(time.Nanosecond),
		}); err != nil {
			return err
		}
	}
	if old.Plan != t.Plan {
		// The periods keep the plan that was in force in them, for the usage export.
		return tx.UnscopedRecordPlanChange(ctx, store.PlanChangeParams{Tenant: t, OldPlan: old.Plan})
	}
	return nil
}

// record appends the audit row of a tenant's change from old to t and, when its
// limits moved, writes its tenant.limits_changed, on tx.
func (s *Service) record(ctx context.Context, tx *store.Store, old, t Tenant, revert *audit.Row) (audit.Head, error) {
	e := audit.Entry{Action: audit.ActionTenantUpdate, Object: object(t.ID), Before: audit.Tenant(old), After: audit.Tenant(t)}
	if revert != nil {
		e = audit.RevertOf(*revert, e.Before, e.After)
	}
	head, err := audit.Append(ctx, tx, e)
	if err != nil {
		return head, err
	}
	if s.announcer == nil {
		return head, nil
	}
	return head, s.announcer.LimitsChanged(ctx, tx, old, t, head.ID, head.Hash)
}

// changed is what follows a committed change of t: the caches, the quota counters and
// rollups of a moved anchor, the scheduler's weight and cap.
func (s *Service) changed(ctx context.Context, t Tenant, moved bool) {
	s.cache.Remove(t.ID)
	if s.inval != nil {
		if err := s.inval.InvalidateTenant(ctx, t.ID); err != nil {
			s.log.Warn("invalidating a changed tenant failed; other processes catch up within the cache TTL", "tenant_id", t.ID, "err", err)
		}
	}
	if moved {
		// The change is committed: a caller that goes away now must not cut short
		// what follows from it.
		done := context.WithoutCancel(ctx)
		s.reseed(done, t)
		s.rebuild(done, t)
	}
	if pol, err := s.Policy(t); err == nil && s.sched != nil {
		if err := s.sched.Configure(ctx, t.ID, pol.Weight, pol.RunningCap); err != nil {
			s.log.Warn("applying new weight/cap to the queued backlog failed; it applies at the next submission", "tenant_id", t.ID, "err", err)
		}
	}
}

// reseed re-seeds the monthly quota counters of a tenant whose billing anchor changed,
// once the change is committed (the ledger read then places every step by the new
// anchor). A failure is logged: the change stands, and the counters are corrected when
// Redis next loses them or the operator re-seeds them by changing the anchor again.
func (s *Service) reseed(ctx context.Context, t Tenant) {
	if s.counters == nil {
		return
	}
	if _, err := s.counters.ReseedAnchor(ctx, t.ID, t.Anchor()); err != nil {
		s.log.Error("re-seeding the quota counters for a new billing anchor failed", "tenant_id", t.ID, "err", err)
	}
}

// rebuild rewrites the usage rollups of a tenant whose billing anchor changed, once
// the change is committed: all of them, a billing period per transaction (a
// transaction over the tenant's whole history would hold back every tenant's events
// feed and webhooks while it ran). A failure is logged: the change and its current
// period stand, and Rollups.Rebuild with no range finishes the rest.
func (s *Service) rebuild(ctx context.Context, t Tenant) {
	if err := s.store.UnscopedRebuildRollups(ctx, store.RebuildRollupsParams{TenantID: t.ID}); err != nil {
		s.log.Error("rewriting the usage rollups for a new billing anchor failed; the current period is rewritten, earlier ones may still follow the old anchor",
			"tenant_id", t.ID, "err", err)
	}
}

// Get returns tenant id, or agentqtype.ErrNotFound.
func (s *Service) Get(ctx context.Context, id string) (Tenant, error) {
	if id == "" {
		return Tenant{}, agentqtype.ErrNotFound // no tenant has an empty id
	}
	return s.store.GetTenant(ctx, id)
}

// Lookup is Get through the service's cache, for the hot path (every API request
// reads its tenant): a tenant may be up to the cache TTL stale, unless the process
// that changed it reached this one through its Invalidator (see Forget).
func (s *Service) Lookup(ctx context.Context, id string) (Tenant, error) {
	if t, ok := s.cache.Get(id); ok {
		return t, nil
	}
	t, err := s.store.GetTenant(ctx, id)
	if err != nil {
		return t, err
	}
	s.cache.Add(id, t)
	return t, nil
}

// Forget drops tenant id from Lookup's cache (another process changed it).
func (s *Service) Forget(id string) { s.cache.Remove(id) }

// ForgetAll empties Lookup's cache.
func (s *Service) ForgetAll() { s.cache.Purge() }

// List returns every tenant, ordered by id.
func (s *Service) List(ctx context.Context) ([]Tenant, error) {
	return s.store.UnscopedListTenants(ctx)
}

func (s *Service) validateFields(name, plan *string, weight *int, overrides map[string]quotas.Limit, status *string) error {
	if name != nil && (strings.TrimSpace(*name) == "" || !validText(*name, maxName)) {
		return invalid("name", "name must be 1 to 200 bytes of text without control characters.")
	}
	if plan != nil {
		if _, ok := s.plans.Plan(*plan); !ok {
			return invalid("plan", "Unknown plan %q (plans: %s).", *plan, strings.Join(s.plans.Names(), ", "))
		}
	}
	if weight != nil && (*weight < MinWeight || *weight > MaxWeight) {
		return invalid("weight", "weight must be between 1 and 1000.")
	}
	if err := quotas.ValidateOverrides(overrides); err != nil {
		return invalid("overrides", "overrides: %v.", err)
	}
	if status != nil && *status != "active" && *status != "suspended" {
		return invalid("status", "status must be active or suspended.")
	}
	return nil
}

// validateAnchor checks a billing anchor's fields: the same rule for the API and the
// CLI, which both come through here.
func validateAnchor(day *int, zone *string) error {
	if day != nil && (*day < 1 || *day > 31) {
		return invalid("billing_day", "billing_day must be between 1 and 31 (a month without that day starts its period on its last day).")
	}
	if zone != nil {
		if !validText(*zone, 64) {
			return invalid("time_zone", "time_zone must be an IANA time zone name such as Europe/Paris or UTC.")
		}
		if _, err := quotas.LoadZone(*zone); err != nil || *zone == "" {
			return invalid("time_zone", "time_zone %q is not an IANA time zone name (such as Europe/Paris or UTC).", *zone)
		}
	}
	return nil
}

// checkKeyLimits refuses limits that turn key limits off while the tenant limit is on:
// one unlimited key could then spend the whole tenant's bucket.
func (s *Service) checkKeyLimits(plan string, overrides map[string]quotas.Limit) error {
	pol, err := s.Policy(Tenant{Plan: plan, Overrides: overrides})
	if err != nil {
		return invalid("plan", "%v.", err)
	}
	if quotas.KeyLimitsOffAlone(pol.Effective) {
		return invalid("overrides",
			"overrides: key_rate unlimited disables key limits while tenant_rate is on; set tenant_rate to unlimited too, or keep a key_rate.")
	}
	return nil
}

// validText reports whether s is valid UTF-8 of at most max bytes without control
// characters (the API's rule for identifiers and names).
func validText(s string, max int) bool {
	return len(s) <= max && utf8.ValidString(s) && !strings.ContainsFunc(s, isControl)
}

func isControl(r rune) bool { return r < 0x20 || (r >= 0x7f && r <= 0x9f) }

// WebhookEndpointLimit is how many webhook endpoints of its own tenant id may have:
// its effective webhook_endpoints limit (quotas.Unlimited when its plan leaves the
// limit out, as for any limit).
func (s *Service) WebhookEndpointLimit(ctx context.Context, id string) (quotas.Limit, error) {
	t, err := s.Get(ctx, id)
	if err != nil {
		return 0, err
	}
	pol, err := s.Policy(t)
	if err != nil {
		return 0, err
	}
	if l, ok := pol.Effective[quotas.WebhookEndpoints]; ok {
		return l, nil
	}
	return quotas.Unlimited, nil
}
