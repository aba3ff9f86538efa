package operator

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/internal/credentials"
	"github.com/agentq/agentq/internal/sealed"
)

// maxSessionCookie bounds a session cookie: a longer one is none.
const maxSessionCookie = 512

// operatorAuth makes and checks the view's sessions.
//
// A session names the credential it was signed in with and is signed with that
// credential's session key (credentials.Credential.SessionKey, derived from its token,
// or from the stored hash of a stored one): base64url(name) "." sealed(expiry ‖ 16
// random bytes ‖ name). Each request looks the credential up by name (cached for at
// most a second), so revoking it ends its sessions, and rotating it changes the key,
// which ends them too. The role shown and enforced is the credential's as it is now.
type operatorAuth struct {
	now func() time.Time
}

// session is a live session: its credential, id and key.
type session struct {
	cred credentials.Credential
	id   []byte
	key  []byte
}

// newSession returns the cookie value of a new session of cred.
func (a *operatorAuth) newSession(cred credentials.Credential) (string, error) {
	payload := make([]byte, 8+16, 8+16+len(cred.Name))
	binary.BigEndian.PutUint64(payload, uint64(a.now().Add(operatorSessionTTL).Unix()))
	if _, err := rand.Read(payload[8:]); err != nil {
		return "", err
	}
	payload = append(payload, cred.Name...)
	return sealed.B64.EncodeToString([]byte(cred.Name)) + "." + sealed.Seal(cred.SessionKey(), "session", payload), nil
}

// session is the request's live session, or nil: no cookie, a forged or expired one,
// or one whose credential was revoked or rotated since. An error is a failed lookup.
func (s *View) session(c echo.Context) (*session, error) {
	v := cookieValue(c, operatorSessionName)
	enc, rest, ok := strings.Cut(v, ".")
	if !ok || len(v) > maxSessionCookie {
		return nil, nil
	}
	name, err := sealed.B64.DecodeString(enc)
	if err != nil {
		return nil, nil
	}
	cred, ok, err := s.AdminAuth.Lookup(c.Request().Context(), string(name))
	if err != nil || !ok {
		return nil, err
	}
	key := cred.SessionKey()
	payload, ok := sealed.Unseal(key, "session", rest, maxSessionCookie)
	if !ok || len(payload) != 24+len(name) || string(payload[24:]) != string(name) {
		return nil, nil
	}
	if int64(binary.BigEndian.Uint64(payload)) <= s.opAuth.now().Unix() {
		return nil, nil
	}
	return &session{cred: cred, id: payload[8:24], key: key}, nil
}

// csrf is the session's CSRF token.
func (ss *session) csrf() string {
	return sealed.B64.EncodeToString(sealed.MAC(ss.key, "csrf", ss.id))
}

// csrfOK compares a form's CSRF token with the session's in constant time.
func (ss *session) csrfOK(got string) bool {
	return subtle.ConstantTimeCompare([]byte(ss.csrf()), []byte(got)) == 1
}
