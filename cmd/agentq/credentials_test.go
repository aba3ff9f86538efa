package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// `agentq admin credentials` creates, lists, rotates and revokes credentials in the
// server's database: a created token works on the running server, list never shows a
// token, the environment's credentials are listed but cannot be changed, and a
// revocation reaches the server at once.
func TestCLICredentials(t *testing.T) {
	t.Parallel()
	h := newAdminHarness(t)
	out, err := h.cli("credentials", "create", "ops", "--role", "viewer")
	var created struct{ Name, Role, Source, Token string }
	if err != nil || json.Unmarshal([]byte(out), &created) != nil || created.Role != "viewer" || created.Source != "stored" ||
		!strings.HasPrefix(created.Token, "aqadm_") {
		t.Fatalf("create: %q %v", out, err)
	}
	get := func(token string) int {
		req, _ := http.NewRequest("GET", h.base+"/v1/admin/tenants", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := get(created.Token); st != http.StatusOK {
		t.Fatalf("the created token on the server: %d", st)
	}
	out, err = h.cli("credentials", "rotate", "ops")
	var rotated struct{ Token string }
	if err != nil || json.Unmarshal([]byte(out), &rotated) != nil || rotated.Token == created.Token || get(rotated.Token) != http.StatusOK {
		t.Fatalf("rotate: %q %v", out, err)
	}
	out, err = h.cli("credentials", "list")
	var list []struct{ Name, Role, Source string }
	if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list) != 3 || list[0].Source != "bootstrap" ||
		list[1].Name != "ci" || list[1].Source != "env" || list[2].Name != "ops" {
		t.Fatalf("list: %q %v", out, err)
	}
	for _, secret := range []string{created.Token, rotated.Token, h.token, "ci-"} {
		if strings.Contains(out, secret) {
			t.Errorf("list shows a token: %s", out)
		}
	}
	for _, args := range [][]string{{"rotate", "ci"}, {"revoke", "admin"}, {"create", "ci", "--role", "admin"}} {
		if _, err := h.cli(append([]string{"credentials"}, args...)...); err == nil || !strings.Contains(err.Error(), "environment") {
			t.Errorf("credentials %v: %v, want a refusal naming the environment", args, err)
		}
	}
	if _, err := h.cli("credentials", "create", "x", "--role", "root"); err == nil || !strings.Contains(err.Error(), "role must be one of") {
		t.Errorf("an unknown role: %v", err)
	}
	if out, err := h.cli("credentials", "revoke", "ops"); err != nil || out != "revoked ops\n" {
		t.Fatalf("revoke: %q %v", out, err)
	}
	deadline := time.Now().Add(time.Second)
	for get(rotated.Token) != http.StatusUnauthorized {
		if time.Now().After(deadline) {
			t.Fatal("the server still accepts a token revoked by the CLI a second later")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
