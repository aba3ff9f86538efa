package agentq

import (
	"context"
	"errors"
	"time"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/keys"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
)

// The tenant, key and task operations of App go through the same domain services as
// the HTTP API and `agentq admin`, so a Go program is held to the same rules and gets
// the same refusals, with the same sentences.

// Errors the operations return, matched with errors.Is.
var (
	// ErrNotFound: no tenant, key or task by that id (for a task: none of the
	// tenant's).
	ErrNotFound = agentqtype.ErrNotFound
	// ErrExists: CreateTenant found the id taken.
	ErrExists = tenants.ErrExists
	// ErrUnavailable: a backing service (Postgres, Redis) cannot be reached or is not
	// taking work now; a retry later may pass. A task refused for it spent no limit.
	ErrUnavailable = agentqtype.ErrUnavailable
)

// InvalidError is a refused field of a tenant, an API key or a task (Field: e.g.
// "id", "plan", "weight", "overrides", "agent", "budget"). Message is the sentence
// the HTTP API answers with. The domain services return this very type.
type InvalidError = agentqtype.InvalidError

// libraryErr turns the domain services' errors into the library's: a call without a
// tenant is an *InvalidError, a task service's refusal its library type (taskErr);
// any other error is returned as it is.
func libraryErr(err error) error {
	if errors.Is(err, tasks.ErrNoTenant) {
		return &InvalidError{Field: "tenant", Message: "A tenant id is required."}
	}
	return taskErr(err)
}

// Tenant is a customer of the deployment.
type Tenant struct {
	ID   string
	Name string
	Plan string
	// Weight is the tenant's own fair-share weight; nil takes its plan's.
	Weight *int
	// EffectiveWeight is the weight the scheduler uses: Weight, or the plan's.
	EffectiveWeight int
	// Overrides replace limits of the plan for this tenant, by limit name.
	Overrides map[string]quotas.Limit
	Status    string // "active" or "suspended"
	CreatedAt time.Time
	UpdatedAt time.Time
}

// NewTenant are the fields of a tenant to create.
type NewTenant struct {
	// ID is 1 to 63 letters, digits, '-' or '_', starting with a letter or digit.
	ID string
	// Name is shown to operators; nil is the id.
	Name *string
	// Plan names a plan of the catalogue (required).
	Plan string
	// Weight is the fair-share weight, 1 to 1000; nil takes the plan's.
	Weight *int
	// Overrides replace limits of the plan: a number is the limit (0 allows nothing),
	// quotas.Unlimited turns it off.
	Overrides map[string]quotas.Limit
}

// TenantUpdate changes the fields of a tenant that are not nil.
type TenantUpdate struct {
	Name   *string
	Plan   *string
	Weight *int
	// Overrides, when not nil, replace every override (an empty map removes them).
	Overrides map[string]quotas.Limit
	Status    *string // "active" or "suspended"
}

func (a *App) tenantOf(t tenants.Tenant) Tenant {
	p, _ := a.services.Tenants.Policy(t) // a plan missing from the catalogue still has a weight
	return Tenant{
		ID: t.ID, Name: t.Name, Plan: t.Plan, Weight: t.Weight, EffectiveWeight: p.Weight,
		Overrides: t.Overrides, Status: t.Status, CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt,
	}
}

// CreateTenant creates an active tenant. A refused field is an *InvalidError; an id
// already taken is ErrExists.
func (a *App) CreateTenant(ctx context.Context, p NewTenant) (Tenant, error) {
	var plan *string
	if p.Plan != "" {
		plan = &p.Plan
	}
	t, err := a.services.Tenants.Create(ctx, tenants.CreateParams{
		ID: p.ID, Name: p.Name, Plan: plan, Weight: p.Weight, Overrides: p.Overrides,
	})
	if err != nil {
		return Tenant{}, libraryErr(err)
	}
	return a.tenantOf(t), nil
}

// UpdateTenant changes tenant id. A new weight or running cap applies to its queued
// tasks at once, and every API replica sees the change within a second. A refused
// field is an *InvalidError; a missing tenant ErrNotFound.
func (a *App) UpdateTenant(ctx context.Context, id string, p TenantUpdate) (Tenant, error) {
	t, err := a.services.Tenants.Update(ctx, tenants.UpdateParams{
		ID: id, Name: p.Name, Plan: p.Plan, Weight: p.Weight, Overrides: p.Overrides, Status: p.Status,
	})
	if err != nil {
		return Tenant{}, libraryErr(err)
	}
	return a.tenantOf(t), nil
}

// GetTenant returns tenant id, or ErrNotFound.
func (a *App) GetTenant(ctx context.Context, id string) (Tenant, error) {
	t, err := a.services.Tenants.Get(ctx, id)
	if err != nil {
		return Tenant{}, err
	}
	return a.tenantOf(t), nil
}

// ListTenants returns every tenant, by id.
func (a *App) ListTenants(ctx context.Context) ([]Tenant, error) {
	ts, err := a.services.Tenants.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Tenant, 0, len(ts))
	for _, t := range ts {
		out = append(out, a.tenantOf(t))
	}
	return out, nil
}

// NewAPIKey are the fields of an API key to create.
type NewAPIKey struct {
	TenantID string
	// Agents the key may run, and Principals (users) it may act for; empty allows
	// all. Entries are 1 to 255 bytes without control characters.
	Agents, Principals []string
}

// APIKey is a new API key. Token is what HTTP clients send (Authorization: Bearer
// <Token>); it is shown this once and never stored.
type APIKey struct {
	// Kid identifies the key (in the admin API and the logs); it is not a secret.
	Kid      string
	TenantID string
	// Token is the secret the key's holder presents.
	Token string
	// Agents and Principals are the key's scopes; empty allows all.
	Agents     []string
	Principals []string
	CreatedAt  time.Time
}

// CreateAPIKey creates an API key for the HTTP API. A refused scope entry is an
// *InvalidError; a missing tenant ErrNotFound.
func (a *App) CreateAPIKey(ctx context.Context, p NewAPIKey) (APIKey, error) {
	k, err := a.services.Keys.Create(ctx, keys.CreateParams{
		TenantID: p.TenantID, Scopes: keys.Scopes{Agents: p.Agents, Principals: p.Principals},
	})
	if err != nil {
		return APIKey{}, libraryErr(err)
	}
	return APIKey{Kid: k.Kid, TenantID: k.TenantID, Token: k.Plaintext, Agents: k.Scopes.Agents,
		Principals: k.Scopes.Principals, CreatedAt: k.CreatedAt}, nil
}
