// Package pg opens agentq's Postgres pool.
package pg

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Connect opens a pool on url and checks that Postgres answers. searchPath, when not
// empty, pins the schema (tests give each test its own). Each tune function may
// change the pool's configuration before it opens (the query tracer, say).
func Connect(ctx context.Context, url, searchPath string, tune ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL is not a valid Postgres URL: %w", err)
	}
	if searchPath != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = searchPath
		cfg.ConnConfig.RuntimeParams["application_name"] = "agentq:" + searchPath
	} else if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "agentq"
	}
	if !strings.Contains(url, "pool_max_conns") { // the URL's size, when it names one, stands
		cfg.MaxConns = max(cfg.MaxConns, 16)
	}
	for _, f := range tune {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres at %s:%d is not reachable: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool, nil
}
