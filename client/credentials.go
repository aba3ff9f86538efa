package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Admin credential roles, from the most to the least able: an admin may do
// everything; an operator changes tenants, their keys, pools, agents and webhooks; finance
// reads the events feed and the usage export besides; a viewer reads the rest.
const (
	RoleAdmin    = "admin"
	RoleOperator = "operator"
	RoleFinance  = "finance"
	RoleViewer   = "viewer"
)

// Credential is a named admin credential as the server lists it: never its token.
// Source is "bootstrap" (AGENTQ_ADMIN_TOKEN), "env" (AGENTQ_ADMIN_TOKENS) or
// "stored"; only stored ones can be rotated or revoked.
type Credential struct {
	Name      string     `json:"name"`
	Role      string     `json:"role"`
	Source    string     `json:"source"`
	CreatedAt *time.Time `json:"created_at"`
	RotatedAt *time.Time `json:"rotated_at"`
	RevokedAt *time.Time `json:"revoked_at"`
}

// CredentialCreated is a credential with its token, shown this once.
type CredentialCreated struct {
	Credential
	Token string `json:"token"`
}

func credentialPath(name string) string { return "/v1/admin/credentials/" + url.PathEscape(name) }

// CreateCredential creates a stored admin credential (201) and returns its token,
// which the server keeps only as a hash. The admin role only.
func (a *Admin) CreateCredential(ctx context.Context, name, role string) (*CredentialCreated, error) {
	body := struct {
		Name string `json:"name"`
		Role string `json:"role"`
	}{name, role}
	var c CredentialCreated
	if err := a.t.do(ctx, http.MethodPost, "/v1/admin/credentials", nil, nil, body, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// ListCredentials lists every admin credential, revoked ones included.
func (a *Admin) ListCredentials(ctx context.Context) ([]Credential, error) {
	var out struct {
		Credentials []Credential `json:"credentials"`
	}
	if err := a.t.do(ctx, http.MethodGet, "/v1/admin/credentials", nil, nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Credentials, nil
}

// RotateCredential gives a stored credential a new token (the old one stops working
// on every replica within a second) and returns it, shown this once.
func (a *Admin) RotateCredential(ctx context.Context, name string) (*CredentialCreated, error) {
	var c CredentialCreated
	if err := a.t.do(ctx, http.MethodPost, credentialPath(name)+"/rotate", nil, nil, nil, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// RevokeCredential revokes a stored credential (204): its token and its operator-view
// sessions stop working.
func (a *Admin) RevokeCredential(ctx context.Context, name string) error {
	return a.t.do(ctx, http.MethodDelete, credentialPath(name), nil, nil, nil, nil)
}
