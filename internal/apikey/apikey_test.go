package apikey

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestNewParseVerify(t *testing.T) {
	kid, plaintext, hash := New("Acme_Corp")
	if !strings.HasPrefix(kid, "acme-corp-") {
		t.Fatalf("kid %q does not start with the sanitised tenant id", kid)
	}
	gotKid, secret, err := Parse(plaintext)
	if err != nil || gotKid != kid {
		t.Fatalf("Parse(%q) = %q, %v", plaintext, gotKid, err)
	}
	if strings.Contains(kid, secret) || strings.Contains(string(hash), secret) {
		t.Fatal("kid or hash contains the secret")
	}
	if !Verify(hash, secret) {
		t.Fatal("Verify rejects the right secret")
	}
	_, other := NewSecret(kid)
	if Verify(other, secret) {
		t.Fatal("Verify accepts the secret against another hash")
	}
}

func TestParseRejectsMalformed(t *testing.T) {
	_, good, _ := New("acme")
	cases := map[string]string{
		"empty":          "",
		"no prefix":      strings.TrimPrefix(good, "aq_"),
		"wrong prefix":   "ak_" + strings.TrimPrefix(good, "aq_"),
		"no secret":      "aq_acme-1234abcd_",
		"short secret":   good[:len(good)-2],
		"non-hex secret": good[:len(good)-1] + "z",
		"upper kid":      "aq_ACME-1234abcd_" + strings.Repeat("a", 64),
		"no kid":         "aq__" + strings.Repeat("a", 64),
	}
	for name, in := range cases {
		if _, _, err := Parse(in); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: Parse(%q) err = %v, want ErrMalformed", name, in, err)
		}
	}
}

func TestCacheAuthenticate(t *testing.T) {
	kid, plaintext, hash := New("acme")
	var loads atomic.Int32
	rec := Record{Kid: kid, TenantID: "acme", SecretHash: hash}
	c := NewCache(func(_ context.Context, k string) (Record, bool, error) {
		loads.Add(1)
		if k != kid {
			return Record{}, false, nil
		}
		return rec, true, nil
	}, 10, time.Hour)
	ctx := context.Background()
	for range 3 {
		got, err := c.Authenticate(ctx, plaintext)
		if err != nil || got.TenantID != "acme" {
			t.Fatalf("Authenticate = %+v, %v", got, err)
		}
	}
	if n := loads.Load(); n != 1 {
		t.Fatalf("loaded %d times, want 1 (cached)", n)
	}
	// wrong secret, unknown kid, malformed: all ErrInvalid, none says which
	_, wrong, _ := New("acme")
	wrong = "aq_" + kid + wrong[strings.LastIndexByte(wrong, '_'):]
	for _, k := range []string{wrong, "aq_nobody-00000000_" + strings.Repeat("0", 64), "garbage"} {
		if _, err := c.Authenticate(ctx, k); !errors.Is(err, ErrInvalid) {
			t.Errorf("Authenticate(bad) err = %v, want ErrInvalid", err)
		}
	}
	// revocation takes effect once the entry is invalidated
	rec.Revoked = true
	c.Invalidate(kid)
	if _, err := c.Authenticate(ctx, plaintext); !errors.Is(err, ErrInvalid) {
		t.Fatalf("revoked key authenticated: %v", err)
	}
}

func TestCacheBoundedAndExpires(t *testing.T) {
	var loads atomic.Int32
	c := NewCache(func(_ context.Context, k string) (Record, bool, error) {
		loads.Add(1)
		return Record{}, false, nil
	}, 5, 30*time.Millisecond)
	for range 50 {
		_, p, _ := New("x")
		_, _ = c.Authenticate(context.Background(), p)
	}
	if c.Len() > 5 {
		t.Fatalf("cache holds %d entries, cap 5", c.Len())
	}
	_, p, _ := New("y")
	_, _ = c.Authenticate(context.Background(), p)
	before := loads.Load()
	time.Sleep(80 * time.Millisecond)
	_, _ = c.Authenticate(context.Background(), p)
	if loads.Load() != before+1 {
		t.Fatal("an expired entry was not reloaded")
	}
}

func FuzzParse(f *testing.F) {
	_, good, _ := New("acme")
	for _, s := range []string{good, "", "aq_", "aq_a_b", "aq_x-1_" + strings.Repeat("f", 64)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		kid, secret, err := Parse(s)
		if err != nil {
			return
		}
		if "aq_"+kid+"_"+secret != s || !ValidKid(kid) || len(secret) != 64 {
			t.Fatalf("Parse(%q) = %q, %q: not a faithful split", s, kid, secret)
		}
	})
}
