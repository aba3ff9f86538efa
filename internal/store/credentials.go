package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agentq/agentq/agentqtype"
)

// Admin credentials are the deployment's own configuration: no tenant's data.

// AdminCredential is a stored admin credential: never its token, only its hash.
type AdminCredential struct {
	Name      string
	Role      agentqtype.Role
	TokenHash []byte
	CreatedAt time.Time
	RotatedAt *time.Time
	RevokedAt *time.Time
}

const credentialCols = `name, role, token_hash, created_at, rotated_at, revoked_at`

func scanCredential(row pgx.Row) (AdminCredential, error) {
	var c AdminCredential
	err := row.Scan(&c.Name, &c.Role, &c.TokenHash, &c.CreatedAt, &c.RotatedAt, &c.RevokedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, agentqtype.ErrNotFound
	}
	return c, err
}

// CreateCredentialParams are a new credential's fields.
type CreateCredentialParams struct {
	Name      string
	Role      agentqtype.Role
	TokenHash []byte
}

// CreateCredential inserts a credential; ErrConflict when the name was ever taken.
func (s *Store) CreateCredential(ctx context.Context, p CreateCredentialParams) (AdminCredential, error) {
	c, err := scanCredential(s.db.QueryRow(ctx,
		`INSERT INTO admin_credentials (name, role, token_hash) VALUES ($1, $2, $3) RETURNING `+credentialCols,
		p.Name, p.Role, p.TokenHash))
	if isUniqueViolation(err) {
		return c, fmt.Errorf("credential %q: %w", p.Name, ErrConflict)
	}
	return c, err
}

// GetCredentialParams name a credential.
type GetCredentialParams struct {
	Name string
}

// GetCredential returns a credential by name, revoked or not; agentqtype.ErrNotFound
// when there is none.
func (s *Store) GetCredential(ctx context.Context, p GetCredentialParams) (AdminCredential, error) {
	return scanCredential(s.db.QueryRow(ctx, `SELECT `+credentialCols+` FROM admin_credentials WHERE name = $1`, p.Name))
}

// CredentialByHashParams name a credential by its token's hash.
type CredentialByHashParams struct {
	TokenHash []byte
}

// CredentialByHash returns the credential whose token hashes to TokenHash, revoked or
// not; agentqtype.ErrNotFound when there is none.
func (s *Store) CredentialByHash(ctx context.Context, p CredentialByHashParams) (AdminCredential, error) {
	return scanCredential(s.db.QueryRow(ctx, `SELECT `+credentialCols+` FROM admin_credentials WHERE token_hash = $1`, p.TokenHash))
}

// ListCredentialsParams select the credentials to list: all of them, today.
type ListCredentialsParams struct{}

// ListCredentials returns every stored credential, revoked ones included, by name.
func (s *Store) ListCredentials(ctx context.Context, _ ListCredentialsParams) ([]AdminCredential, error) {
	rows, err := s.db.Query(ctx, `SELECT `+credentialCols+` FROM admin_credentials ORDER BY name`)
	return collect(rows, err, scanCredential)
}

// AnyLiveCredentialParams ask whether a live credential exists.
type AnyLiveCredentialParams struct{}

// AnyLiveCredential reports whether some stored credential is not revoked.
func (s *Store) AnyLiveCredential(ctx context.Context, _ AnyLiveCredentialParams) (bool, error) {
	var found bool
	err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM admin_credentials WHERE revoked_at IS NULL)`).Scan(&found)
	return found, err
}

// RotateCredentialParams replace a live credential's token.
type RotateCredentialParams struct {
	Name      string
	TokenHash []byte
}

// RotateCredential stores a new token hash for a live credential;
// agentqtype.ErrNotFound when it has no live credential by that name.
func (s *Store) RotateCredential(ctx context.Context, p RotateCredentialParams) (AdminCredential, error) {
	return scanCredential(s.db.QueryRow(ctx, `
		UPDATE admin_credentials SET token_hash = $2, rotated_at = now()
		WHERE name = $1 AND revoked_at IS NULL RETURNING `+credentialCols, p.Name, p.TokenHash))
}

// RevokeCredentialParams name a credential to revoke.
type RevokeCredentialParams struct {
	Name string
}

// RevokeCredential marks a live credential revoked and returns it;
// agentqtype.ErrNotFound when it has no live credential by that name.
func (s *Store) RevokeCredential(ctx context.Context, p RevokeCredentialParams) (AdminCredential, error) {
	return scanCredential(s.db.QueryRow(ctx, `
		UPDATE admin_credentials SET revoked_at = now()
		WHERE name = $1 AND revoked_at IS NULL RETURNING `+credentialCols, p.Name))
}
