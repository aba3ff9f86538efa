package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Scopes restrict what a key may do; empty lists mean "all".
type Scopes struct {
	Agents     []string `json:"agents,omitempty"`
	Principals []string `json:"principals,omitempty"`
}

// APIKey is a key's stored record: never the secret, only its hash.
type APIKey struct {
	Kid        string     `json:"kid"`
	TenantID   string     `json:"tenant_id"`
	SecretHash []byte     `json:"-"`
	Scopes     Scopes     `json:"scopes"`
	CreatedAt  time.Time  `json:"created_at"`
	RotatedAt  *time.Time `json:"rotated_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
}

const keyCols = `kid, tenant_id, secret_hash, scopes, created_at, rotated_at, revoked_at`

func scanKey(row pgx.Row) (APIKey, error) {
	var k APIKey
	var sc []byte
	if err := row.Scan(&k.Kid, &k.TenantID, &k.SecretHash, &sc, &k.CreatedAt, &k.RotatedAt, &k.RevokedAt); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return k, ErrNotFound
		}
		return k, err
	}
	if err := json.Unmarshal(sc, &k.Scopes); err != nil {
		return k, fmt.Errorf("store: key %s scopes: %w", k.Kid, err)
	}
	return k, nil
}

// CreateKeyParams are the fields of a new API key.
type CreateKeyParams struct {
	Kid        string
	TenantID   string
	SecretHash []byte
	Scopes     Scopes
}

// CreateKey inserts a key; ErrNotFound if the tenant does not exist.
func (s *Store) CreateKey(ctx context.Context, p CreateKeyParams) (APIKey, error) {
	sc, err := json.Marshal(p.Scopes)
	if err != nil {
		return APIKey{}, err
	}
	k, err := scanKey(s.pool.QueryRow(ctx,
		`INSERT INTO api_keys (kid, tenant_id, secret_hash, scopes) VALUES ($1, $2, $3, $4) RETURNING `+keyCols,
		p.Kid, p.TenantID, p.SecretHash, sc))
	switch {
	case isForeignKeyViolation(err):
		return k, fmt.Errorf("tenant %q: %w", p.TenantID, ErrNotFound)
	case isUniqueViolation(err):
		return k, fmt.Errorf("key %q: %w", p.Kid, ErrConflict)
	}
	return k, err
}

// GetKey returns a key by kid, revoked or not.
func (s *Store) GetKey(ctx context.Context, kid string) (APIKey, error) {
	return scanKey(s.pool.QueryRow(ctx, `SELECT `+keyCols+` FROM api_keys WHERE kid = $1`, kid))
}

// ListKeys returns a tenant's keys.
func (s *Store) ListKeys(ctx context.Context, tenantID string) ([]APIKey, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+keyCols+` FROM api_keys WHERE tenant_id = $1 ORDER BY created_at`, tenantID)
	return collect(rows, err, scanKey)
}

// RotateKeyParams replace a live key's secret.
type RotateKeyParams struct {
	Kid        string
	SecretHash []byte
}

// RotateKey stores a new secret hash for a key that is not revoked.
func (s *Store) RotateKey(ctx context.Context, p RotateKeyParams) (APIKey, error) {
	return scanKey(s.pool.QueryRow(ctx,
		`UPDATE api_keys SET secret_hash = $2, rotated_at = now() WHERE kid = $1 AND revoked_at IS NULL RETURNING `+keyCols,
		p.Kid, p.SecretHash))
}

// RevokeKey marks a live key revoked; ErrNotFound if there is no live key by that kid.
func (s *Store) RevokeKey(ctx context.Context, kid string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE kid = $1 AND revoked_at IS NULL`, kid)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}
