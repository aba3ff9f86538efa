package api

import (
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/keys"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
)

// TenantRequest is the body of POST /v1/admin/tenants and PATCH /v1/admin/tenants/{id}.
type TenantRequest struct {
	ID        *string                 `json:"id"`
	Name      *string                 `json:"name"`
	Plan      *string                 `json:"plan"`
	Weight    *int                    `json:"weight"`
	Overrides map[string]quotas.Limit `json:"overrides"` // a number, or "unlimited"
	Status    *string                 `json:"status"`
	// BillingDay (1 to 31) and TimeZone (IANA) are the billing anchor.
	BillingDay *int    `json:"billing_day"`
	TimeZone   *string `json:"time_zone"`
}

// TenantJSON is a tenant as the admin API shows it.
type TenantJSON struct {
	ID        string                  `json:"id"`
	Name      string                  `json:"name"`
	Plan      string                  `json:"plan"`
	Weight    *int                    `json:"weight"`
	Overrides map[string]quotas.Limit `json:"overrides"`
	Status    string                  `json:"status"`
	// BillingDay and TimeZone are the billing anchor in force (the defaults filled
	// in): periods start at 00:00 in TimeZone on BillingDay, clamped to the month's
	// last day. BillingPeriod is the current one.
	BillingDay      int        `json:"billing_day"`
	TimeZone        string     `json:"time_zone"`
	BillingPeriod   PeriodJSON `json:"billing_period"`
	CreatedAt       time.Time  `json:"created_at"`
	UpdatedAt       time.Time  `json:"updated_at"`
	EffectiveWeight int        `json:"effective_weight"`
}

func (s *API) tenantJSON(t tenants.Tenant) TenantJSON {
	p, _ := s.Tenants.Policy(t) // a plan missing from the catalogue still has a weight
	return NewTenantJSON(t, p)
}

// NewTenantJSON is t as the admin API shows it, with its policy's effective weight;
// the CLI prints the same.
func NewTenantJSON(t tenants.Tenant, p tenants.Policy) TenantJSON {
	a := t.Anchor()
	per := a.PeriodAt(time.Now())
	return TenantJSON{
		ID: t.ID, Name: t.Name, Plan: t.Plan, Weight: t.Weight, Overrides: t.Overrides, Status: t.Status,
		BillingDay: a.Day, TimeZone: a.ZoneName(), BillingPeriod: PeriodJSON{ID: per.ID, Start: per.Start, End: per.End},
		CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt, EffectiveWeight: p.Weight,
	}
}

// PeriodJSON is a billing period: its id (the start date in the tenant's zone,
// yyyymmdd) and its bounds, [start, end).
type PeriodJSON struct {
	ID    string    `json:"id"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
}

// tenantErr turns the tenant service's errors into the API's.
func tenantErr(err error, id string) error {
	var inv *agentqtype.InvalidError
	switch {
	case errors.As(err, &inv):
		return Errorf(http.StatusBadRequest, CodeInvalidRequest, "%s", inv.Message)
	case errors.Is(err, tenants.ErrExists):
		return Errorf(http.StatusConflict, CodeConflict, "Tenant %q already exists.", id)
	case errors.Is(err, agentqtype.ErrNotFound):
		return Errorf(http.StatusNotFound, CodeNotFound, "No tenant %q.", id)
	}
	return err
}

func (s *API) createTenant(c echo.Context) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	var r TenantRequest
	if err := decodeStrict(body, &r, false); err != nil {
		return err
	}
	var id string
	if r.ID != nil {
		id = *r.ID
	}
	t, err := s.Tenants.Create(c.Request().Context(), tenants.CreateParams{
		ID: id, Name: r.Name, Plan: r.Plan, Weight: r.Weight, Overrides: r.Overrides, Status: r.Status,
		BillingDay: r.BillingDay, TimeZone: r.TimeZone,
	})
	if err != nil {
		return tenantErr(err, id)
	}
	return c.JSON(http.StatusCreated, s.tenantJSON(t))
}

func (s *API) getTenant(c echo.Context) error {
	t, err := s.Tenants.Get(c.Request().Context(), c.Param("id"))
	if err != nil {
		return tenantErr(err, c.Param("id"))
	}
	return c.JSON(http.StatusOK, s.tenantJSON(t))
}

func (s *API) listTenants(c echo.Context) error {
	ts, err := s.Tenants.List(c.Request().Context())
	if err != nil {
		return err
	}
	out := make([]TenantJSON, 0, len(ts))
	for _, t := range ts {
		out = append(out, s.tenantJSON(t))
	}
	return c.JSON(http.StatusOK, map[string]any{"tenants": out})
}

func (s *API) updateTenant(c echo.Context) error {
	ctx := c.Request().Context()
	body, err := readBody(c)
	if err != nil {
		return err
	}
	var r TenantRequest
	if err := decodeStrict(body, &r, false); err != nil {
		return err
	}
	id := c.Param("id")
	if r.ID != nil && *r.ID != id {
		return Errorf(http.StatusBadRequest, CodeInvalidRequest, "id cannot be changed.")
	}
	t, err := s.Tenants.Update(ctx, tenants.UpdateParams{
		ID: id, Name: r.Name, Plan: r.Plan, Weight: r.Weight, Overrides: r.Overrides, Status: r.Status,
		BillingDay: r.BillingDay, TimeZone: r.TimeZone,
	})
	if err != nil {
		return tenantErr(err, id)
	}
	return c.JSON(http.StatusOK, s.tenantJSON(t))
}

// ScopesJSON are a key's scopes; an absent or empty list allows all.
type ScopesJSON struct {
	Agents     []string `json:"agents,omitempty"`
	Principals []string `json:"principals,omitempty"`
}

func scopesJSON(sc keys.Scopes) ScopesJSON {
	return ScopesJSON{Agents: sc.Agents, Principals: sc.Principals}
}

// KeyRequest is the body of POST /v1/admin/tenants/{id}/keys.
type KeyRequest struct {
	Scopes *ScopesJSON `json:"scopes"`
}

// KeyCreated is the answer to key creation and rotation: the plaintext is shown once.
type KeyCreated struct {
	Kid       string     `json:"kid"`
	Key       string     `json:"key"`
	TenantID  string     `json:"tenant_id"`
	Scopes    ScopesJSON `json:"scopes"`
	CreatedAt time.Time  `json:"created_at"`
	RotatedAt *time.Time `json:"rotated_at,omitempty"`
}

// KeyJSON is a key as listings show it: never its secret.
type KeyJSON struct {
	Kid       string     `json:"kid"`
	TenantID  string     `json:"tenant_id"`
	Scopes    ScopesJSON `json:"scopes"`
	CreatedAt time.Time  `json:"created_at"`
	RotatedAt *time.Time `json:"rotated_at"`
	RevokedAt *time.Time `json:"revoked_at"`
}

// NewKeyJSON is k as the API lists it (the CLI prints the same shape).
func NewKeyJSON(k keys.Key) KeyJSON {
	return KeyJSON{Kid: k.Kid, TenantID: k.TenantID, Scopes: scopesJSON(k.Scopes), CreatedAt: k.CreatedAt,
		RotatedAt: k.RotatedAt, RevokedAt: k.RevokedAt}
}

// keyErr turns the key service's errors into the API's.
func keyErr(err error) error {
	var inv *agentqtype.InvalidError
	var nf *agentqtype.NotFoundError
	switch {
	case errors.As(err, &inv):
		return Errorf(http.StatusBadRequest, CodeInvalidRequest, "%s", inv.Message)
	case errors.As(err, &nf):
		return Errorf(http.StatusNotFound, CodeNotFound, "%s", nf.Message)
	}
	return err
}

func keyCreated(k keys.Created) KeyCreated {
	return KeyCreated{Kid: k.Kid, Key: k.Plaintext, TenantID: k.TenantID, Scopes: scopesJSON(k.Scopes), CreatedAt: k.CreatedAt, RotatedAt: k.RotatedAt}
}

func (s *API) createKey(c echo.Context) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	var r KeyRequest
	if err := decodeStrict(body, &r, true); err != nil {
		return err
	}
	var scopes keys.Scopes
	if r.Scopes != nil {
		scopes = keys.Scopes{Agents: r.Scopes.Agents, Principals: r.Scopes.Principals}
	}
	k, err := s.APIKeys.Create(c.Request().Context(), keys.CreateParams{TenantID: c.Param("id"), Scopes: scopes})
	if err != nil {
		return keyErr(err)
	}
	return c.JSON(http.StatusCreated, keyCreated(k))
}

func (s *API) listKeys(c echo.Context) error {
	ks, err := s.APIKeys.List(c.Request().Context(), c.Param("id"))
	if err != nil {
		return keyErr(err)
	}
	out := make([]KeyJSON, 0, len(ks))
	for _, k := range ks {
		out = append(out, NewKeyJSON(k))
	}
	return c.JSON(http.StatusOK, map[string]any{"keys": out})
}

func (s *API) rotateKey(c echo.Context) error {
	k, err := s.APIKeys.Rotate(c.Request().Context(), c.Param("kid"))
	if err != nil {
		return keyErr(err)
	}
	return c.JSON(http.StatusOK, keyCreated(k))
}

func (s *API) revokeKey(c echo.Context) error {
	if _, err := s.APIKeys.Revoke(c.Request().Context(), c.Param("kid")); err != nil {
		return keyErr(err)
	}
	return c.NoContent(http.StatusNoContent)
}

// PlanJSON is a plan as the admin API shows it.
type PlanJSON struct {
	Name   string                  `json:"name"`
	Weight int                     `json:"weight"`
	Limits map[string]quotas.Limit `json:"limits"` // a number, or "unlimited"
	Budget quotas.Budget           `json:"budget"`
	// Tree is the plan's tree budget: a root's default and ceiling.
	Tree quotas.TreeBudgets `json:"tree"`
	// MaxRepeatSteps bounds the steps in a row answering the same state and output.
	MaxRepeatSteps int `json:"max_repeat_steps"`
	// SLA is what the plan commits to: seconds, or "unlimited" (no commitment).
	SLA quotas.SLA `json:"sla"`
}

func (s *API) listPlans(c echo.Context) error {
	out := []PlanJSON{}
	for _, n := range s.Plans.Names() {
		p, _ := s.Plans.Plan(n)
		out = append(out, PlanJSON{Name: n, Weight: p.Weight, Limits: p.Limits, Budget: p.Budget, Tree: p.Tree, MaxRepeatSteps: p.RepeatSteps(),
			SLA: p.Commitments()})
	}
	return c.JSON(http.StatusOK, map[string]any{"plans": out})
}
