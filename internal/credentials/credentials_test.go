package credentials_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/credentials"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv"
)

var envCreds = []config.AdminCredential{{Name: "ci", Role: agentqtype.RoleOperator, Token: "ci-token-from-env"}}

func newService(t *testing.T) (*credentials.Service, *store.Store) {
	t.Helper()
	st := store.New(testenv.Postgres(t))
	return credentials.New(st, credentials.Options{Bootstrap: "bootstrap-token", Env: envCreds}), st
}

// who is what a token resolves to: "name/role/source", or "" for none.
func who(t *testing.T, s *credentials.Service, token string) string {
	t.Helper()
	c, err := s.Authenticate(context.Background(), token)
	if errors.Is(err, credentials.ErrInvalid) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return c.Name + "/" + string(c.Role) + "/" + string(c.Source)
}

// Create returns the token once and stores only its hash; the token then resolves to
// its name and role, like the environment's. Rotation replaces it at once, revocation
// ends it at once.
func TestStoredCredentialLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, st := newService(t)
	if got := who(t, s, "bootstrap-token") + " " + who(t, s, "ci-token-from-env"); got != "admin/admin/bootstrap ci/operator/env" {
		t.Fatalf("the environment's tokens resolve to %q", got)
	}
	c, err := s.Create(ctx, credentials.CreateParams{Name: "alice", Role: agentqtype.RoleFinance})
	if err != nil || !strings.HasPrefix(c.Token, credentials.TokenPrefix) || len(c.Token) != len(credentials.TokenPrefix)+64 {
		t.Fatalf("Create: %+v %v", c, err)
	}
	row, err := st.GetCredential(ctx, store.GetCredentialParams{Name: "alice"})
	if err != nil || bytes.Contains(row.TokenHash, []byte(c.Token)) || len(row.TokenHash) != 32 || row.Role != agentqtype.RoleFinance {
		t.Fatalf("stored row %+v %v: want the token's hash only", row, err)
	}
	if got := who(t, s, c.Token); got != "alice/finance/stored" {
		t.Fatalf("the new token resolves to %q", got)
	}
	r, err := s.Rotate(ctx, credentials.RotateParams{Name: "alice"})
	if err != nil || r.Token == c.Token || r.RotatedAt == nil {
		t.Fatalf("Rotate: %+v %v", r, err)
	}
	if old, now := who(t, s, c.Token), who(t, s, r.Token); old != "" || now != "alice/finance/stored" {
		t.Fatalf("after rotation the old token resolves to %q, the new to %q", old, now)
	}
	if _, err := s.Revoke(ctx, credentials.RevokeParams{Name: "alice"}); err != nil {
		t.Fatal(err)
	}
	if got := who(t, s, r.Token); got != "" {
		t.Fatalf("a revoked token resolves to %q", got)
	}
	if _, err := s.Lookup(ctx, "alice"); !errors.Is(err, credentials.ErrInvalid) {
		t.Fatalf("Lookup of a revoked credential: %v", err)
	}
	var nf *agentqtype.NotFoundError
	if _, err := s.Revoke(ctx, credentials.RevokeParams{Name: "alice"}); !errors.As(err, &nf) {
		t.Fatalf("revoking again: %v, want not found", err)
	}
	if _, err := s.Rotate(ctx, credentials.RotateParams{Name: "alice"}); !errors.As(err, &nf) {
		t.Fatalf("rotating a revoked one: %v, want not found", err)
	}
}

// List shows every credential with its source and never a token; the names taken,
// the environment's and refused fields are refused with sentences.
func TestCredentialListAndRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newService(t)
	bob, err := s.Create(ctx, credentials.CreateParams{Name: "bob", Role: agentqtype.RoleViewer})
	if err != nil {
		t.Fatal(err)
	}
	list, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(list)
	var names []string
	for _, c := range list {
		names = append(names, c.Name+"/"+string(c.Source))
	}
	if strings.Join(names, " ") != "admin/bootstrap ci/env bob/stored" {
		t.Errorf("List: %v", names)
	}
	for _, secret := range []string{bob.Token, "bootstrap-token", "ci-token-from-env"} {
		if strings.Contains(string(raw), secret) {
			t.Errorf("the list shows a token: %s", raw)
		}
	}
	var conflict *credentials.ConflictError
	var inv *agentqtype.InvalidError
	for _, tc := range []struct {
		name, role string
		env        bool // a conflict with the environment's
		invalid    bool
	}{
		{"bob", "viewer", false, false}, {"ci", "viewer", true, false}, {"admin", "admin", true, false},
		{"Bob", "viewer", false, true}, {"carol", "root", false, true}, {"", "viewer", false, true},
	} {
		_, err := s.Create(ctx, credentials.CreateParams{Name: tc.name, Role: agentqtype.Role(tc.role)})
		switch {
		case tc.invalid && !errors.As(err, &inv):
			t.Errorf("create %q %q: %v, want invalid", tc.name, tc.role, err)
		case !tc.invalid && (!errors.As(err, &conflict) || conflict.FromEnv != tc.env):
			t.Errorf("create %q: %v, want a conflict (environment's: %v)", tc.name, err, tc.env)
		}
	}
	for _, name := range []string{"ci", "admin"} {
		if _, err := s.Rotate(ctx, credentials.RotateParams{Name: name}); !errors.As(err, &conflict) || !conflict.FromEnv {
			t.Errorf("rotate %q: %v, want the environment's conflict", name, err)
		}
		if _, err := s.Revoke(ctx, credentials.RevokeParams{Name: name}); !errors.As(err, &conflict) || !conflict.FromEnv {
			t.Errorf("revoke %q: %v, want the environment's conflict", name, err)
		}
	}
}

// Another replica, which heard nothing of the change, stops accepting a revoked or
// rotated token within its cache's second.
func TestChangesReachAnotherReplicaWithinASecond(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, st := newService(t)
	b := credentials.New(st, credentials.Options{})
	c, err := a.Create(ctx, credentials.CreateParams{Name: "ops", Role: agentqtype.RoleOperator})
	if err != nil {
		t.Fatal(err)
	}
	if got := who(t, b, c.Token); got != "ops/operator/stored" {
		t.Fatalf("replica B resolves the token to %q", got)
	}
	if on, err := b.Configured(ctx); !on || err != nil {
		t.Fatalf("replica B with a stored credential: configured %v %v", on, err)
	}
	if _, err := a.Revoke(ctx, credentials.RevokeParams{Name: "ops"}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for who(t, b, c.Token) != "" {
		if time.Since(start) > 1500*time.Millisecond {
			t.Fatal("replica B still accepts a revoked token after 1.5 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second)
	if on, err := b.Configured(ctx); on || err != nil {
		t.Fatalf("replica B with no live credential: configured %v %v", on, err)
	}
}

// A credential's session key changes with its token, and differs between
// credentials.
func TestSessionKeyFollowsTheToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newService(t)
	c, err := s.Create(ctx, credentials.CreateParams{Name: "ops", Role: agentqtype.RoleOperator})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := s.Lookup(ctx, "ops")
	if !bytes.Equal(before.SessionKey(), c.SessionKey()) {
		t.Fatal("a credential looked up has another session key than when it was created")
	}
	if _, err := s.Rotate(ctx, credentials.RotateParams{Name: "ops"}); err != nil {
		t.Fatal(err)
	}
	after, _ := s.Lookup(ctx, "ops")
	ci, _ := s.Lookup(ctx, "ci")
	if bytes.Equal(before.SessionKey(), after.SessionKey()) || bytes.Equal(after.SessionKey(), ci.SessionKey()) {
		t.Fatal("the session key does not follow the token")
	}
}
