package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/internal/netguard"
	"github.com/agentq/agentq/internal/redisx"
)

const devAdminToken = "dev-admin-token"

var demoTenants = []struct{ id, plan string }{
	{"demo-free", "free"}, {"demo-pro", "pro"}, {"demo-enterprise", "enterprise"},
}

func devCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "dev",
		Short: "Run everything in one process with demo tenants (embedded Redis if none is running)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			log := newLogger(true)
			cfg, err := agentq.ConfigFromEnv()
			if err != nil {
				return err
			}
			if cfg.AdminToken == "" {
				cfg.AdminToken = devAdminToken
			}
			// Local development: webhook receivers on this machine are reachable.
			cfg.WebhookAllowNets = append(cfg.WebhookAllowNets, netguard.Loopback()...)
			if os.Getenv("DATABASE_URL") == "" {
				if err := ensureDatabase(ctx, cfg.DatabaseURL); err != nil {
					return err
				}
			}
			pool, err := connectPG(ctx, cfg.DatabaseURL)
			if err != nil {
				return fmt.Errorf("%w\n\nagentq dev needs PostgreSQL (it keeps tasks, keys and usage there). Either:\n"+
					"  - start one locally:   docker compose up -d postgres   (or: sudo apt-get install postgresql)\n"+
					"  - or point at yours:   DATABASE_URL=postgres://user:pass@host:5432/db go run ./cmd/agentq dev", err)
			}
			defer pool.Close()

			opts := agentq.Options{Config: cfg, Logger: log, Pool: pool}
			if os.Getenv("REDIS_URL") == "" {
				if c, err := redisx.Connect(ctx, cfg.RedisURL); err == nil {
					opts.Redis = c
					defer c.Close()
				} else {
					mr := miniredis.NewMiniRedis()
					if err := mr.Start(); err != nil {
						return fmt.Errorf("no Redis at %s and the embedded one failed: %w", cfg.RedisURL, err)
					}
					defer mr.Close()
					fmt.Fprintf(os.Stderr, "No Redis at %s: using an embedded in-memory Redis (miniredis) at %s.\n"+
						"Its data is lost on exit. Set REDIS_URL to use a real Redis.\n", cfg.RedisURL, mr.Addr())
					c, err := redisx.Connect(ctx, "redis://"+mr.Addr())
					if err != nil {
						return err
					}
					defer c.Close()
					opts.Redis = c
				}
			}
			return run(ctx, opts, func(app *agentq.App) error {
				return printDemo(ctx, app, cfg)
			})
		},
	}
}

// ensureDatabase creates the database named in url if it does not exist yet.
func ensureDatabase(ctx context.Context, dbURL string) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err == nil {
		return conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name
		return nil // let the real connect report it
	}
	u, perr := url.Parse(dbURL)
	if perr != nil {
		return nil
	}
	name := strings.TrimPrefix(u.Path, "/")
	u.Path = "/postgres"
	admin, err := pgx.Connect(ctx, u.String())
	if err != nil {
		return nil
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("creating database %s: %w", name, err)
	}
	fmt.Fprintf(os.Stderr, "Created database %s.\n", name)
	return nil
}

func printDemo(ctx context.Context, app *agentq.App, cfg agentq.Config) error {
	base := "http://" + app.Addr().String()
	var b strings.Builder
	fmt.Fprintf(&b, "\nagentq dev is running at %s (admin token: %s)\n\nDemo tenants and fresh API keys:\n", base, cfg.AdminToken)
	var firstKey string
	for _, d := range demoTenants {
		if _, err := app.GetTenant(ctx, d.id); errors.Is(err, agentq.ErrNotFound) {
			if _, err := app.CreateTenant(ctx, agentq.NewTenant{ID: d.id, Plan: d.plan}); err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
		k, err := app.CreateAPIKey(ctx, agentq.NewAPIKey{TenantID: d.id})
		if err != nil {
			return err
		}
		if firstKey == "" {
			firstKey = k.Token
		}
		fmt.Fprintf(&b, "  %-16s plan %-10s key %s\n", d.id, d.plan, k.Token)
	}
	fmt.Fprintf(&b, `
Try it:
  export KEY=%s
  curl -s -X POST %s/v1/tasks -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
       -d '{"agent":"sim","input":{"steps":3,"step_ms":200,"tokens_per_step":100}}'
  curl -s %s/v1/tasks -H "Authorization: Bearer $KEY"
  curl -s %s/v1/admin/tenants -H "Authorization: Bearer %s"
  curl -s %s/openapi.json

Press Ctrl-C to stop.
`, firstKey, base, base, base, cfg.AdminToken, base)
	fmt.Print(b.String())
	return nil
}
