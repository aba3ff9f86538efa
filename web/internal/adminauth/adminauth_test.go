package adminauth

import (
	"context"
	"net/http/httptest"
	"testing"
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

// Without an admin token every token is wrong; with one, only it is right, and wrong
// tokens from one address are refused past the burst, the right one with them.
func TestGuard(t *testing.T) {
	if off := New("", nil); off.Key() != nil || off.Check("") || off.Check("anything") {
		t.Fatal("a guard without an admin token accepts a token")
	}
	g := New("s3cret", nil)
	if !g.Check("s3cret") || g.Check("s3cre") || g.Check("s3cret ") || g.Check(string(make([]byte, MaxTokenBytes+1))) {
		t.Fatal("Check does not tell the admin token from others")
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
