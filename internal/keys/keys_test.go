package keys_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/apikey"
	"github.com/agentq/agentq/internal/keys"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas/admission"
)

// publisher is the invalidation the CLI and the servers use: a message on the channel
// the servers listen to.
type publisher struct {
	rdb redis.UniversalClient
	rk  rkeys.Keys
}

func (p publisher) InvalidateKey(ctx context.Context, kid string) error {
	return p.rdb.Publish(ctx, p.rk.KeysChangedChannel(), "k:"+kid).Err()
}

// recorder records invalidations, and fails them when err is set.
type recorder struct {
	mu   sync.Mutex
	kids []string
	err  error
}

func (r *recorder) InvalidateKey(_ context.Context, kid string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kids = append(r.kids, kid)
	return r.err
}

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.kids...)
}

type env struct {
	st  *store.Store
	rdb *redis.Client
	rk  rkeys.Keys
}

func setup(t *testing.T, tenantIDs ...string) env {
	t.Helper()
	st := store.New(testenv.Postgres(t))
	rdb, rk := testenv.Redis(t, 1)
	for _, id := range tenantIDs {
		if _, err := st.CreateTenant(context.Background(), store.CreateTenantParams{ID: id, Name: id, Plan: "pro"}); err != nil {
			t.Fatal(err)
		}
	}
	return env{st: st, rdb: rdb, rk: rk}
}

func wantNotFound(t *testing.T, what string, err error, msg string) {
	t.Helper()
	var nf *agentqtype.NotFoundError
	if !errors.As(err, &nf) || !errors.Is(err, agentqtype.ErrNotFound) || nf.Message != msg || err.Error() != msg {
		t.Errorf("%s: got %v (%T), want a *agentqtype.NotFoundError %q", what, err, err, msg)
	}
}

func TestKeyCreateAndList(t *testing.T) {
	ctx := context.Background()
	e := setup(t, "acme", "other")
	svc := keys.New(e.st, keys.Options{})

	ks, err := svc.List(ctx, "acme")
	if err != nil || ks == nil || len(ks) != 0 {
		t.Fatalf("list before any key: %#v %v, want an empty non-nil list", ks, err)
	}
	sc := store.Scopes{Agents: []string{"sim", "écho"}, Principals: []string{strings.Repeat("u", keys.MaxScopeEntry)}}
	k1, err := svc.Create(ctx, keys.CreateParams{TenantID: "acme", Scopes: sc})
	if err != nil {
		t.Fatal(err)
	}
	if k1.TenantID != "acme" || !reflect.DeepEqual(k1.Scopes, sc) || k1.CreatedAt.IsZero() || k1.RotatedAt != nil || k1.RevokedAt != nil {
		t.Errorf("created %+v", k1.Key)
	}
	kid, secret, err := apikey.Parse(k1.Plaintext)
	if err != nil || kid != k1.Kid || !strings.HasPrefix(kid, "acme-") {
		t.Fatalf("plaintext %q parses to %q, %v; kid %q", k1.Plaintext, kid, err, k1.Kid)
	}
	stored, err := e.st.UnscopedGetKey(ctx, k1.Kid)
	if err != nil || !apikey.Verify(stored.SecretHash, secret) {
		t.Fatalf("the stored hash does not verify the plaintext (%v)", err)
	}
	k2, err := svc.Create(ctx, keys.CreateParams{TenantID: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Create(ctx, keys.CreateParams{TenantID: "other"}); err != nil {
		t.Fatal(err)
	}
	ks, err = svc.List(ctx, "acme")
	if err != nil || len(ks) != 2 || ks[0].Kid != k1.Kid || ks[1].Kid != k2.Kid {
		t.Fatalf("list: %+v %v, want %s then %s", ks, err, k1.Kid, k2.Kid)
	}

	_, err = svc.Create(ctx, keys.CreateParams{TenantID: "ghost"})
	wantNotFound(t, "create for a missing tenant", err, `No tenant "ghost".`)
	_, err = svc.List(ctx, "ghost")
	wantNotFound(t, "list of a missing tenant", err, `No tenant "ghost".`)
}

func TestKeyScopesRefused(t *testing.T) {
	ctx := context.Background()
	e := setup(t, "acme")
	svc := keys.New(e.st, keys.Options{})
	const msg = "Scope entries must be 1 to 255 bytes without control characters."
	for name, sc := range map[string]store.Scopes{
		"empty agent":             {Agents: []string{"sim", ""}},
		"empty principal":         {Principals: []string{""}},
		"control character":       {Agents: []string{"si\x01m"}},
		"DEL":                     {Principals: []string{"u\x7f"}},
		"C1 control":              {Agents: []string{"a\u0085"}},
		"NUL":                     {Agents: []string{"a\x00"}},
		"too long":                {Principals: []string{strings.Repeat("u", keys.MaxScopeEntry+1)}},
		"invalid UTF-8":           {Agents: []string{"\xff"}},
		"bad entry after good":    {Agents: []string{"sim"}, Principals: []string{"ok", "b\nad"}},
		"too long multibyte text": {Agents: []string{strings.Repeat("é", 128)}},
	} {
		_, err := svc.Create(ctx, keys.CreateParams{TenantID: "acme", Scopes: sc})
		var inv *agentqtype.InvalidError
		if !errors.As(err, &inv) || inv.Field != "scopes" || inv.Message != msg || err.Error() != msg {
			t.Errorf("%s: got %v, want InvalidError %q", name, err, msg)
		}
		if err := keys.ValidateScopes(sc); err == nil {
			t.Errorf("%s: ValidateScopes accepted it", name)
		}
	}
	// Scopes are judged before the tenant: a bad scope for a missing tenant is a 400.
	_, err := svc.Create(ctx, keys.CreateParams{TenantID: "ghost", Scopes: store.Scopes{Agents: []string{""}}})
	var inv *agentqtype.InvalidError
	if !errors.As(err, &inv) {
		t.Errorf("bad scope for a missing tenant: %v, want InvalidError", err)
	}
	if ks, err := svc.List(ctx, "acme"); err != nil || len(ks) != 0 {
		t.Errorf("refused keys were written: %+v %v", ks, err)
	}
}

func TestKeyRotate(t *testing.T) {
	ctx := context.Background()
	e := setup(t, "acme")
	rec := &recorder{}
	svc := keys.New(e.st, keys.Options{Invalidator: rec})
	k, err := svc.Create(ctx, keys.CreateParams{TenantID: "acme", Scopes: store.Scopes{Agents: []string{"sim"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := rec.got(); len(got) != 0 {
		t.Errorf("creation invalidated %v", got)
	}
	r, err := svc.Rotate(ctx, k.Kid)
	if err != nil {
		t.Fatal(err)
	}
	if r.Kid != k.Kid || r.Plaintext == k.Plaintext || r.RotatedAt == nil || !reflect.DeepEqual(r.Scopes, k.Scopes) || !r.CreatedAt.Equal(k.CreatedAt) {
		t.Errorf("rotated %+v from %+v", r.Key, k.Key)
	}
	stored, err := e.st.UnscopedGetKey(ctx, k.Kid)
	if err != nil {
		t.Fatal(err)
	}
	_, oldSecret, _ := apikey.Parse(k.Plaintext)
	_, newSecret, _ := apikey.Parse(r.Plaintext)
	if apikey.Verify(stored.SecretHash, oldSecret) || !apikey.Verify(stored.SecretHash, newSecret) {
		t.Errorf("after rotation the stored hash should verify only the new secret")
	}
	if got := rec.got(); !reflect.DeepEqual(got, []string{k.Kid}) {
		t.Errorf("invalidations %v, want [%s]", got, k.Kid)
	}

	for _, kid := range []string{"acme-00000000", "not a kid", "", "acme-" + strings.Repeat("0", 300)} {
		_, err := svc.Rotate(ctx, kid)
		wantNotFound(t, "rotate "+kid, err, `No live key "`+kid+`".`)
	}
	if _, err := svc.Revoke(ctx, k.Kid); err != nil {
		t.Fatal(err)
	}
	_, err = svc.Rotate(ctx, k.Kid)
	wantNotFound(t, "rotate a revoked key", err, `No live key "`+k.Kid+`".`)

	// A failed invalidation does not fail the rotation: servers catch up within the
	// cache TTL.
	rec.err = errors.New("redis down")
	k2, err := svc.Create(ctx, keys.CreateParams{TenantID: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Rotate(ctx, k2.Kid); err != nil {
		t.Errorf("rotation with a failing invalidator: %v", err)
	}
}

// Revocation publishes the invalidation on Redis and drops exactly the revoked key's
// limit state, on real Redis.
func TestKeyRevokeDropsLimitState(t *testing.T) {
	ctx := context.Background()
	e := setup(t, "acme")
	q := admission.New(e.rdb, e.rk, nil)
	svc := keys.New(e.st, keys.Options{Invalidator: publisher{e.rdb, e.rk}, Limits: q})
	k, err := svc.Create(ctx, keys.CreateParams{TenantID: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := svc.Create(ctx, keys.CreateParams{TenantID: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	h := e.rk.AdmissionState("acme")
	if err := e.rdb.HSet(ctx, h,
		"k:"+k.Kid, "1", "a:"+k.Kid+":sim", "1", "a:"+k.Kid+":echo", "1",
		"k:"+other.Kid, "1", "a:"+other.Kid+":sim", "1", "t", "1").Err(); err != nil {
		t.Fatal(err)
	}
	sub := e.rdb.Subscribe(ctx, e.rk.KeysChangedChannel())
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription confirmation
		t.Fatal(err)
	}

	before, err := svc.Revoke(ctx, k.Kid)
	if err != nil {
		t.Fatal(err)
	}
	if before.Kid != k.Kid || before.TenantID != "acme" {
		t.Errorf("revoke returned %+v", before)
	}
	select {
	case m := <-sub.Channel():
		if m.Payload != "k:"+k.Kid {
			t.Errorf("invalidation %q, want k:%s", m.Payload, k.Kid)
		}
	case <-time.After(5 * time.Second):
		t.Error("no invalidation published")
	}
	fields, err := e.rdb.HKeys(ctx, h).Result()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"k:" + other.Kid: true, "a:" + other.Kid + ":sim": true, "t": true}
	if len(fields) != len(want) {
		t.Errorf("admission fields after revocation: %v, want %v", fields, want)
	}
	for _, f := range fields {
		if !want[f] {
			t.Errorf("field %q survived the revocation of %s", f, k.Kid)
		}
	}
	stored, err := e.st.UnscopedGetKey(ctx, k.Kid)
	if err != nil || stored.RevokedAt == nil {
		t.Errorf("stored key after revocation: %+v %v", stored, err)
	}

	_, err = svc.Revoke(ctx, k.Kid)
	wantNotFound(t, "revoke twice", err, `No live key "`+k.Kid+`".`)
	for _, kid := range []string{"acme-00000000", "nonsense", ""} {
		_, err := svc.Revoke(ctx, kid)
		wantNotFound(t, "revoke "+kid, err, `No live key "`+kid+`".`)
	}
	if ks, err := svc.List(ctx, "acme"); err != nil || len(ks) != 2 || ks[0].RevokedAt == nil || ks[1].RevokedAt != nil {
		t.Errorf("list after revocation: %+v %v", ks, err)
	}
}

// Without Redis collaborators the service still writes: servers see the change when
// their caches expire.
func TestKeyRevokeWithoutRedis(t *testing.T) {
	ctx := context.Background()
	e := setup(t, "acme")
	svc := keys.New(e.st, keys.Options{})
	k, err := svc.Create(ctx, keys.CreateParams{TenantID: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Rotate(ctx, k.Kid); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Revoke(ctx, k.Kid); err != nil {
		t.Fatal(err)
	}
	if stored, err := e.st.UnscopedGetKey(ctx, k.Kid); err != nil || stored.RevokedAt == nil {
		t.Errorf("stored key: %+v %v", stored, err)
	}
}

// Authenticate reads keys through the service's cache; the service's own rotation and
// revocation drop the cached key at once, Forget drops one another process changed.
func TestAuthenticateAndItsCache(t *testing.T) {
	ctx := context.Background()
	e := setup(t, "acme")
	svc := keys.New(e.st, keys.Options{CacheTTL: time.Hour})
	k, err := svc.Create(ctx, keys.CreateParams{TenantID: "acme", Scopes: keys.Scopes{Agents: []string{"sim"}}})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := svc.Authenticate(ctx, k.Plaintext)
	if err != nil || rec.Kid != k.Kid || rec.TenantID != "acme" || !reflect.DeepEqual(rec.Agents, []string{"sim"}) {
		t.Fatalf("Authenticate: %+v %v", rec, err)
	}
	for _, bad := range []string{"", "aq_x", "aq_" + k.Kid + "_" + strings.Repeat("0", 64), "aq_acme-00000000_" + strings.Repeat("0", 64)} {
		if _, err := svc.Authenticate(ctx, bad); !errors.Is(err, keys.ErrInvalidKey) {
			t.Errorf("Authenticate(%q): %v, want ErrInvalidKey", bad, err)
		}
	}
	r, err := svc.Rotate(ctx, k.Kid)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Authenticate(ctx, k.Plaintext); !errors.Is(err, keys.ErrInvalidKey) {
		t.Errorf("the old secret after rotation: %v", err)
	}
	if _, err := svc.Authenticate(ctx, r.Plaintext); err != nil {
		t.Errorf("the new secret: %v", err)
	}

	// Another process (a second service, no invalidator) revokes it: this one keeps
	// honouring its cached key until told.
	if _, err := keys.New(e.st, keys.Options{}).Revoke(ctx, k.Kid); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Authenticate(ctx, r.Plaintext); err != nil {
		t.Errorf("cached key before Forget: %v", err)
	}
	svc.Forget(k.Kid)
	if _, err := svc.Authenticate(ctx, r.Plaintext); !errors.Is(err, keys.ErrInvalidKey) {
		t.Errorf("a revoked key after Forget: %v", err)
	}
}
