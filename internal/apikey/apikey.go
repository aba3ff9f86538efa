// Package apikey makes, parses and verifies agentq API keys, `aq_<kid>_<secret>`, and
// caches verified key records in process.
//
// The secret is 32 random bytes (64 hex characters). Because it carries 256 bits of
// entropy, a single SHA-256 is the right hash (as for GitHub tokens): a slow password
// hash would add nothing but latency. Only the hash is stored; comparison is
// constant-time.
package apikey

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"regexp"
	"strings"
)

// ErrMalformed is returned for a string that is not an agentq API key.
var ErrMalformed = errors.New("apikey: malformed API key")

const secretBytes = 32

var kidRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,80}$`)

// New returns a fresh key for tenant: its public kid, the plaintext key (shown once),
// and the hash to store.
func New(tenantID string) (kid, plaintext string, hash []byte) {
	kid = newKid(tenantID)
	plaintext, hash = NewSecret(kid)
	return kid, plaintext, hash
}

// NewSecret makes a new secret for an existing kid (rotation).
func NewSecret(kid string) (plaintext string, hash []byte) {
	secret := randomHex(secretBytes)
	return "aq_" + kid + "_" + secret, Hash(secret)
}

// newKid is "<tenant, lowercased, safe characters only>-<8 hex>".
func newKid(tenantID string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(tenantID) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
		if b.Len() >= 40 {
			break
		}
	}
	prefix := strings.Trim(b.String(), "-")
	if prefix == "" {
		prefix = "key"
	}
	return prefix + "-" + randomHex(4)
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("apikey: crypto/rand: " + err.Error()) // never happens on supported platforms
	}
	return hex.EncodeToString(b)
}

// Parse splits a plaintext key into kid and secret. It checks the shape only.
func Parse(plaintext string) (kid, secret string, err error) {
	rest, ok := strings.CutPrefix(plaintext, "aq_")
	if !ok {
		return "", "", ErrMalformed
	}
	i := strings.LastIndexByte(rest, '_')
	if i <= 0 {
		return "", "", ErrMalformed
	}
	kid, secret = rest[:i], rest[i+1:]
	if !kidRE.MatchString(kid) || len(secret) != 2*secretBytes {
		return "", "", ErrMalformed
	}
	if _, err := hex.DecodeString(secret); err != nil {
		return "", "", ErrMalformed
	}
	return kid, secret, nil
}

// ValidKid reports whether s has the shape of a kid.
func ValidKid(s string) bool { return kidRE.MatchString(s) }

// Hash is the stored form of a secret.
func Hash(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// Verify compares a presented secret with a stored hash in constant time.
func Verify(storedHash []byte, secret string) bool {
	return subtle.ConstantTimeCompare(storedHash, Hash(secret)) == 1
}
