package web

import (
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/internal/apikey"
	"github.com/agentq/agentq/internal/store"
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
}

// TenantJSON is a tenant as the admin API shows it.
type TenantJSON struct {
	store.Tenant
	EffectiveWeight int `json:"effective_weight"`
}

func (s *Server) tenantJSON(t store.Tenant) TenantJSON {
	p, _ := s.Tenants.Policy(t) // a plan missing from the catalogue still has a weight
	return TenantJSON{Tenant: t, EffectiveWeight: p.Weight}
}

// tenantErr turns the tenant service's errors into the API's.
func tenantErr(err error, id string) error {
	var inv *tenants.InvalidError
	switch {
	case errors.As(err, &inv):
		return apiErr(http.StatusBadRequest, CodeInvalidRequest, "%s", inv.Message)
	case errors.Is(err, tenants.ErrExists):
		return apiErr(http.StatusConflict, CodeConflict, "Tenant %q already exists.", id)
	case errors.Is(err, tenants.ErrNotFound):
		return apiErr(http.StatusNotFound, CodeNotFound, "No tenant %q.", id)
	}
	return err
}

func (s *Server) createTenant(c echo.Context) error {
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
	})
	if err != nil {
		return tenantErr(err, id)
	}
	return c.JSON(http.StatusCreated, s.tenantJSON(t))
}

func (s *Server) getTenant(c echo.Context) error {
	t, err := s.Tenants.Get(c.Request().Context(), c.Param("id"))
	if err != nil {
		return tenantErr(err, c.Param("id"))
	}
	return c.JSON(http.StatusOK, s.tenantJSON(t))
}

func (s *Server) listTenants(c echo.Context) error {
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

func (s *Server) updateTenant(c echo.Context) error {
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
		return apiErr(http.StatusBadRequest, CodeInvalidRequest, "id cannot be changed.")
	}
	t, err := s.Tenants.Update(ctx, tenants.UpdateParams{
		ID: id, Name: r.Name, Plan: r.Plan, Weight: r.Weight, Overrides: r.Overrides, Status: r.Status,
	})
	if err != nil {
		return tenantErr(err, id)
	}
	s.invalidate(ctx, "t:"+id)
	return c.JSON(http.StatusOK, s.tenantJSON(t))
}

// KeyRequest is the body of POST /v1/admin/tenants/{id}/keys.
type KeyRequest struct {
	Scopes *store.Scopes `json:"scopes"`
}

// KeyCreated is the answer to key creation and rotation: the plaintext is shown once.
type KeyCreated struct {
	Kid       string       `json:"kid"`
	Key       string       `json:"key"`
	TenantID  string       `json:"tenant_id"`
	Scopes    store.Scopes `json:"scopes"`
	CreatedAt time.Time    `json:"created_at"`
	RotatedAt *time.Time   `json:"rotated_at,omitempty"`
}

func (s *Server) createKey(c echo.Context) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	var r KeyRequest
	if err := decodeStrict(body, &r, true); err != nil {
		return err
	}
	var scopes store.Scopes
	if r.Scopes != nil {
		scopes = *r.Scopes
	}
	for _, a := range append(append([]string{}, scopes.Agents...), scopes.Principals...) {
		if a == "" || identifierProblem(a, maxIdentifier) != "" {
			return apiErr(http.StatusBadRequest, CodeInvalidRequest, "Scope entries must be 1 to 255 bytes without control characters.")
		}
	}
	tenantID := c.Param("id")
	kid, plaintext, hash := apikey.New(tenantID)
	k, err := s.Store.CreateKey(c.Request().Context(), store.CreateKeyParams{
		Kid: kid, TenantID: tenantID, SecretHash: hash, Scopes: scopes,
	})
	if errors.Is(err, store.ErrNotFound) {
		return apiErr(http.StatusNotFound, CodeNotFound, "No tenant %q.", tenantID)
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, KeyCreated{Kid: k.Kid, Key: plaintext, TenantID: k.TenantID, Scopes: k.Scopes, CreatedAt: k.CreatedAt})
}

func (s *Server) listKeys(c echo.Context) error {
	ctx := c.Request().Context()
	if _, err := s.Store.GetTenant(ctx, c.Param("id")); errors.Is(err, store.ErrNotFound) {
		return apiErr(http.StatusNotFound, CodeNotFound, "No tenant %q.", c.Param("id"))
	} else if err != nil {
		return err
	}
	ks, err := s.Store.ListKeys(ctx, c.Param("id"))
	if err != nil {
		return err
	}
	if ks == nil {
		ks = []store.APIKey{}
	}
	return c.JSON(http.StatusOK, map[string]any{"keys": ks})
}

func (s *Server) rotateKey(c echo.Context) error {
	ctx := c.Request().Context()
	kid := c.Param("kid")
	if !apikey.ValidKid(kid) {
		return apiErr(http.StatusNotFound, CodeNotFound, "No live key %q.", kid)
	}
	plaintext, hash := apikey.NewSecret(kid)
	k, err := s.Store.RotateKey(ctx, store.RotateKeyParams{Kid: kid, SecretHash: hash})
	if errors.Is(err, store.ErrNotFound) {
		return apiErr(http.StatusNotFound, CodeNotFound, "No live key %q.", kid)
	}
	if err != nil {
		return err
	}
	s.invalidate(ctx, "k:"+kid)
	return c.JSON(http.StatusOK, KeyCreated{Kid: k.Kid, Key: plaintext, TenantID: k.TenantID, Scopes: k.Scopes, CreatedAt: k.CreatedAt, RotatedAt: k.RotatedAt})
}

func (s *Server) revokeKey(c echo.Context) error {
	ctx := c.Request().Context()
	kid := c.Param("kid")
	k, err := s.Store.GetKey(ctx, kid)
	if err == nil && k.RevokedAt == nil {
		err = s.Store.RevokeKey(ctx, kid)
	} else if err == nil {
		err = store.ErrNotFound
	}
	if errors.Is(err, store.ErrNotFound) {
		return apiErr(http.StatusNotFound, CodeNotFound, "No live key %q.", kid)
	}
	if err != nil {
		return err
	}
	s.invalidate(ctx, "k:"+kid)
	// A removed key's live limit state goes with it (keys that remain keep theirs).
	if err := s.Admission.Quotas().DropKey(ctx, k.TenantID, kid); err != nil {
		s.log.Warn("dropping a revoked key's limit state failed; it expires on its own", "kid", kid, "err", err)
	}
	return c.NoContent(http.StatusNoContent)
}

// PlanJSON is a plan as the admin API shows it.
type PlanJSON struct {
	Name   string                  `json:"name"`
	Weight int                     `json:"weight"`
	Limits map[string]quotas.Limit `json:"limits"` // a number, or "unlimited"
	Budget quotas.Budget           `json:"budget"`
}

func (s *Server) listPlans(c echo.Context) error {
	out := []PlanJSON{}
	for _, n := range s.Plans.Names() {
		p, _ := s.Plans.Plan(n)
		out = append(out, PlanJSON{Name: n, Weight: p.Weight, Limits: p.Limits, Budget: p.Budget})
	}
	return c.JSON(http.StatusOK, map[string]any{"plans": out})
}
