package api

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/web/internal/webtest"
)

// adminRoutes are the "METHOD /pattern" of the admin routes the API registers.
func adminRoutes(t *testing.T) map[string]bool {
	t.Helper()
	e := echo.New()
	New(Deps{Logger: webtest.Quiet()}).Mount(e)
	out := map[string]bool{}
	for _, r := range e.Routes() {
		if strings.HasPrefix(r.Path, "/v1/admin/") || r.Path == "/v1/admin" {
			out[r.Method+" "+r.Path] = true
		}
	}
	if len(out) < 30 {
		t.Fatalf("only %d admin routes registered; the walk over Routes() is broken", len(out))
	}
	return out
}

// Every admin route has an entry in the role table, and every entry names a route.
// The audit routes' entries may wait for their routes: while no route under
// /v1/admin/audit is registered, they are not looked for.
func TestRoleTableCoversTheAdminRoutes(t *testing.T) {
	routes := adminRoutes(t)
	auditServed := false
	for r := range routes {
		if strings.Contains(r, " /v1/admin/audit") {
			auditServed = true
		}
	}
	for r := range routes {
		if _, ok := routeRoles[r]; !ok {
			t.Errorf("admin route %s has no entry in the role table (web/api/roles.go); it needs admin until it has one", r)
		}
	}
	for r, role := range routeRoles {
		pending := strings.Contains(r, " /v1/admin/audit") && !auditServed
		if !routes[r] && !pending {
			t.Errorf("the role table names %s, which is not registered", r)
		}
		if !role.Valid() {
			t.Errorf("%s: unknown role %q", r, role)
		}
	}
}

// The table is the contract: the credentials are admin's; writes (tenants, keys,
// pools, agents, webhooks, panel links, reverts) operator's; the usage export and the
// events feed finance's; every other read viewer's. A route the table lacks is
// admin's.
func TestRoleTableIsTheContract(t *testing.T) {
	for r, got := range routeRoles {
		method, path, _ := strings.Cut(r, " ")
		var want agentqtype.Role
		switch {
		case strings.HasPrefix(path, "/v1/admin/credentials"):
			want = agentqtype.RoleAdmin
		case method != http.MethodGet:
			want = agentqtype.RoleOperator
		case slices.Contains([]string{"/v1/admin/usage", "/v1/admin/events"}, path):
			want = agentqtype.RoleFinance
		default:
			want = agentqtype.RoleViewer
		}
		if got != want {
			t.Errorf("%s needs %s, the contract says %s", r, got, want)
		}
	}
	if got := MinRole(http.MethodGet, "/v1/admin/not-in-the-table"); got != agentqtype.RoleAdmin {
		t.Errorf("a route missing from the table needs %s, want admin", got)
	}
	if RoleAllows(agentqtype.RoleViewer, http.MethodPatch, "/v1/admin/tenants/:id") || !RoleAllows(agentqtype.RoleOperator, http.MethodPatch, "/v1/admin/tenants/:id") {
		t.Error("RoleAllows does not follow the table")
	}
}
