package web

import (
	"errors"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/internal/apikey"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

var tenantIDRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_-]{0,62}$`)

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
	w := 1
	if p, ok := s.Plans.Plan(t.Plan); ok {
		w = p.Weight
	}
	if t.Weight != nil {
		w = *t.Weight
	}
	return TenantJSON{Tenant: t, EffectiveWeight: w}
}

func (s *Server) validateTenantFields(r TenantRequest) error {
	if r.Name != nil && (strings.TrimSpace(*r.Name) == "" || identifierProblem(*r.Name, 200) != "") {
		return apiErr(http.StatusBadRequest, CodeInvalidRequest, "name must be 1 to 200 bytes of text without control characters.")
	}
	if r.Plan != nil {
		if _, ok := s.Plans.Plan(*r.Plan); !ok {
			return apiErr(http.StatusBadRequest, CodeInvalidRequest, "Unknown plan %q (plans: %s).", *r.Plan, strings.Join(s.Plans.Names(), ", "))
		}
	}
	if r.Weight != nil && (*r.Weight < 1 || *r.Weight > 1000) {
		return apiErr(http.StatusBadRequest, CodeInvalidRequest, "weight must be between 1 and 1000.")
	}
	if err := quotas.ValidateOverrides(r.Overrides); err != nil {
		return apiErr(http.StatusBadRequest, CodeInvalidRequest, "overrides: %v.", err)
	}
	if r.Status != nil && *r.Status != "active" && *r.Status != "suspended" {
		return apiErr(http.StatusBadRequest, CodeInvalidRequest, "status must be active or suspended.")
	}
	return nil
}

// checkKeyLimits refuses limits that turn key limits off while the tenant limit is on:
// one unlimited key could then spend the whole tenant's bucket.
func (s *Server) checkKeyLimits(plan string, overrides map[string]quotas.Limit) error {
	eff, err := s.Plans.Effective(plan, overrides)
	if err != nil {
		return apiErr(http.StatusBadRequest, CodeInvalidRequest, "%v.", err)
	}
	if quotas.KeyLimitsOffAlone(eff) {
		return apiErr(http.StatusBadRequest, CodeInvalidRequest,
			"overrides: key_rate unlimited disables key limits while tenant_rate is on; set tenant_rate to unlimited too, or keep a key_rate.")
	}
	return nil
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
	if r.ID == nil || !tenantIDRE.MatchString(*r.ID) {
		return apiErr(http.StatusBadRequest, CodeInvalidRequest, "id is required: 1 to 63 letters, digits, '-' or '_', starting with a letter or digit.")
	}
	if r.Plan == nil {
		return apiErr(http.StatusBadRequest, CodeInvalidRequest, "plan is required.")
	}
	if r.Status != nil {
		return apiErr(http.StatusBadRequest, CodeInvalidRequest, "status is set with PATCH, not at creation.")
	}
	if err := s.validateTenantFields(r); err != nil {
		return err
	}
	if err := s.checkKeyLimits(*r.Plan, r.Overrides); err != nil {
		return err
	}
	name := *r.ID
	if r.Name != nil {
		name = *r.Name
	}
	t, err := s.Store.CreateTenant(c.Request().Context(), store.CreateTenantParams{
		ID: *r.ID, Name: name, Plan: *r.Plan, Weight: r.Weight, Overrides: r.Overrides,
	})
	if errors.Is(err, store.ErrConflict) {
		return apiErr(http.StatusConflict, CodeConflict, "Tenant %q already exists.", *r.ID)
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, s.tenantJSON(t))
}

func (s *Server) getTenant(c echo.Context) error {
	t, err := s.Store.GetTenant(c.Request().Context(), c.Param("id"))
	if errors.Is(err, store.ErrNotFound) {
		return apiErr(http.StatusNotFound, CodeNotFound, "No tenant %q.", c.Param("id"))
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, s.tenantJSON(t))
}

func (s *Server) listTenants(c echo.Context) error {
	ts, err := s.Store.ListTenants(c.Request().Context())
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
	if err := s.validateTenantFields(r); err != nil {
		return err
	}
	if r.Plan != nil || r.Overrides != nil {
		cur, err := s.Store.GetTenant(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return apiErr(http.StatusNotFound, CodeNotFound, "No tenant %q.", id)
		}
		if err != nil {
			return err
		}
		plan, ov := cur.Plan, cur.Overrides
		if r.Plan != nil {
			plan = *r.Plan
		}
		if r.Overrides != nil {
			ov = r.Overrides
		}
		if err := s.checkKeyLimits(plan, ov); err != nil {
			return err
		}
	}
	t, err := s.Store.UpdateTenant(ctx, store.UpdateTenantParams{
		ID: id, Name: r.Name, Plan: r.Plan, Weight: r.Weight, Overrides: r.Overrides, Status: r.Status,
	})
	if errors.Is(err, store.ErrNotFound) {
		return apiErr(http.StatusNotFound, CodeNotFound, "No tenant %q.", id)
	}
	if err != nil {
		return err
	}
	s.invalidate(ctx, "t:"+id)
	tj := s.tenantJSON(t)
	if limits, err := s.Plans.Effective(t.Plan, t.Overrides); err == nil {
		if err := s.Queue.Configure(ctx, t.ID, tj.EffectiveWeight, quotas.RunningCap(limits)); err != nil {
			s.log.Warn("applying new weight/cap to the queued backlog failed; it applies at the next submission", "tenant_id", id, "err", err)
		}
	}
	return c.JSON(http.StatusOK, tj)
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
