package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/quotas"
)

// Tenant is a customer of the deployment.
type Tenant struct {
	ID        string
	Name      string
	Plan      string
	Weight    *int
	Overrides map[string]quotas.Limit
	Status    string
	// BillingDay is the day of the month the tenant's billing periods start on (1 to
	// 31, clamped to the month's last day); nil: the day of CreatedAt, in UTC.
	BillingDay *int
	// TimeZone is the IANA zone whose midnight starts its periods and days; nil: UTC.
	TimeZone *string
	// PanelLinksValidAfter: the tenant's panel links issued before it are revoked;
	// nil when none ever was (see RevokePanelLinks).
	PanelLinksValidAfter *time.Time
	CreatedAt            time.Time
	UpdatedAt            time.Time
}

// Anchor is the tenant's billing anchor (see quotas.Anchor): its BillingDay, or the
// UTC day of its creation, in its TimeZone, or UTC. A stored zone this build does not
// know (validated when it was written, so only after a zone was withdrawn from the
// zone database) counts as UTC.
func (t Tenant) Anchor() quotas.Anchor {
	return anchorOf(t.CreatedAt, t.BillingDay, t.TimeZone)
}

func anchorOf(createdAt time.Time, day *int, zone *string) quotas.Anchor {
	a := quotas.Anchor{Day: createdAt.UTC().Day()}
	if day != nil {
		a.Day = *day
	}
	if zone != nil {
		if l, err := quotas.LoadZone(*zone); err == nil && l != time.UTC {
			a.Zone = l
		}
	}
	return a
}

const tenantCols = `id, name, plan, weight, overrides, status, billing_day, time_zone, panel_links_valid_after, created_at, updated_at`

func scanTenant(row pgx.Row) (Tenant, error) {
	var t Tenant
	var ov []byte
	var day *int16
	if err := row.Scan(&t.ID, &t.Name, &t.Plan, &t.Weight, &ov, &t.Status, &day, &t.TimeZone, &t.PanelLinksValidAfter, &t.CreatedAt, &t.UpdatedAt); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return t, agentqtype.ErrNotFound
		}
		return t, err
	}
	if day != nil {
		d := int(*day)
		t.BillingDay = &d
	}
	t.Overrides = map[string]quotas.Limit{}
	if err := json.Unmarshal(ov, &t.Overrides); err != nil {
		return t, fmt.Errorf("store: tenant %s overrides: %w", t.ID, err)
	}
	return t, nil
}

// CreateTenantParams are the fields of a new tenant.
type CreateTenantParams struct {
	ID        string
	Name      string
	Plan      string
	Weight    *int
	Overrides map[string]quotas.Limit
	// BillingDay and TimeZone: the billing anchor; nil for the defaults.
	BillingDay *int
	TimeZone   *string
}

// CreateTenant inserts a tenant; ErrConflict if the id is taken, ErrNoTenant if it
// is empty.
func (s *Store) CreateTenant(ctx context.Context, p CreateTenantParams) (Tenant, error) {
	if p.ID == "" {
		return Tenant{}, ErrNoTenant
	}
	ov, err := json.Marshal(nonNil(p.Overrides))
	if err != nil {
		return Tenant{}, err
	}
	t, err := scanTenant(s.db.QueryRow(ctx,
		`INSERT INTO tenants (id, name, plan, weight, overrides, billing_day, time_zone) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING `+tenantCols,
		p.ID, p.Name, p.Plan, p.Weight, ov, p.BillingDay, p.TimeZone))
	if isUniqueViolation(err) {
		return t, fmt.Errorf("tenant %q: %w", p.ID, ErrConflict)
	}
	return t, err
}

// GetTenant returns a tenant by id; ErrNoTenant for an empty id.
func (s *Store) GetTenant(ctx context.Context, id string) (Tenant, error) {
	if id == "" {
		return Tenant{}, ErrNoTenant
	}
	return scanTenant(s.db.QueryRow(ctx, `SELECT `+tenantCols+` FROM tenants WHERE id = $1`, id))
}

// UnscopedGetTenants returns the tenants of ids that exist, by id, in one query
// (the refusal flush's, which reports on many tenants at once).
func (s *Store) UnscopedGetTenants(ctx context.Context, ids []string) (map[string]Tenant, error) {
	out := make(map[string]Tenant, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := s.db.Query(ctx, `SELECT `+tenantCols+` FROM tenants WHERE id = ANY($1)`, ids)
	ts, err := collect(rows, err, scanTenant)
	if err != nil {
		return nil, err
	}
	for _, t := range ts {
		out[t.ID] = t
	}
	return out, nil
}

// UnscopedListTenants returns every tenant, ordered by id (the operator's listing).
func (s *Store) UnscopedListTenants(ctx context.Context) ([]Tenant, error) {
	rows, err := s.db.Query(ctx, `SELECT `+tenantCols+` FROM tenants ORDER BY id`)
	return collect(rows, err, scanTenant)
}

// UpdateTenantParams changes the non-nil fields of a tenant. Overrides, when set,
// replace the whole override map.
type UpdateTenantParams struct {
	ID        string
	Name      *string
	Plan      *string
	Weight    *int
	Overrides map[string]quotas.Limit
	Status    *string
	// BillingDay and TimeZone change the billing anchor (see UnscopedRebuildRollups).
	BillingDay *int
	TimeZone   *string
}

// UpdateTenant applies p and returns the tenant as stored; ErrNoTenant for an empty
// id.
func (s *Store) UpdateTenant(ctx context.Context, p UpdateTenantParams) (Tenant, error) {
	if p.ID == "" {
		return Tenant{}, ErrNoTenant
	}
	var ov []byte
	if p.Overrides != nil {
		var err error
		if ov, err = json.Marshal(p.Overrides); err != nil {
			return Tenant{}, err
		}
	}
	return scanTenant(s.db.QueryRow(ctx, `
		UPDATE tenants SET
			name = COALESCE($2, name),
			plan = COALESCE($3, plan),
			weight = COALESCE($4, weight),
			overrides = COALESCE($5::jsonb, overrides),
			status = COALESCE($6, status),
			billing_day = COALESCE($7, billing_day),
			time_zone = COALESCE($8, time_zone),
			updated_at = now()
		WHERE id = $1 RETURNING `+tenantCols,
		p.ID, p.Name, p.Plan, p.Weight, ov, p.Status, p.BillingDay, p.TimeZone))
}

// UnscopedTenantIDsAfter returns up to limit tenant ids above after, in id order: the
// janitor's cursor walk over every tenant.
func (s *Store) UnscopedTenantIDsAfter(ctx context.Context, after string, limit int) ([]string, error) {
	rows, err := s.db.Query(ctx, `SELECT id FROM tenants WHERE id > $1 ORDER BY id LIMIT $2`, after, limit)
	return collect(rows, err, func(row pgx.Row) (string, error) {
		var id string
		err := row.Scan(&id)
		return id, err
	})
}

// LockTenant reads a tenant and locks its row for the rest of the transaction (FOR NO
// KEY UPDATE: rows that reference it can still be written), so that what a change
// records as before is what it changed; ErrNoTenant for an empty id.
func (s *Store) LockTenant(ctx context.Context, id string) (Tenant, error) {
	if id == "" {
		return Tenant{}, ErrNoTenant
	}
	return scanTenant(s.db.QueryRow(ctx, `SELECT `+tenantCols+` FROM tenants WHERE id = $1 FOR NO KEY UPDATE`, id))
}

// ReplaceTenantParams are a tenant's whole configuration; a nil Weight, BillingDay or
// TimeZone is the default (the plan's weight, the anchor's defaults).
type ReplaceTenantParams struct {
	ID         string
	Name       string
	Plan       string
	Weight     *int
	Overrides  map[string]quotas.Limit
	Status     string
	BillingDay *int
	TimeZone   *string
}

// ReplaceTenant sets every field of p on the tenant (a revert's restore, which may
// put a default back) and returns it as stored; ErrNoTenant for an empty id.
func (s *Store) ReplaceTenant(ctx context.Context, p ReplaceTenantParams) (Tenant, error) {
	if p.ID == "" {
		return Tenant{}, ErrNoTenant
	}
	ov, err := json.Marshal(nonNil(p.Overrides))
	if err != nil {
		return Tenant{}, err
	}
	return scanTenant(s.db.QueryRow(ctx, `
		UPDATE tenants SET name = $2, plan = $3, weight = $4, overrides = $5, status = $6, billing_day = $7,
			time_zone = $8, updated_at = now()
		WHERE id = $1 RETURNING `+tenantCols,
		p.ID, p.Name, p.Plan, p.Weight, ov, p.Status, p.BillingDay, p.TimeZone))
}
