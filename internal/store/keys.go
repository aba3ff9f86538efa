package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agentq/agentq/agentqtype"
)

// Scopes restrict what a key may do; empty lists mean "all". The JSON tags are the
// stored column's format (scopes is a jsonb column), not an API shape.
type Scopes struct {
	Agents     []string `json:"agents,omitempty"`
	Principals []string `json:"principals,omitempty"`
}

// APIKey is a key's stored record: never the secret, only its hash.
type APIKey struct {
	Kid        string
	TenantID   string
	SecretHash []byte
	Scopes     Scopes
	CreatedAt  time.Time
	RotatedAt  *time.Time
	RevokedAt  *time.Time
}

const keyCols = `kid, tenant_id, secret_hash, scopes, created_at, rotated_at, revoked_at`

func scanKey(row pgx.Row) (APIKey, error) {
	var k APIKey
	var sc []byte
	if err := row.Scan(&k.Kid, &k.TenantID, &k.SecretHash, &sc, &k.CreatedAt, &k.RotatedAt, &k.RevokedAt); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return k, agentqtype.ErrNotFound
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

// CreateKey inserts a key; agentqtype.ErrNotFound if the tenant does not exist.
func (s *Store) CreateKey(ctx context.Context, p CreateKeyParams) (APIKey, error) {
	if p.TenantID == "" {
		return APIKey{}, ErrNoTenant
	}
	sc, err := json.Marshal(p.Scopes)
	if err != nil {
		return APIKey{}, err
	}
	k, err := scanKey(s.db.QueryRow(ctx,
		`INSERT INTO api_keys (kid, tenant_id, secret_hash, scopes) VALUES ($1, $2, $3, $4) RETURNING `+keyCols,
		p.Kid, p.TenantID, p.SecretHash, sc))
	switch {
	case isForeignKeyViolation(err):
		return k, fmt.Errorf("tenant %q: %w", p.TenantID, agentqtype.ErrNotFound)
	case isUniqueViolation(err):
		return k, fmt.Errorf("key %q: %w", p.Kid, ErrConflict)
	}
	return k, err
}

// UnscopedGetKey returns a key by kid, revoked or not, whatever its tenant:
// authentication finds the tenant through it.
func (s *Store) UnscopedGetKey(ctx context.Context, kid string) (APIKey, error) {
	return scanKey(s.db.QueryRow(ctx, `SELECT `+keyCols+` FROM api_keys WHERE kid = $1`, kid))
}

// ListKeysParams name the tenant whose keys to list.
type ListKeysParams struct {
	TenantID string
}

// ListKeys returns a tenant's keys, oldest first.
func (s *Store) ListKeys(ctx context.Context, p ListKeysParams) ([]APIKey, error) {
	if p.TenantID == "" {
		return nil, ErrNoTenant
	}
	rows, err := s.db.Query(ctx, `SELECT `+keyCols+` FROM api_keys WHERE tenant_id = $1 ORDER BY created_at`, p.TenantID)
	return collect(rows, err, scanKey)
}

// RotateKeyParams replace a live key's secret.
type RotateKeyParams struct {
	TenantID   string
	Kid        string
	SecretHash []byte
}

// RotateKey stores a new secret hash for one of the tenant's keys that is not
// revoked; agentqtype.ErrNotFound if it has no live key by that kid.
func (s *Store) RotateKey(ctx context.Context, p RotateKeyParams) (APIKey, error) {
	if p.TenantID == "" {
		return APIKey{}, ErrNoTenant
	}
	return scanKey(s.db.QueryRow(ctx, `
		UPDATE api_keys SET secret_hash = $3, rotated_at = now()
		WHERE kid = $1 AND tenant_id = $2 AND revoked_at IS NULL RETURNING `+keyCols,
		p.Kid, p.TenantID, p.SecretHash))
}

// RevokeKeyParams name a key to revoke.
type RevokeKeyParams struct {
	TenantID string
	Kid      string
}

// RevokeKey marks one of the tenant's live keys revoked; agentqtype.ErrNotFound if it
// has no live key by that kid.
func (s *Store) RevokeKey(ctx context.Context, p RevokeKeyParams) error {
	if p.TenantID == "" {
		return ErrNoTenant
	}
	tag, err := s.db.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE kid = $1 AND tenant_id = $2 AND revoked_at IS NULL`,
		p.Kid, p.TenantID)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return agentqtype.ErrNotFound
	}
	return nil
}
