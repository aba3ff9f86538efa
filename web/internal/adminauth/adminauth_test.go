package adminauth

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/credentials"
)

// Clients are counted per IPv4 address and per IPv6 /64; an address that does not
// parse is counted as it is.
func TestAddrKey(t *testing.T) {
	for remote, want := range map[string]string{
		"192.0.2.1:4000":              "192.0.2.1",
		"[2001:db8:1:2:3:4:5:6]:4000": "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:4000": "2001:db8:1:2::/64",
		"not an address":              "not an address",
		"[::ffff:192.0.2.7]:4000":     "192.0.2.7",
		"[2001:db8::1]:1":             "2001:db8::/64",
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		if got := addrKey(r); got != want {
			t.Errorf("%s: counted as %q, want %q", remote, got, want)
		}
	}
}

// Without a credential every token is wrong; with some, only theirs are right, each
// resolving to its name and role, and wrong tokens from one address are refused past
// the burst, the right one with them.
func TestGuard(t *testing.T) {
	ctx := context.Background()
	for _, off := range []*Guard{New(nil, nil), New(credentials.New(nil, credentials.Options{}), nil)} {
		if on, _ := off.On(ctx); on {
			t.Fatal("a guard without a credential is on")
		}
		for _, tok := range []string{"", "anything"} {
			if _, ok, err := off.Resolve(ctx, tok); ok || err != nil {
				t.Fatalf("a guard without a credential accepts %q: %v", tok, err)
			}
		}
	}
	g := New(credentials.New(nil, credentials.Options{Bootstrap: "s3cret",
		Env: []config.AdminCredential{{Name: "audit", Role: agentqtype.RoleViewer, Token: "v1ew"}}}), nil)
	if on, _ := g.On(ctx); !on {
		t.Fatal("a guard with credentials is off")
	}
	for tok, want := range map[string]string{"s3cret": "admin/admin", "v1ew": "audit/viewer", "s3cre": "", "s3cret ": "",
		"v1ew\x00": "", string(make([]byte, MaxTokenBytes+1)): ""} {
		c, ok, err := g.Resolve(ctx, tok)
		if got := c.Name + "/" + string(c.Role); err != nil || ok != (want != "") || (ok && got != want) {
			t.Fatalf("Resolve(%q) = %s %v %v, want %q", tok, got, ok, err, want)
		}
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "192.0.2.1:4000"
	for i := range FailureBucket.Burst {
		if a, err := g.Attempt(context.Background(), r, false); err != nil || !a.Allowed {
			t.Fatalf("wrong token %d: %+v %v, want allowed", i+1, a, err)
		}
	}
	if a, _ := g.Attempt(context.Background(), r, true); a.Allowed || RetryAfter(a) < 1 {
		t.Fatalf("the right token after the burst of wrong ones: %+v, want refused with a wait", a)
	}
}
