package migrations_test

import (
	"context"
	"slices"
	"testing"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/testenv"
)

// The CHECK on admin_credentials.role allows exactly agentqtype's roles.
func TestCredentialRoleCheckIsTheVocabulary(t *testing.T) {
	pool := testenv.Postgres(t)
	var def string
	err := pool.QueryRow(context.Background(), `
		SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
		JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
		WHERE c.conrelid = 'admin_credentials'::regclass AND c.contype = 'c' AND a.attname = 'role'`).Scan(&def)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]string, 0, 4)
	for _, r := range agentqtype.Roles() {
		want = append(want, string(r))
	}
	slices.Sort(want)
	if got := checkedStates(def); !slices.Equal(got, want) {
		t.Errorf("admin_credentials.role CHECK allows %v, agentqtype.Roles() is %v (CHECK: %s)", got, want, def)
	}
}
