package agentqtype_test

import (
	"testing"

	"github.com/agentq/agentq/agentqtype"
)

// Each role allows what it and every role below it may do; an unknown role allows
// nothing, and nothing allows an unknown need.
func TestRoleAllows(t *testing.T) {
	roles := agentqtype.Roles()
	if len(roles) != 4 || roles[0] != agentqtype.RoleAdmin || roles[3] != agentqtype.RoleViewer {
		t.Fatalf("Roles() = %v", roles)
	}
	for i, have := range roles {
		for j, need := range roles {
			if got := have.Allows(need); got != (i <= j) {
				t.Errorf("%s.Allows(%s) = %v", have, need, got)
			}
		}
		if !have.Valid() || have.Allows("root") || agentqtype.Role("root").Allows(have) || agentqtype.Role("").Allows(have) {
			t.Errorf("%s: an unknown role is allowed or allows", have)
		}
	}
}

func TestValidCredentialName(t *testing.T) {
	for name, want := range map[string]bool{
		"ops": true, "ci-deploy": true, "a.b_c": true, "0": true, "": false, "Ops": false, "-ops": false,
		"a:b": false, "a,b": false, "a/b": false, string(make([]byte, 64)): false,
	} {
		if got := agentqtype.ValidCredentialName(name); got != want {
			t.Errorf("ValidCredentialName(%q) = %v", name, got)
		}
	}
}
