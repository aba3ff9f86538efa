// Package pg opens agentq's Postgres pool.
package pg

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// genericPlans is the plan_cache_mode agentq's connections ask for unless the URL
// names one. The hot statements take their rows as arrays (a batch of starts, of
// ends, of rollups); for those Postgres preferred a custom plan on every call, since
// it knows the arrays' lengths then: the rollups' upsert spent longer planned than
// running, and the start's UPDATE was planned on most calls. Their generic plans
// look rows up by key just the same, though the rollups' runs slower: a small gain
// (docs/benchmarks.md has the figures and the pairs).
const genericPlans = "force_generic_plan"

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
	if _, set := cfg.ConnConfig.RuntimeParams["plan_cache_mode"]; !set {
		cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = genericPlans
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
