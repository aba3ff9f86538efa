// Package migrations holds agentq's Postgres schema as embedded, versioned SQL files,
// applied by goose. Up is idempotent: serve and migrate both call it on start.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"hash/fnv"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// FS returns the embedded migration files.
func FS() fs.FS { return files }

// Up applies every pending migration to the database (and search_path) of pool.
// It returns the versions it applied.
func Up(ctx context.Context, pool *pgxpool.Pool) ([]int64, error) {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return up(ctx, db)
}

// Pending reports whether the database of pool lacks a migration this build
// embeds (GET /readyz: a replica of a newer build waits for its schema).
func Pending(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, files)
	if err != nil {
		return false, fmt.Errorf("migrations: %w", err)
	}
	pending, err := p.HasPending(ctx)
	if err != nil {
		return false, fmt.Errorf("migrations: %w", err)
	}
	return pending, nil
}

func up(ctx context.Context, db *sql.DB) ([]int64, error) {
	// The session lock lets several replicas start at once: one migrates, the others
	// wait. The lock id is per schema, so deployments (and tests) in other schemas of
	// the same database never wait on each other.
	var schema string
	if err := db.QueryRowContext(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	h := fnv.New64a()
	h.Write([]byte("agentq-migrate:" + schema))
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(int64(h.Sum64()>>1)), lock.WithLockTimeout(1, 300))
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files, goose.WithSessionLocker(locker))
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	res, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: apply: %w", err)
	}
	applied := make([]int64, 0, len(res))
	for _, r := range res {
		applied = append(applied, r.Source.Version)
	}
	return applied, nil
}
