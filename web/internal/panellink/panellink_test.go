package panellink

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentq/agentq/internal/sealed"
	"github.com/agentq/agentq/internal/tenants"
)

func fixedClock(t time.Time) func() time.Time { return func() time.Time { return t } }

func TestPanelTokenSignVerify(t *testing.T) {
	now := time.Date(2026, 11, 15, 12, 0, 0, 0, time.UTC)
	p, err := New([]byte("secret"), fixedClock(now))
	if err != nil {
		t.Fatal(err)
	}
	exp := now.Add(time.Hour)
	tok := p.Sign("acme", exp)
	id, gotExp, err := p.Verify(tok)
	if err != nil || id != "acme" || !gotExp.Equal(exp) {
		t.Fatalf("Verify = %q %v %v, want acme %v", id, gotExp, err, exp)
	}
	if other := p.Sign("other", exp); other == tok {
		t.Fatal("two tenants' tokens are equal")
	} else if id, _, _ := p.Verify(other); id != "other" {
		t.Fatalf("the other tenant's token verifies as %q", id)
	}

	// Every single-character change is refused as forged, never as another tenant.
	alphabet := "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_x."
	for i := range tok {
		for _, r := range alphabet {
			if byte(r) == tok[i] {
				continue
			}
			forged := tok[:i] + string(r) + tok[i+1:]
			if _, _, err := p.Verify(forged); !errors.Is(err, ErrInvalid) {
				t.Fatalf("token with char %d changed to %q: err %v, want ErrInvalid", i, r, err)
			}
		}
	}
	for _, bad := range []string{"", ".", "abc", tok + "x", tok[:len(tok)-1], strings.Repeat("a", 600)} {
		if _, _, err := p.Verify(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("Verify(%q) = %v, want ErrInvalid", bad, err)
		}
	}
	// Another secret's token is forged.
	q, _ := New([]byte("another secret"), fixedClock(now))
	if _, _, err := q.Verify(tok); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a token of another secret: %v", err)
	}
	// At and after its expiry it is expired, not forged.
	for _, at := range []time.Time{exp, exp.Add(time.Second)} {
		late, _ := New([]byte("secret"), fixedClock(at))
		if id, _, err := late.Verify(tok); !errors.Is(err, ErrExpired) || id != "acme" {
			t.Fatalf("at %v: %q %v, want ErrExpired", at, id, err)
		}
	}
}

func TestPanelSecretChoice(t *testing.T) {
	if s, eph := Secret("configured", "admin"); string(s) != "configured" || eph {
		t.Fatalf("configured secret: %q %v", s, eph)
	}
	a, eph := Secret("", "admin")
	if eph || len(a) == 0 || string(a) == "admin" {
		t.Fatalf("from the admin token: %q %v", a, eph)
	}
	r1, eph1 := Secret("", "")
	r2, _ := Secret("", "")
	if !eph1 || len(r1) != 32 || string(r1) == string(r2) {
		t.Fatalf("random secret: %x %x %v", r1, r2, eph1)
	}
	// Links signed under the admin token's key do not verify under the random one.
	pa, _ := New(a, nil)
	pr, _ := New(r1, nil)
	if _, _, err := pr.Verify(pa.Sign("t", time.Now().Add(time.Hour))); !errors.Is(err, ErrInvalid) {
		t.Fatalf("cross-key verify: %v", err)
	}
}

// A token says when it was issued; a token of the first format, which does not, counts
// as issued at the epoch, so any revocation of its tenant's links ends it.
func TestPanelTokenIssueTime(t *testing.T) {
	now := time.Date(2026, 11, 15, 12, 0, 0, 123_000_000, time.UTC)
	p, err := New([]byte("secret"), fixedClock(now))
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.Claims(p.Sign("acme", now.Add(time.Hour)))
	if err != nil || c.TenantID != "acme" || !c.Issued.Equal(now) || !c.Expires.Equal(now.Add(time.Hour).Truncate(time.Second)) {
		t.Fatalf("claims %+v %v, want acme issued %v", c, err, now)
	}
	v1 := sealed.Seal(p.key, panelPurpose, []byte("1|acme|"+strconv.FormatInt(now.Add(time.Hour).Unix(), 10)))
	c, err = p.Claims(v1)
	if err != nil || c.TenantID != "acme" || !c.Issued.Equal(time.UnixMilli(0)) {
		t.Fatalf("a first-format token: %+v %v", c, err)
	}
	revoked := now.Add(-time.Minute)
	for _, tc := range []struct {
		issued time.Time
		want   bool
	}{{time.UnixMilli(0), true}, {revoked.Add(-time.Millisecond), true}, {revoked, false}, {now, false}} {
		if got := tenants.PanelLinkRevoked(tenants.Tenant{PanelLinksValidAfter: &revoked}, tc.issued); got != tc.want {
			t.Errorf("a link issued at %v, links valid after %v: revoked %v, want %v", tc.issued, revoked, got, tc.want)
		}
	}
	if tenants.PanelLinkRevoked(tenants.Tenant{}, time.UnixMilli(0)) {
		t.Error("a tenant that never revoked a link has a revoked link")
	}
}
