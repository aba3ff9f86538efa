package e2e_test

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentq/agentq/client"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/web/api"
)

// roleToken is a credential of a role the matrix tries every admin route with.
type roleToken struct {
	name, token string
	role        agentqtype.Role
}

// roleCredentials starts an API process whose environment defines a credential of
// every role below admin (the bootstrap one is admin's), and stores one of every role
// through the admin API.
func roleCredentials(t *testing.T, e *env, logs *syncBuffer) (*harness, []roleToken) {
	t.Helper()
	id := testenv.ID()
	envCreds := []agentq.AdminCredential{
		{Name: "env-operator", Role: agentqtype.RoleOperator, Token: "env-operator-" + id},
		{Name: "env-finance", Role: agentqtype.RoleFinance, Token: "env-finance-" + id},
		{Name: "env-viewer", Role: agentqtype.RoleViewer, Token: "env-viewer-" + id},
	}
	h := e.start(t, withLog(logs), func(o *agentq.Options) {
		o.Config.Roles = []string{agentq.RoleAPI}
		o.Config.AdminTokens = envCreds
	})
	creds := []roleToken{{"admin", h.admin, agentqtype.RoleAdmin}}
	for _, c := range envCreds {
		creds = append(creds, roleToken{c.Name, c.Token, c.Role})
	}
	for _, role := range agentqtype.Roles() {
		var out struct{ Token string }
		name := "stored-" + string(role)
		if st, _ := h.do("POST", "/v1/admin/credentials", h.admin, map[string]string{"name": name, "role": string(role)}, &out); st != http.StatusCreated {
			t.Fatalf("create %s: %d", name, st)
		}
		creds = append(creds, roleToken{name, out.Token, role})
	}
	return h, creds
}

var routeParam = regexp.MustCompile(`:[A-Za-z0-9_]+`)

// Every credential of every role against every admin route the server registers, over
// HTTP: a role the route's entry in the role table allows gets past the role check
// (whatever the handler then answers of a made-up id), any other gets 403
// ROLE_FORBIDDEN. No token reaches the log.
func TestRoleMatrixOverHTTP(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	h, creds := roleCredentials(t, newEnv(t), &logs)
	checked := 0
	for _, r := range h.app.API().Echo().Routes() {
		if !strings.HasPrefix(r.Path, "/v1/admin/") {
			continue
		}
		path := routeParam.ReplaceAllString(r.Path, "x-none")
		need := api.MinRole(r.Method, r.Path)
		for _, c := range creds {
			var eb errBody
			st, _ := h.do(r.Method, path, c.token, nil, &eb)
			refused := st == http.StatusForbidden && eb.Error.Code == api.CodeRoleForbidden
			if c.role.Allows(need) == refused || st == http.StatusUnauthorized || st >= 500 {
				t.Errorf("%s %s as %s (%s; the route needs %s): %d %s", r.Method, path, c.name, c.role, need, st, eb.Error.Code)
			}
			if refused && !strings.Contains(eb.Error.Message, c.name) {
				t.Errorf("%s %s as %s: the refusal %q does not name the credential", r.Method, path, c.name, eb.Error.Message)
			}
			checked++
		}
	}
	if checked < 30*len(creds) {
		t.Fatalf("only %d requests checked; the walk over the routes is broken", checked)
	}
	for _, c := range creds {
		if strings.Contains(logs.String(), c.token) {
			t.Errorf("the log holds %s's token", c.name)
		}
	}
}

// A revoked or rotated credential stops working at once on the replica that changed
// it and within about a second on another, which also ends what it had cached.
func TestRevokedCredentialRefusedOnEveryReplica(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	e := newEnv(t)
	a, creds := roleCredentials(t, e, &logs)
	b := e.start(t, func(o *agentq.Options) { o.Config.Roles = []string{agentq.RoleAPI} })
	viewer, operator := creds[len(creds)-1], creds[len(creds)-3]
	for _, h := range []*harness{a, b} {
		for _, c := range []roleToken{viewer, operator} {
			if st, _ := h.do("GET", "/v1/admin/tenants", c.token, nil, nil); st != http.StatusOK {
				t.Fatalf("%s before the change: %d", c.name, st)
			}
		}
	}
	var rotated struct{ Token string }
	if st, _ := a.do("POST", "/v1/admin/credentials/"+operator.name+"/rotate", a.admin, nil, &rotated); st != http.StatusOK {
		t.Fatalf("rotate: %d", st)
	}
	if st, _ := a.do("DELETE", "/v1/admin/credentials/"+viewer.name, a.admin, nil, nil); st != http.StatusNoContent {
		t.Fatalf("revoke: %d", st)
	}
	for _, tok := range []string{viewer.token, operator.token} {
		if st, _ := a.do("GET", "/v1/admin/tenants", tok, nil, nil); st != http.StatusUnauthorized {
			t.Fatalf("an old token on the replica that changed it: %d, want 401", st)
		}
	}
	start := time.Now()
	for _, tok := range []string{viewer.token, operator.token} {
		for {
			st, _ := b.do("GET", "/v1/admin/tenants", tok, nil, nil)
			if st == http.StatusUnauthorized {
				break
			}
			if time.Since(start) > 1500*time.Millisecond {
				t.Fatalf("the other replica still answers an old token %d after %v", st, time.Since(start))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if st, _ := b.do("GET", "/v1/admin/tenants", rotated.Token, nil, nil); st != http.StatusOK {
		t.Fatalf("the rotated token on the other replica: %d", st)
	}
	if strings.Contains(logs.String(), rotated.Token) {
		t.Error("the log holds a rotated token")
	}
}

// The Go client manages credentials, and a client holding a viewer's token reads and
// is refused writes with ROLE_FORBIDDEN; a rotated token stops working.
func TestClientManagesCredentials(t *testing.T) {
	t.Parallel()
	h := newEnv(t).start(t)
	ctx := context.Background()
	admin := h.adminClient()
	made, err := admin.CreateCredential(ctx, "dash", client.RoleViewer)
	if err != nil || made.Token == "" || made.Role != client.RoleViewer || made.Source != "stored" {
		t.Fatalf("CreateCredential: %+v %v", made, err)
	}
	viewer := client.NewAdmin(h.base, made.Token)
	if _, err := viewer.ListTenants(ctx); err != nil {
		t.Fatalf("a viewer's read: %v", err)
	}
	_, err = viewer.CreateTenant(ctx, client.CreateTenantRequest{ID: "nope", Name: "nope", Plan: "free"})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.StatusCode != http.StatusForbidden || ce.Code != "ROLE_FORBIDDEN" {
		t.Fatalf("a viewer's write: %v, want 403 ROLE_FORBIDDEN", err)
	}
	list, err := admin.ListCredentials(ctx)
	if err != nil || !slices.ContainsFunc(list, func(c client.Credential) bool { return c.Name == "dash" && c.RevokedAt == nil }) {
		t.Fatalf("ListCredentials: %+v %v", list, err)
	}
	rotated, err := admin.RotateCredential(ctx, "dash")
	if err != nil || rotated.Token == made.Token {
		t.Fatalf("RotateCredential: %+v %v", rotated, err)
	}
	// The API process changed the credential itself: its own cache forgot it at once.
	if _, err := viewer.ListTenants(ctx); !errors.As(err, &ce) || ce.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the rotated-out token: %v, want 401", err)
	}
	if err := admin.RevokeCredential(ctx, "dash"); err != nil {
		t.Fatal(err)
	}
	if _, err := client.NewAdmin(h.base, rotated.Token).ListTenants(ctx); !errors.As(err, &ce) || ce.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the revoked token: %v, want 401", err)
	}
}
