package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/agentq/agentq/agentqtype"
)

// AdvertiseAPIAddress records url as an address the API is reached at, seen now.
func (s *Store) AdvertiseAPIAddress(ctx context.Context, url string) error {
	_, err := s.db.Exec(ctx, `
		INSERT INTO api_addresses (url) VALUES ($1)
		ON CONFLICT (url) DO UPDATE SET seen_at = now()`, url)
	return err
}

// NewestAPIAddress returns the address an API process advertised last;
// agentqtype.ErrNotFound when none ever did.
func (s *Store) NewestAPIAddress(ctx context.Context) (string, error) {
	var url string
	err := s.db.QueryRow(ctx, `SELECT url FROM api_addresses ORDER BY seen_at DESC, url LIMIT 1`).Scan(&url)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", agentqtype.ErrNotFound
	}
	return url, err
}
