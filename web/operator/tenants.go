package operator

import (
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/web/api"
)

// mayWrite reports whether role may change a tenant: the view's writes are the admin
// API's PATCH /v1/admin/tenants/{id}, under the same entry of the one role table.
func mayWrite(role agentqtype.Role) bool {
	return api.RoleAllows(role, http.MethodPatch, "/v1/admin/tenants/:id")
}

// tenantStatus suspends or reactivates a tenant (POST /panel/admin/tenants/{id}/status,
// form fields status and csrf), for a credential whose role may change tenants.
func (s *View) tenantStatus(c echo.Context) error {
	if !sameOrigin(c.Request()) {
		return s.operatorMessage(c, http.StatusForbidden, "Refused", "This form must be sent from the operator view's own page (Origin check failed).", true)
	}
	ss, err := s.session(c)
	if err != nil {
		return err
	}
	if ss == nil {
		return c.Redirect(http.StatusSeeOther, operatorPath+"/login")
	}
	form, err := operatorForm(c)
	if err != nil {
		return s.operatorMessage(c, http.StatusBadRequest, "Bad request", "The form could not be read.", false)
	}
	if !ss.csrfOK(form.Get("csrf")) {
		return s.operatorMessage(c, http.StatusForbidden, "Refused", "The form's CSRF token is missing or does not match.", false)
	}
	if !mayWrite(ss.cred.Role) {
		return s.operatorMessage(c, http.StatusForbidden, "Not allowed",
			"You are signed in as "+ss.cred.Name+", role "+string(ss.cred.Role)+": changing a tenant needs the operator role or above.", false)
	}
	status := form.Get("status")
	if status != "active" && status != "suspended" {
		return s.operatorMessage(c, http.StatusBadRequest, "Bad request", "status must be active or suspended.", false)
	}
	if s.Tenants == nil {
		return s.operatorMessage(c, http.StatusServiceUnavailable, "Unavailable", "The operator view cannot change tenants on this server.", false)
	}
	a := ss.cred.Actor()
	a.RequestID = c.Response().Header().Get(echo.HeaderXRequestID)
	ctx := agentqtype.WithActor(c.Request().Context(), a)
	_, err = s.Tenants.Update(ctx, tenants.UpdateParams{ID: c.Param("id"), Status: &status})
	if errors.Is(err, agentqtype.ErrNotFound) {
		return s.operatorMessage(c, http.StatusNotFound, "Not found", "No tenant "+c.Param("id")+".", false)
	}
	if err != nil {
		return err
	}
	return c.Redirect(http.StatusSeeOther, operatorPath)
}
