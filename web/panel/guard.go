package panel

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
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/web/api"
	"github.com/agentq/agentq/web/internal/panellink"
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
func (s *Panel) panelGuard(html bool) echo.MiddlewareFunc {
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
func panelRefusal(s *Panel, c echo.Context, html bool, err error) error {
	var ae *api.APIError
	if html && errors.As(err, &ae) {
		return s.panelError(c, ae.Status, ae.Message)
	}
	return err
}

// panelAdmit checks the link and takes a token of its bucket.
func (s *Panel) panelAdmit(c echo.Context) (tenants.Tenant, error) {
	token := c.QueryParam("token")
	claims, err := s.Links.Claims(token)
	switch {
	case errors.Is(err, panellink.ErrExpired):
		return tenants.Tenant{}, api.Errorf(http.StatusForbidden, "LINK_EXPIRED", "This usage link has expired. Ask for a new one.")
	case err != nil:
		return tenants.Tenant{}, api.Errorf(http.StatusUnauthorized, api.CodeUnauthorized, "This usage link is not valid.")
	}
	ctx := c.Request().Context()
	t, err := s.Tenants.Lookup(ctx, claims.TenantID)
	if errors.Is(err, agentqtype.ErrNotFound) {
		return t, api.Errorf(http.StatusNotFound, api.CodeNotFound, "This usage link's account no longer exists.")
	} else if err != nil {
		s.log.Error("panel: tenant lookup failed", "err", err)
		e := api.Unavailable()
		e.Message = "Usage is unavailable right now. Retry in a moment."
		return t, e
	}
	if tenants.PanelLinkRevoked(t, claims.Issued) {
		return t, api.Errorf(http.StatusForbidden, "LINK_REVOKED", "This usage link was revoked. Ask for a new one.")
	}
	if s.Admission == nil {
		return t, nil
	}
	key := s.Admission.Quotas().Keys().PanelLinkBucket(t.ID, panelLinkID(token))
	a, err := s.Admission.TakeBucket(ctx, key, panelLinkBucket)
	if err != nil {
		return t, api.AdmissionFailure(err)
	}
	if !a.Allowed {
		e := api.BucketRefusal(c, a, PanelLinkRate,
			fmt.Sprintf("This usage link's rate limit of %g requests/second was exceeded.", panelLinkBucket.Rate))
		e.Extra["tenant_id"] = t.ID
		return t, e
	}
	return t, nil
}

// limitPanelRequest runs next holding one of the tenant's inflight_requests slots.
func (s *Panel) limitPanelRequest(c echo.Context, t tenants.Tenant, html bool, next echo.HandlerFunc) error {
	slot, err := s.API.AcquireInflight(c, t)
	if err != nil {
		return panelRefusal(s, c, html, err)
	}
	defer s.Admission.ReleaseInflight(context.WithoutCancel(c.Request().Context()), slot)
	return next(c)
}
