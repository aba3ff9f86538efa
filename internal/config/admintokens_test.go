package config

import (
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"github.com/agentq/agentq/agentqtype"
)

// AGENTQ_ADMIN_TOKENS is name:role:token entries; a refused entry is named by its
// position (and its name once valid), never by its token or by a field that may be
// one out of place.
func TestParseAdminTokens(t *testing.T) {
	for _, tc := range []struct {
		env     string
		want    []AdminCredential
		wantErr string // a fragment of the error; "" for none
	}{
		{env: "ops:operator:t0ps3cret", want: []AdminCredential{{"ops", agentqtype.RoleOperator, "t0ps3cret"}}},
		{env: " ops:operator:a:b:c , fin:finance:f1n ", want: []AdminCredential{
			{"ops", agentqtype.RoleOperator, "a:b:c"}, {"fin", agentqtype.RoleFinance, "f1n"}}},
		{env: "root:admin:r00t,look.only:viewer:v1ew", want: []AdminCredential{
			{"root", agentqtype.RoleAdmin, "r00t"}, {"look.only", agentqtype.RoleViewer, "v1ew"}}},
		{env: "s3cretvalue", wantErr: "entry 1: want name:role:token"},
		{env: "ops:operator:t0ps3cret,", wantErr: "entry 2: want name:role:token"},
		{env: "ops:s3cretvalue", wantErr: "entry 1: want name:role:token"},
		{env: "ops:root:s3cretvalue", wantErr: `entry 1 ("ops"): the role must be one of`},
		{env: "ops:s3cretvalue:operator", wantErr: `entry 1 ("ops"): the role must be one of`},
		{env: "S3cretvalue+/=:admin:ops", wantErr: "entry 1: the name must be"},
		{env: "Ops:operator:s3cretvalue", wantErr: "entry 1: the name must be"},
		{env: "ops:operator:", wantErr: `entry 1 ("ops"): the token is empty`},
		{env: "ops:operator:s3cretvalue,ops:viewer:other", wantErr: `entry 2 ("ops"): entry 1 has the same name`},
		{env: "a:operator:s3cretvalue,b:viewer:s3cretvalue", wantErr: `entry 2 ("b"): entry 1 has the same token`},
		{env: "admin:admin:s3cretvalue", wantErr: `entry 1 ("admin"): "admin" is the name of AGENTQ_ADMIN_TOKEN's credential`},
	} {
		got, err := ParseAdminTokens(tc.env)
		if tc.wantErr == "" {
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("%q: %v %v, want %v", tc.env, got, err, tc.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.HasPrefix(err.Error(), "AGENTQ_ADMIN_TOKENS entry") {
			t.Errorf("%q: error %v, want one with %q", tc.env, err, tc.wantErr)
		}
		if err != nil && strings.Contains(strings.ToLower(err.Error()), "s3cretvalue") {
			t.Errorf("%q: the error %q quotes the token", tc.env, err)
		}
	}
}

// FromEnv reads AGENTQ_ADMIN_TOKENS and refuses a bad one naming the variable; Check
// refuses the same in a Config built in Go, and an entry with the bootstrap token.
func TestAdminTokensConfig(t *testing.T) {
	t.Setenv("AGENTQ_ADMIN_TOKENS", "ops:operator:t0ps3cret")
	c, err := FromEnv()
	if err != nil || len(c.AdminTokens) != 1 || c.AdminTokens[0].Name != "ops" || c.Check(true, true) != nil {
		t.Fatalf("FromEnv: %v %v", c.AdminTokens, err)
	}
	t.Setenv("AGENTQ_ADMIN_TOKENS", "ops:god:t0ps3cret")
	if _, err := FromEnv(); err == nil || !strings.Contains(err.Error(), "AGENTQ_ADMIN_TOKENS entry 1") || strings.Contains(err.Error(), "t0ps3cret") {
		t.Fatalf("FromEnv with a bad entry: %v", err)
	}
	for _, bad := range []func(*Config){
		func(c *Config) { c.AdminTokens = []AdminCredential{{"ops", "god", "t0ps3cret"}} },
		func(c *Config) { c.AdminTokens = []AdminCredential{{"ops", agentqtype.RoleViewer, ""}} },
		func(c *Config) {
			c.AdminToken = "t0ps3cret"
			c.AdminTokens = []AdminCredential{{"ops", agentqtype.RoleViewer, "t0ps3cret"}}
		},
	} {
		c := Defaults()
		bad(&c)
		var ce *Error
		if err := c.Check(true, true); !errors.As(err, &ce) || ce.Field != "AdminTokens" || strings.Contains(err.Error(), "t0ps3cret") {
			t.Errorf("Check: %v, want an error naming AdminTokens without the token", err)
		}
	}
}

// A credential printed or logged shows its name and role, never its token.
func TestAdminCredentialHidesItsToken(t *testing.T) {
	c := AdminCredential{"ops", agentqtype.RoleOperator, "t0ps3cret"}
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("credential", "c", c, "all", []AdminCredential{c})
	for _, s := range []string{fmt.Sprint(c), fmt.Sprintf("%v %+v %#v %s", c, c, c, c), fmt.Sprint([]AdminCredential{c}), logged.String()} {
		if strings.Contains(s, "t0ps3cret") || !strings.Contains(s, "ops") {
			t.Errorf("%q shows the token, or not the name", s)
		}
	}
}
