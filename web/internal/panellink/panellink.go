// Package panellink signs and verifies the tenant panel's links: the admin API issues
// them, the panel checks them.
package panellink

import (
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/agentq/agentq/internal/sealed"
)

// Tenant panel links: GET /panel/t?token=<token> shows one tenant's usage page to
// whoever holds the link (a SaaS embeds it in an iframe, or forwards it to its
// customer). The token is signed, not stored. An admin revokes a tenant's links with
// POST /v1/admin/tenants/{id}/panel-links/revoke: links issued before it are refused
// (the tenant's PanelLinksValidAfter); changing the panel secret ends every link.
//
// Token: payload "2|<tenant id>|<issued, unix ms>|<expiry, unix seconds>", sealed
// (package sealed) for the purpose "agentq-panel-link". Tokens of the first format,
// "1|<tenant id>|<expiry>", carry no issue time and count as issued at the epoch:
// any revocation of their tenant's links ends them. The key is derived with HKDF-
// SHA256 from AGENTQ_PANEL_SECRET, or else from the admin token, or else from random
// bytes drawn at start (links then die with the process).

// Link lifetimes: the default and the bound of POST .../panel-links ttl_s.
const (
	DefaultTTL = 24 * time.Hour
	MaxTTL     = 30 * 24 * time.Hour
)

// Errors of a link's token: forged (or malformed) is 401, expired 403.
var (
	ErrInvalid = errors.New("panellink: token is not valid")
	ErrExpired = errors.New("panellink: token has expired")
)

const (
	panelTokenVersion = "2"
	panelPurpose      = "agentq-panel-link"
	panelKeyInfo      = "agentq tenant panel links v1"
)

// Signer signs and verifies tenant panel tokens.
type Signer struct {
	key []byte
	now func() time.Time
}

// New derives the signing key from secret with HKDF-SHA256; now is the
// clock (time.Now when nil).
func New(secret []byte, now func() time.Time) (*Signer, error) {
	if len(secret) == 0 {
		return nil, errors.New("panellink: empty secret")
	}
	key, err := hkdf.Key(sha256.New, secret, nil, panelKeyInfo, 32)
	if err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	return &Signer{key: key, now: now}, nil
}

// Secret picks the secret link keys are derived from (sealed.Secret).
var Secret = sealed.Secret

// Now is the signer's clock: links expire by it.
func (p *Signer) Now() time.Time { return p.now() }

// Sign returns a token for tenantID valid until exp (whole seconds), issued now.
func (p *Signer) Sign(tenantID string, exp time.Time) string {
	payload := []byte(panelTokenVersion + "|" + tenantID + "|" + strconv.FormatInt(p.now().UnixMilli(), 10) +
		"|" + strconv.FormatInt(exp.Unix(), 10))
	return sealed.Seal(p.key, panelPurpose, payload)
}

// Claims are what a genuine panel token says.
type Claims struct {
	TenantID string
	Issued   time.Time // the epoch for tokens of the first format, which have none
	Expires  time.Time
}

// Verify returns the tenant a token is for and when it expires. A token that does not
// parse or whose signature does not match is ErrInvalid; a genuine one past
// its expiry is ErrExpired (with its tenant).
func (p *Signer) Verify(token string) (tenantID string, exp time.Time, err error) {
	c, err := p.Claims(token)
	return c.TenantID, c.Expires, err
}

// Claims is Verify with the token's issue time.
func (p *Signer) Claims(token string) (Claims, error) {
	payload, ok := sealed.Unseal(p.key, panelPurpose, token, 512)
	if !ok {
		return Claims{}, ErrInvalid
	}
	parts := strings.Split(string(payload), "|")
	var c Claims
	var expS string
	switch {
	case len(parts) == 3 && parts[0] == "1":
		c.Issued, expS = time.UnixMilli(0).UTC(), parts[2]
	case len(parts) == 4 && parts[0] == panelTokenVersion:
		ms, err := strconv.ParseInt(parts[2], 10, 64)
		if err != nil {
			return Claims{}, ErrInvalid
		}
		c.Issued, expS = time.UnixMilli(ms).UTC(), parts[3]
	default:
		return Claims{}, ErrInvalid
	}
	c.TenantID = parts[1]
	unix, err := strconv.ParseInt(expS, 10, 64)
	if err != nil || c.TenantID == "" {
		return Claims{}, ErrInvalid
	}
	c.Expires = time.Unix(unix, 0).UTC()
	if !p.now().Before(c.Expires) {
		return c, ErrExpired
	}
	return c, nil
}
