package api

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/web/internal/panellink"
)

// The tenant panel's links: POST /v1/admin/tenants/{id}/panel-links signs a link
// (package panellink), POST /v1/admin/tenants/{id}/panel-links/revoke revokes the
// tenant's links issued so far. Package panel serves the pages they open.

// PanelLinkRequest is the optional body of POST /v1/admin/tenants/{id}/panel-links.
type PanelLinkRequest struct {
	TTLS *int64 `json:"ttl_s"`
}

// PanelLink is a signed tenant panel link.
type PanelLink struct {
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

func (s *API) createPanelLink(c echo.Context) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	var r PanelLinkRequest
	if err := decodeStrict(body, &r, true); err != nil {
		return err
	}
	ttl := panellink.DefaultTTL
	if r.TTLS != nil {
		if *r.TTLS < 1 || *r.TTLS > int64(panellink.MaxTTL/time.Second) {
			return Errorf(http.StatusBadRequest, CodeInvalidRequest, "ttl_s must be between 1 and %d seconds.", int64(panellink.MaxTTL/time.Second))
		}
		ttl = time.Duration(*r.TTLS) * time.Second
	}
	id := c.Param("id")
	exp := s.PanelLinks.Now().Add(ttl).UTC().Truncate(time.Second)
	if err := s.Tenants.RecordPanelLink(c.Request().Context(), id, exp); err != nil {
		return tenantErr(err, id)
	}
	tok := s.PanelLinks.Sign(id, exp)
	u := c.Scheme() + "://" + c.Request().Host + "/panel/t?token=" + tok
	return c.JSON(http.StatusCreated, PanelLink{URL: u, ExpiresAt: exp})
}

// PanelLinksRevoked is the answer of POST /v1/admin/tenants/{id}/panel-links/revoke.
type PanelLinksRevoked struct {
	TenantID        string    `json:"tenant_id"`
	LinksValidAfter time.Time `json:"links_valid_after"`
}

// revokePanelLinks revokes every panel link of the tenant issued until now.
func (s *API) revokePanelLinks(c echo.Context) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	var none struct{} // no body, or an empty object
	if err := decodeStrict(body, &none, true); err != nil {
		return err
	}
	id := c.Param("id")
	t, err := s.Tenants.RevokePanelLinks(c.Request().Context(), id, s.PanelLinks.Now())
	if err != nil {
		return tenantErr(err, id)
	}
	return c.JSON(http.StatusOK, PanelLinksRevoked{TenantID: t.ID, LinksValidAfter: t.PanelLinksValidAfter.UTC()})
}
