// Package sealed signs small payloads into URL-safe tokens and checks them: the
// tenant panel's links, the operator view's sessions and the approval links of paused
// tasks.
package sealed

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"strings"
)

// A sealed token is base64url(payload) "." base64url(HMAC-SHA256(key, purpose NUL
// payload)): the tenant panel's links and the operator view's sessions. The purpose
// keeps a token made for one use from passing as another under the same key. Both
// parts use the unpadded URL alphabet, decoded strictly (nonzero trailing bits are
// refused), so a changed character always changes what is checked.

// B64 is the tokens' alphabet: unpadded base64url, decoded strictly.
var B64 = base64.RawURLEncoding.Strict()

// MAC is HMAC-SHA256(key, purpose NUL payload).
func MAC(key []byte, purpose string, payload []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(purpose))
	m.Write([]byte{0})
	m.Write(payload)
	return m.Sum(nil)
}

// Seal signs payload for purpose.
func Seal(key []byte, purpose string, payload []byte) string {
	return B64.EncodeToString(payload) + "." + B64.EncodeToString(MAC(key, purpose, payload))
}

// Unseal returns the payload of a token sealed for purpose with key, or false for
// one that is longer than maxLen, malformed or not signed so.
func Unseal(key []byte, purpose, token string, maxLen int) ([]byte, bool) {
	if len(key) == 0 || len(token) > maxLen {
		return nil, false
	}
	enc, sig, ok := strings.Cut(token, ".")
	if !ok {
		return nil, false
	}
	payload, err1 := B64.DecodeString(enc)
	got, err2 := B64.DecodeString(sig)
	if err1 != nil || err2 != nil || !hmac.Equal(got, MAC(key, purpose, payload)) {
		return nil, false
	}
	return payload, true
}

// Secret picks the secret the panel links' and the approval links' keys are derived
// from: the configured one, else the admin token, else random bytes (ephemeral: links
// end with the process).
func Secret(configured, adminToken string) (secret []byte, ephemeral bool) {
	switch {
	case configured != "":
		return []byte(configured), false
	case adminToken != "":
		return []byte("admin-token|" + adminToken), false
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return b, true
}
