// Package services assembles the domain services (tenants, API keys, tasks, HTTP
// agents, model pools, webhook endpoints, admin credentials) over one Postgres pool
// and, when given, one Redis, the same way for every caller: the library, the HTTP
// API and the CLI. It also owns the change messages through which a process that
// changed a key, a tenant or an admin credential tells the others' caches.
package services

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/billing/usage"
	"github.com/agentq/agentq/billing/webhooks"
	"github.com/agentq/agentq/internal/agents"
	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/credentials"
	"github.com/agentq/agentq/internal/keys"
	"github.com/agentq/agentq/internal/pools"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
	"github.com/agentq/agentq/quotas/capacity"
	"github.com/agentq/agentq/scheduler"
)

// Scheduler is what the services need of the scheduler: the tenants service applies
// a changed tenant's weight and running cap, the tasks service queues, removes and
// explains waiting tasks.
type Scheduler interface {
	tenants.Scheduler
	tasks.Queue
}

// Agents is what the services need of the runtime's agent registry: judging a task's
// input for its agent, and naming the in-process agents HTTP agents may not shadow.
type Agents interface {
	ValidateTask(ctx context.Context, agent string, input json.RawMessage) error
	Local(name string) bool
}

// Deps are what the services are built on. Pool and Plans are required.
type Deps struct {
	Pool  *pgxpool.Pool
	Plans *quotas.Catalogue // with the deployment's global limits applied
	// Redis, when set, carries change messages to the other processes' caches, and is
	// where the scheduler and the key limit state live. Without it changes reach the
	// other processes when their cache entries expire (within a second).
	Redis redis.UniversalClient
	Keys  rkeys.Keys
	// Scheduler: nil with Redis is a scheduler over Redis and Keys; nil without Redis,
	// a changed tenant's weight applies at its next submission.
	Scheduler Scheduler
	// Admission and Agents are needed for Tasks; without either, Tasks is nil.
	Admission *admission.Guard
	Agents    Agents
	// Lifecycle makes the tasks' state changes; nil: one over the pool whose only
	// subscriber is a task's end's effects (tasks.Ends). A process gives every part
	// the same one, so each change is written the same way.
	Lifecycle *tasks.Lifecycle
	// Tenants, when set, is the tenants service (NewTenants), made before the
	// lifecycle whose subscribers read the tenants' policies; nil: New makes it.
	Tenants *tenants.Service
	// Webhooks configures the webhook endpoint service (the rotation grace, the
	// clock).
	Webhooks webhooks.WebhooksOptions
	// Archetype is where the services log and the task submissions are traced
	// (their admission); nil: the defaults. It is the webhook service's too when
	// Webhooks names none.
	Archetype *baseservice.Archetype
	// AdminToken and AdminTokens are the admin credentials the environment defines
	// (AGENTQ_ADMIN_TOKEN, AGENTQ_ADMIN_TOKENS); the others are stored.
	AdminToken  string
	AdminTokens []config.AdminCredential
}

// NewTenants returns the tenants service New builds on d. A caller that needs the
// tenants' policies and cache before the other services (the task lifecycle's
// subscribers) builds it first and gives it to New as Deps.Tenants.
func NewTenants(d Deps) *tenants.Service {
	st := store.New(d.Pool)
	return tenants.New(st, d.Plans, d.base(st).tenants)
}

// base is what every service of d is built on: the scheduler, the limit state, and
// the tenants' and keys' options over them.
type base struct {
	sched   Scheduler
	q       *admission.Store // the limit state; nil without Redis
	live    *capacity.Pools  // the pools' live state; nil without Redis
	tenants tenants.Options
	keys    keys.Options
	creds   credentials.Options
}

func (d Deps) base(st *store.Store) base {
	b := base{sched: d.Scheduler, keys: keys.Options{Archetype: d.Archetype},
		tenants: tenants.Options{Archetype: d.Archetype, Announcer: outbox.LimitsAnnouncer{}},
		creds:   credentials.Options{Bootstrap: d.AdminToken, Env: d.AdminTokens, Archetype: d.Archetype}}
	if b.sched == nil && d.Redis != nil {
		b.sched = scheduler.New(d.Redis, d.Keys, scheduler.Options{})
	}
	if b.sched != nil {
		b.tenants.Scheduler = b.sched
	}
	if d.Redis != nil {
		pub := &Publisher{Redis: d.Redis, Keys: d.Keys}
		b.tenants.Invalidator, b.keys.Invalidator, b.creds.Invalidator = pub, pub, pub
	}
	switch {
	case d.Admission != nil:
		b.q = d.Admission.Quotas()
	case d.Redis != nil:
		b.q = admission.New(d.Redis, d.Keys, nil)
		// A tenant's new billing anchor re-seeds its monthly counters from the ledger.
		b.q.SetUsageSource(usage.NewLedger(st), d.Archetype)
	}
	if b.q != nil {
		b.keys.Limits, b.tenants.Counters = b.q, b.q
	}
	if d.Redis != nil {
		b.live = capacity.NewPools(d.Redis, d.Keys, nil)
	}
	return b
}

// Services are the domain services of one process.
type Services struct {
	Tenants *tenants.Service
	Keys    *keys.Service
	Tasks   *tasks.Service // nil without Deps.Admission or Deps.Agents
	Agents  *agents.Service
	Events  *outbox.Feed // the usage events feeds
	// Webhooks manages the endpoints the relays deliver the usage events to.
	Webhooks *webhooks.Webhooks
	Usage    *usage.Rollups // the usage rollups and their export
	// Pools manages the model pools and the agents bound to them; its Binding is the
	// workers' per-step lookup.
	Pools *pools.Service
	// Credentials are the admin credentials: the environment's and the stored ones.
	Credentials *credentials.Service
	// Audit reads, verifies and reverts the audit log the other services append to.
	Audit *audit.Log
}

// New builds the services on d.
func New(d Deps) *Services {
	st := store.New(d.Pool)
	events := outbox.NewFeed(st)
	b := d.base(st)
	s := &Services{
		Tenants:     d.Tenants,
		Keys:        keys.New(st, b.keys),
		Events:      events,
		Usage:       usage.NewRollups(st),
		Credentials: credentials.New(st, b.creds),
	}
	if s.Tenants == nil {
		s.Tenants = tenants.New(st, d.Plans, b.tenants)
	}
	sched, live := b.sched, b.live
	wo := d.Webhooks
	if wo.EndpointLimit == nil {
		wo.EndpointLimit = s.Tenants.WebhookEndpointLimit
	}
	if wo.Archetype == nil {
		wo.Archetype = d.Archetype
	}
	s.Webhooks = webhooks.NewWebhooks(st, wo)
	var local agents.Local
	if d.Agents != nil {
		local = d.Agents
	}
	s.Agents = agents.New(st, local)
	s.Pools = pools.New(pools.Deps{Store: st, Capacity: live, Agents: local})
	s.Audit = newAudit(st, s)
	if d.Admission != nil && d.Agents != nil && sched != nil && d.Redis != nil {
		lc := d.Lifecycle
		if lc == nil {
			// Its only subscriber: what follows a task's end.
			ed := tasks.EndsDeps{Leases: d.Admission.Quotas(), Queue: sched, Redis: d.Redis, Keys: d.Keys, Log: d.Archetype.Defaults().Logger}
			if live != nil {
				ed.Pools = live
			}
			lc = tasks.NewLifecycle(st, tasks.LifecycleOptions{Archetype: d.Archetype, Subscribers: []tasks.Subscriber{tasks.NewEnds(ed)}})
		}
		s.Tasks = tasks.New(tasks.Deps{
			Store: st, Tenants: s.Tenants, Admission: d.Admission, Queue: sched, Agents: d.Agents,
			Redis: d.Redis, Keys: d.Keys, Tenant: s.Tenants.Lookup, Lifecycle: lc,
			Archetype: d.Archetype,
		})
	}
	return s
}

// newAudit is the audit log over st, reverting through the services of s.
func newAudit(st *store.Store, s *Services) *audit.Log {
	l := audit.NewLog(st)
	l.Handle(audit.KindTenant, s.Tenants.Revert)
	l.Handle(audit.KindPool, s.Pools.RevertPool)
	l.Handle(audit.KindBinding, s.Pools.RevertBinding)
	l.Handle(audit.KindAgent, s.Agents.Revert)
	l.Handle(audit.KindWebhook, s.Webhooks.Revert)
	return l
}

// Change is what a change message says changed.
type Change int

// Changes.
const (
	NoChange Change = iota
	KeyChanged
	TenantChanged
	CredentialChanged
)

// Publisher tells the other processes' caches, on Keys.KeysChangedChannel, that a key,
// a tenant or an admin credential changed. It is the key, tenant and credential
// services' Invalidator.
type Publisher struct {
	Redis redis.UniversalClient
	Keys  rkeys.Keys
}

// InvalidateKey publishes that key kid changed.
func (p *Publisher) InvalidateKey(ctx context.Context, kid string) error {
	return p.Redis.Publish(ctx, p.Keys.KeysChangedChannel(), rkeys.KeyChanged(kid)).Err()
}

// InvalidateTenant publishes that tenant id changed.
func (p *Publisher) InvalidateTenant(ctx context.Context, id string) error {
	return p.Redis.Publish(ctx, p.Keys.KeysChangedChannel(), rkeys.TenantChanged(id)).Err()
}

// InvalidateCredential publishes that admin credential name changed.
func (p *Publisher) InvalidateCredential(ctx context.Context, name string) error {
	return p.Redis.Publish(ctx, p.Keys.KeysChangedChannel(), rkeys.CredentialChanged(name)).Err()
}

// ParseChange reads a message of Keys.KeysChangedChannel: what changed and its id
// (the kid, the tenant id or the credential's name), or NoChange for a message it
// does not know.
func ParseChange(msg string) (Change, string) {
	if name, ok := rkeys.ParseCredentialChanged(msg); ok {
		return CredentialChanged, name
	}
	switch kid, tenant := rkeys.ParseChanged(msg); {
	case kid != "":
		return KeyChanged, kid
	case tenant != "":
		return TenantChanged, tenant
	}
	return NoChange, ""
}
