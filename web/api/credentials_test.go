package api

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/agentq/agentq/web/internal/webtest"
)

var credentialFields = []string{"name", "role", "source", "created_at", "rotated_at", "revoked_at"}

// The admin role creates, lists, rotates and revokes credentials; the token is in the
// answers to create and rotate only; each change applies at once; the environment's
// credentials are listed and cannot be changed here.
func TestCredentialHandlers(t *testing.T) {
	t.Parallel()
	f := newAPIFixture(t)
	st, body := f.call("POST", "/v1/admin/credentials", f.admin, `{"name":"ops","role":"operator"}`)
	var created struct {
		Token  string `json:"token"`
		Source string `json:"source"`
	}
	if err := json.Unmarshal(body, &created); st != http.StatusCreated || err != nil || !strings.HasPrefix(created.Token, "aqadm_") ||
		created.Source != "stored" || !slices.Equal(webtest.TopKeys(t, body), append(slices.Clone(credentialFields), "token")) {
		t.Fatalf("create: %d %s", st, body)
	}
	if st, _ := f.call("GET", "/v1/admin/tenants", created.Token, ""); st != http.StatusOK {
		t.Fatalf("the new operator credential reads tenants: %d", st)
	}
	if st, body := f.call("GET", "/v1/admin/credentials", created.Token, ""); st != http.StatusForbidden || code(t, body) != CodeRoleForbidden {
		t.Fatalf("an operator lists credentials: %d %s, want 403 ROLE_FORBIDDEN", st, body)
	}
	st, body = f.call("GET", "/v1/admin/credentials", f.admin, "")
	var list struct{ Credentials []json.RawMessage }
	if err := json.Unmarshal(body, &list); st != http.StatusOK || err != nil || len(list.Credentials) != 2 || strings.Contains(string(body), created.Token) ||
		strings.Contains(string(body), f.admin) || !slices.Equal(webtest.TopKeys(t, list.Credentials[1]), credentialFields) {
		t.Fatalf("list: %d %s", st, body)
	}
	if !strings.Contains(string(list.Credentials[0]), `"name":"admin","role":"admin","source":"bootstrap"`) {
		t.Errorf("the bootstrap credential is listed as %s", list.Credentials[0])
	}

	st, body = f.call("POST", "/v1/admin/credentials/ops/rotate", f.admin, "")
	var rotated struct{ Token string }
	if err := json.Unmarshal(body, &rotated); st != http.StatusOK || err != nil || rotated.Token == created.Token || !strings.HasPrefix(rotated.Token, "aqadm_") {
		t.Fatalf("rotate: %d %s", st, body)
	}
	if old, now := status(f, created.Token), status(f, rotated.Token); old != http.StatusUnauthorized || now != http.StatusOK {
		t.Fatalf("after rotation: the old token %d, the new %d", old, now)
	}
	if st, body := f.call("DELETE", "/v1/admin/credentials/ops", f.admin, ""); st != http.StatusNoContent || len(body) != 0 {
		t.Fatalf("revoke: %d %s", st, body)
	}
	if st := status(f, rotated.Token); st != http.StatusUnauthorized {
		t.Fatalf("a revoked credential's token: %d, want 401", st)
	}
	for _, tc := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"POST", "/v1/admin/credentials", `{"name":"ops","role":"viewer"}`, 409, CodeConflict},
		{"POST", "/v1/admin/credentials", `{"name":"admin","role":"viewer"}`, 409, CodeConflict},
		{"POST", "/v1/admin/credentials", `{"name":"new","role":"root"}`, 400, CodeInvalidRequest},
		{"POST", "/v1/admin/credentials", `{"name":"New","role":"viewer"}`, 400, CodeInvalidRequest},
		{"POST", "/v1/admin/credentials", `{"name":"new"}`, 400, CodeInvalidRequest},
		{"POST", "/v1/admin/credentials", `{"name":"new","role":"viewer","token":"mine"}`, 400, CodeInvalidRequest},
		{"POST", "/v1/admin/credentials/admin/rotate", "", 409, CodeConflict},
		{"DELETE", "/v1/admin/credentials/admin", "", 409, CodeConflict},
		{"DELETE", "/v1/admin/credentials/ops", "", 404, CodeNotFound},
		{"POST", "/v1/admin/credentials/nobody/rotate", "", 404, CodeNotFound},
	} {
		st, body := f.call(tc.method, tc.path, f.admin, tc.body)
		if st != tc.status || code(t, body) != tc.code {
			t.Errorf("%s %s %s: %d %s, want %d %s", tc.method, tc.path, tc.body, st, body, tc.status, tc.code)
		}
	}
}

func status(f *apiFixture, token string) int {
	st, _ := f.call("GET", "/v1/admin/tenants", token, "")
	return st
}

func code(t *testing.T, body []byte) string {
	t.Helper()
	c, _ := errorOf(t, body)
	return c
}
