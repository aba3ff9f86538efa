package web

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strings"
)

// A sealed token is base64url(payload) "." base64url(HMAC-SHA256(key, purpose NUL
// payload)): the tenant panel's links and the operator view's sessions. The purpose
// keeps a token made for one use from passing as another under the same key. Both
// parts use the unpadded URL alphabet, decoded strictly (nonzero trailing bits are
// refused), so a changed character always changes what is checked.

var b64 = base64.RawURLEncoding.Strict()

// macOf is HMAC-SHA256(key, purpose NUL payload).
func macOf(key []byte, purpose string, payload []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(purpose))
	m.Write([]byte{0})
	m.Write(payload)
	return m.Sum(nil)
}

// seal signs payload for purpose.
func seal(key []byte, purpose string, payload []byte) string {
	return b64.EncodeToString(payload) + "." + b64.EncodeToString(macOf(key, purpose, payload))
}

// unseal returns the payload of a token sealed for purpose with key, or false for
// one that is longer than maxLen, malformed or not signed so.
func unseal(key []byte, purpose, token string, maxLen int) ([]byte, bool) {
	if len(key) == 0 || len(token) > maxLen {
		return nil, false
	}
	enc, sig, ok := strings.Cut(token, ".")
	if !ok {
		return nil, false
	}
	payload, err1 := b64.DecodeString(enc)
	got, err2 := b64.DecodeString(sig)
	if err1 != nil || err2 != nil || !hmac.Equal(got, macOf(key, purpose, payload)) {
		return nil, false
	}
	return payload, true
}
