// Package panel is the tenant panel: the usage page a signed link opens (GET /panel/t),
// the JSON it polls and its assets, and the approval page of a paused task
// (/approve). Its JSON answers and refusals are the API's (package api).
package panel

import (
	"embed"
	"errors"
	"html/template"
	"log/slog"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/internal/approval"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas/admission"
	"github.com/agentq/agentq/web/api"
	"github.com/agentq/agentq/web/internal/panellink"
)

// The tenant panel: the admin API signs and revokes its links (package api), GET
// /panel/t?token= renders the tenant's usage page, GET /panel/t/usage?token= is
// the JSON the page polls (both behind panelGuard: guard.go), GET
// /panel/t/assets/{file} its CSS and JS. The tenant always comes from the token;
// nothing in the request names another.

//go:embed templates/panel_tenant.html templates/panel_tenant_error.html templates/approve.html
var panelTemplates embed.FS

//go:embed assets/panel.css assets/panel.js
var panelAssets embed.FS

var panelTmpl = template.Must(template.New("panel").ParseFS(panelTemplates,
	"templates/panel_tenant.html", "templates/panel_tenant_error.html", "templates/approve.html"))

// Deps are the panel's collaborators.
type Deps struct {
	API       *api.API // the usage report, the inflight slots and the task errors
	Tenants   *tenants.Service
	Tasks     *tasks.Service
	Admission *admission.Guard // nil: panel requests are not limited
	Links     *panellink.Signer
	// Approvals checks the approval links of paused tasks (GET/POST /approve); nil
	// serves no approvals.
	Approvals *approval.Signer
	// FrameAncestors is the panel's CSP frame-ancestors ("" is "*").
	FrameAncestors string
	Logger         *slog.Logger // where the handlers log; required
}

// Panel is the tenant panel's and the approval page's handlers.
type Panel struct {
	Deps
	log *slog.Logger
}

// New builds the panel; Mount serves it.
func New(d Deps) *Panel { return &Panel{Deps: d, log: d.Logger} }

// Mount registers the panel's routes on e.
func (s *Panel) Mount(e *echo.Echo) {
	// Authorized by the signed link, not by a key.
	e.GET("/panel/t", s.panelPage, s.panelGuard(true))
	e.GET("/panel/t/usage", s.panelUsage, s.panelGuard(false))
	e.GET("/panel/t/assets/:file", s.panelAsset)
	// A paused task's approval page: authorized by its signed link, not by a key.
	e.GET(approval.Path, s.approvalPage)
	e.POST(approval.Path, s.approve)
}

// panelHeaders are set on every panel response: no caching (the URL is a
// credential), no referrer (links out must not carry the token), embedding allowed
// only to the configured frame ancestors.
func (s *Panel) panelHeaders(c echo.Context) {
	h := c.Response().Header()
	fa := s.FrameAncestors
	if fa == "" {
		fa = "*"
	}
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; "+
		"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors "+fa)
	h.Set(echo.HeaderCacheControl, "no-store")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set(echo.HeaderXContentTypeOptions, "nosniff")
}

func (s *Panel) panelError(c echo.Context, status int, msg string) error {
	var b strings.Builder
	if err := panelTmpl.ExecuteTemplate(&b, "panel_tenant_error.html", map[string]any{"Status": status, "Message": msg}); err != nil {
		return err
	}
	return c.HTML(status, b.String())
}

func (s *Panel) panelPage(c echo.Context) error {
	t := panelTenantOf(c)
	rep, err := s.API.TenantUsage(c.Request().Context(), t)
	if err != nil {
		var ae *api.APIError
		if errors.As(err, &ae) {
			return s.panelError(c, ae.Status, "Usage is unavailable right now. Retry in a moment.")
		}
		s.log.Error("panel: usage report failed", "err", err)
		return s.panelError(c, http.StatusInternalServerError, "Usage is unavailable right now. Retry in a moment.")
	}
	v := newPanelView(rep)
	if s.API.Audit != nil {
		cs, err := s.API.Audit.TenantLimitChanges(c.Request().Context(), t.ID, limitChangesShown)
		if err != nil {
			s.log.Error("panel: limit changes failed", "err", err)
			return s.panelError(c, http.StatusInternalServerError, "Usage is unavailable right now. Retry in a moment.")
		}
		v.Changes = newPanelChanges(cs)
	}
	var b strings.Builder
	if err := panelTmpl.ExecuteTemplate(&b, "panel_tenant.html", v); err != nil {
		return err
	}
	return c.HTML(http.StatusOK, b.String())
}

// panelUsage is the JSON the page polls: the tenant's usage report, with no key's
// buckets (the panel has none).
func (s *Panel) panelUsage(c echo.Context) error {
	t := panelTenantOf(c)
	rep, err := s.API.TenantUsage(c.Request().Context(), t)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, rep)
}

func (s *Panel) panelAsset(c echo.Context) error {
	name := c.Param("file")
	var ctype string
	switch name {
	case "panel.css":
		ctype = "text/css; charset=utf-8"
	case "panel.js":
		ctype = "text/javascript; charset=utf-8"
	default:
		return api.Errorf(http.StatusNotFound, api.CodeNotFound, "No asset %q.", name)
	}
	b, err := panelAssets.ReadFile("assets/" + name)
	if err != nil {
		return err
	}
	c.Response().Header().Set(echo.HeaderCacheControl, "public, max-age=300")
	c.Response().Header().Set(echo.HeaderXContentTypeOptions, "nosniff")
	return c.Blob(http.StatusOK, ctype, b)
}
