package web

// The tenant panel's guard (GET /panel/t and /panel/t/usage): the link's token is
// checked, then its tenant (gone: 404) and whether the tenant's links issued before a
// revocation are refused (403 LINK_REVOKED). Then two limits apply, as to the
// tenant's API requests:
//
//   - each link has its own token bucket, panelLinkBucket (in Redis, key
//     rkeys.PanelLinkBucket, named by a digest of the token: the token is a
//     credential). A panel page polls every 5 s, far below it; a link shared with
//     many pollers, or a script hammering one, gets 429 RATE_LIMIT_EXCEEDED
//     (limit_type panel_link_rate) without costing the tenant's other links;
//   - the request holds one of the tenant's inflight_requests slots while it runs.
//
// Forged and expired links are refused before Redis is asked anything, so only genuine
// links make bucket keys, and each expires when its bucket is full again.

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
)

// panelLinkBucket is the request rate one panel link may use.
var panelLinkBucket = quotas.Bucket{Rate: 2, Burst: 10}

// PanelLinkRate is the limit_type of a panel link's refused requests.
const PanelLinkRate = "panel_link_rate"

const ctxKeyPanelTenant = "agentq.panel_tenant"

// panelTenantOf is the tenant the guard let the request through for.
func panelTenantOf(c echo.Context) tenants.Tenant { return c.Get(ctxKeyPanelTenant).(tenants.Tenant) }

// panelLinkID names a link in Redis: a digest of its token, never the token.
func panelLinkID(token string) string {
	sum := sha256.Sum256([]byte("agentq panel link id|" + token))
	return base64.RawURLEncoding.EncodeToString(sum[:16])
}

// panelGuard authorizes and limits a panel request; html answers refusals with the
// panel's error page, else with the error body.
func (s *Server) panelGuard(html bool) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			s.panelHeaders(c)
			t, err := s.panelAdmit(c)
			if err != nil {
				return panelRefusal(s, c, html, err)
			}
			c.Set(ctxKeyPanelTenant, t)
			if s.Admission == nil {
				return next(c)
			}
			return s.limitPanelRequest(c, t, html, next)
		}
	}
}

// panelRefusal answers a refused panel request: the error page or the error body.
func panelRefusal(s *Server, c echo.Context, html bool, err error) error {
	var ae *APIError
	if html && errors.As(err, &ae) {
		return s.panelError(c, ae.Status, ae.Message)
	}
	return err
}

// panelAdmit checks the link and takes a token of its bucket.
func (s *Server) panelAdmit(c echo.Context) (tenants.Tenant, error) {
	token := c.QueryParam("token")
	claims, err := s.panel.Claims(token)
	switch {
	case errors.Is(err, ErrPanelTokenExpired):
		return tenants.Tenant{}, apiErr(http.StatusForbidden, "LINK_EXPIRED", "This usage link has expired. Ask for a new one.")
	case err != nil:
		return tenants.Tenant{}, apiErr(http.StatusUnauthorized, CodeUnauthorized, "This usage link is not valid.")
	}
	ctx := c.Request().Context()
	t, err := s.Tenants.Lookup(ctx, claims.TenantID)
	if errors.Is(err, agentqtype.ErrNotFound) {
		return t, apiErr(http.StatusNotFound, CodeNotFound, "This usage link's account no longer exists.")
	} else if err != nil {
		s.log.Error("panel: tenant lookup failed", "err", err)
		e := unavailable()
		e.Message = "Usage is unavailable right now. Retry in a moment."
		return t, e
	}
	if tenants.PanelLinkRevoked(t, claims.Issued) {
		return t, apiErr(http.StatusForbidden, "LINK_REVOKED", "This usage link was revoked. Ask for a new one.")
	}
	if s.Admission == nil {
		return t, nil
	}
	key := s.Admission.Quotas().Keys().PanelLinkBucket(t.ID, panelLinkID(token))
	a, err := s.Admission.TakeBucket(ctx, key, panelLinkBucket)
	if err != nil {
		return t, admissionFailure(err)
	}
	if !a.Allowed {
		ra := max(1, ceilSeconds(a.RetryAfter))
		c.Response().Header().Set("Retry-After", strconv.FormatInt(ra, 10))
		e := apiErr(http.StatusTooManyRequests, "RATE_LIMIT_EXCEEDED",
			"This usage link's rate limit of %g requests/second was exceeded. Retry in %d second%s.", panelLinkBucket.Rate, ra, plural(ra))
		e.Extra = map[string]any{"limit_type": PanelLinkRate, "retry_after_seconds": ra, "tenant_id": t.ID, "violated": []string{PanelLinkRate}}
		return t, e
	}
	return t, nil
}

// limitPanelRequest runs next holding one of the tenant's inflight_requests slots.
func (s *Server) limitPanelRequest(c echo.Context, t tenants.Tenant, html bool, next echo.HandlerFunc) error {
	eff, _, err := s.limitsFor(t)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	slot, err := s.Admission.AcquireInflight(ctx, t.ID, quotas.InflightLimit(eff))
	if err != nil {
		return panelRefusal(s, c, html, admissionFailure(err))
	}
	if !slot.Allowed {
		return panelRefusal(s, c, html, s.inflightRefusal(c, t, slot))
	}
	defer s.Admission.ReleaseInflight(context.WithoutCancel(ctx), slot)
	return next(c)
}
