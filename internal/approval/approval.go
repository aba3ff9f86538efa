// Package approval makes and checks the approval links of paused tasks. A task that
// its plan pauses at a limit gets, in the pause's usage.limit_hit event, a signed,
// expiring link: whoever holds it sees the task's usage so far and may approve a
// raise of its budget within the plan's ceiling, which resumes it. The link is
// signed, not stored: it names the tenant, the task and the pause it was made for
// (a task paused again needs a new approval) and expires when the pause times out.
//
// Token: payload "1|<tenant id>|<task id>|<pause>|<expiry, unix seconds>", sealed
// (package sealed) for the purpose "agentq-approval-link" with a key derived by
// HKDF-SHA256 from the same secret as the panel links (AGENTQ_PANEL_SECRET, else the
// admin token), under its own info string: every process that pauses tasks or serves
// the links must share that secret.
package approval

import (
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/internal/sealed"
)

// Errors of an approval token: forged or malformed, and expired.
var (
	ErrInvalid = errors.New("approval: link is not valid")
	ErrExpired = errors.New("approval: link has expired")
)

const (
	version = "1"
	purpose = "agentq-approval-link"
	keyInfo = "agentq approval links v1"
	// maxToken bounds a token read: a tenant id, a UUID, two numbers and a MAC.
	maxToken = 512
	// Path is where the API serves the links.
	Path = "/approve"
)

// Claims are what a genuine approval token says.
type Claims struct {
	TenantID string
	TaskID   uuid.UUID
	Pause    int // the task's pause count when the link was made
	Expires  time.Time
}

// Signer signs and checks approval tokens and builds the links.
type Signer struct {
	key  []byte
	base func() string // the public base URL the links start with
	now  func() time.Time
}

// NewSigner derives the key from secret; base gives the API's public base URL
// (scheme://host[:port]), asked at each link (an API on port 0 knows its port only
// once it listens); now is the clock (time.Now when nil).
func NewSigner(secret []byte, base func() string, now func() time.Time) (*Signer, error) {
	if len(secret) == 0 {
		return nil, errors.New("approval: empty secret")
	}
	key, err := hkdf.Key(sha256.New, secret, nil, keyInfo, 32)
	if err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	if base == nil {
		base = func() string { return "" }
	}
	return &Signer{key: key, base: base, now: now}, nil
}

// Sign returns a token for c.
func (s *Signer) Sign(c Claims) string {
	payload := version + "|" + c.TenantID + "|" + c.TaskID.String() + "|" + strconv.Itoa(c.Pause) + "|" +
		strconv.FormatInt(c.Expires.Unix(), 10)
	return sealed.Seal(s.key, purpose, []byte(payload))
}

// Link is the approval link of c: the public base URL, Path and the token.
func (s *Signer) Link(c Claims) string {
	return strings.TrimRight(s.base(), "/") + Path + "?token=" + url.QueryEscape(s.Sign(c))
}

// Verify returns what a token says. A token that does not parse or whose signature
// does not match is ErrInvalid; a genuine one past its expiry is ErrExpired, with its
// claims.
func (s *Signer) Verify(token string) (Claims, error) {
	payload, ok := sealed.Unseal(s.key, purpose, token, maxToken)
	if !ok {
		return Claims{}, ErrInvalid
	}
	parts := strings.Split(string(payload), "|")
	if len(parts) != 5 || parts[0] != version || parts[1] == "" {
		return Claims{}, ErrInvalid
	}
	id, err1 := uuid.Parse(parts[2])
	pause, err2 := strconv.Atoi(parts[3])
	exp, err3 := strconv.ParseInt(parts[4], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || pause < 1 {
		return Claims{}, ErrInvalid
	}
	c := Claims{TenantID: parts[1], TaskID: id, Pause: pause, Expires: time.Unix(exp, 0).UTC()}
	if !s.now().Before(c.Expires) {
		return c, ErrExpired
	}
	return c, nil
}
