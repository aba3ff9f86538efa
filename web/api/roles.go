package api

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/agentqtype"
)

// The roles, as the table below reads them.
const (
	needAdmin    = agentqtype.RoleAdmin
	needOperator = agentqtype.RoleOperator
	needFinance  = agentqtype.RoleFinance
	needViewer   = agentqtype.RoleViewer
)

// routeRoles is the least role each admin route needs, keyed by method and route
// pattern as registered ("GET /v1/admin/tenants/:id"). It is the one place the roles
// are decided: the admin API enforces it after authentication (requireRole), the
// operator view asks it before its writes, and a test fails when an admin route is
// missing from it or an entry names no route. A route missing from it needs admin.
var routeRoles = map[string]agentqtype.Role{
	// The credentials themselves.
	"POST /v1/admin/credentials":              needAdmin,
	"GET /v1/admin/credentials":               needAdmin,
	"POST /v1/admin/credentials/:name/rotate": needAdmin,
	"DELETE /v1/admin/credentials/:name":      needAdmin,

	// Writes to tenants, their keys, pools, agents, webhooks, panel links; reverts.
	"POST /v1/admin/tenants":                        needOperator,
	"PATCH /v1/admin/tenants/:id":                   needOperator,
	"POST /v1/admin/tenants/:id/keys":               needOperator,
	"POST /v1/admin/tenants/:id/panel-links":        needOperator,
	"POST /v1/admin/tenants/:id/panel-links/revoke": needOperator,
	"POST /v1/admin/keys/:kid/rotate":               needOperator,
	"DELETE /v1/admin/keys/:kid":                    needOperator,
	"PUT /v1/admin/agents/:name":                    needOperator,
	"DELETE /v1/admin/agents/:name":                 needOperator,
	"POST /v1/admin/agents/:name/rotate-secret":     needOperator,
	"PUT /v1/admin/agents/:name/pool":               needOperator,
	"DELETE /v1/admin/agents/:name/pool":            needOperator,
	"PUT /v1/admin/pools/:name":                     needOperator,
	"DELETE /v1/admin/pools/:name":                  needOperator,
	"POST /v1/admin/webhooks":                       needOperator,
	"PATCH /v1/admin/webhooks/:id":                  needOperator,
	"DELETE /v1/admin/webhooks/:id":                 needOperator,
	"POST /v1/admin/webhooks/:id/rotate":            needOperator,
	"POST /v1/admin/audit/:id/revert":               needOperator,

	// The money: the usage export and the events feed.
	"GET /v1/admin/usage":  needFinance,
	"GET /v1/admin/events": needFinance,

	// Every other read.
	"GET /v1/admin/plans":                 needViewer,
	"GET /v1/admin/tenants":               needViewer,
	"GET /v1/admin/tenants/:id":           needViewer,
	"GET /v1/admin/tenants/:id/keys":      needViewer,
	"GET /v1/admin/agents":                needViewer,
	"GET /v1/admin/agents/:name":          needViewer,
	"GET /v1/admin/agents/:name/pool":     needViewer,
	"GET /v1/admin/pools":                 needViewer,
	"GET /v1/admin/pools/:name":           needViewer,
	"GET /v1/admin/webhooks":              needViewer,
	"GET /v1/admin/webhooks/:id":          needViewer,
	"GET /v1/admin/webhooks/:id/attempts": needViewer,
	"GET /v1/admin/audit":                 needViewer,
	"GET /v1/admin/audit/head":            needViewer,
	"GET /v1/admin/audit/:id":             needViewer,
}

// MinRole is the least role the admin route of method and pattern needs: its entry in
// the role table, else admin.
func MinRole(method, route string) agentqtype.Role {
	if r, ok := routeRoles[method+" "+route]; ok {
		return r
	}
	return needAdmin
}

// RoleAllows reports whether role may use the admin route of method and pattern.
func RoleAllows(role agentqtype.Role, method, route string) bool {
	return role.Allows(MinRole(method, route))
}

// requireRole refuses a request whose credential's role is below its route's (403
// ROLE_FORBIDDEN). It runs after authAdmin, which put the actor on the context.
func (s *API) requireRole(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		a, _ := agentqtype.ActorFrom(c.Request().Context())
		method, route := c.Request().Method, c.Path()
		if need := MinRole(method, route); !a.Role.Allows(need) {
			return Errorf(http.StatusForbidden, CodeRoleForbidden, "Credential %q has the role %s; %s %s needs %s or above.",
				a.Name, a.Role, method, route, need)
		}
		return next(c)
	}
}
