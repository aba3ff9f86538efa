package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/agentq/agentq/internal/apikey"
	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/pg"
	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/migrations"
	"github.com/agentq/agentq/quotas"
)

func connectPG(ctx context.Context, url string) (*pgxpool.Pool, error) {
	return pg.Connect(ctx, url, "")
}

func migrationsUp(ctx context.Context, pool *pgxpool.Pool) ([]int64, error) {
	return migrations.Up(ctx, pool)
}

// adminCmd manages tenants and keys directly in Postgres (no server needed). Running
// servers see changes within a second (their caches live at most that long).
func adminCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "admin", Short: "Manage tenants and API keys in Postgres"}
	withStore := func(ctx context.Context, f func(*store.Store, *quotas.Catalogue) error) error {
		cfg, err := config.FromEnv()
		if err != nil {
			return err
		}
		plans, err := quotas.LoadCatalogue(cfg.PlansFile)
		if err != nil {
			return err
		}
		pool, err := connectPG(ctx, cfg.DatabaseURL)
		if err != nil {
			return err
		}
		defer pool.Close()
		if _, err := migrationsUp(ctx, pool); err != nil {
			return err
		}
		return f(store.New(pool), plans)
	}
	printJSON := func(v any) error {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}

	var id, name, plan, overrides, agents, principals string
	var weight int
	tenantCreate := &cobra.Command{
		Use:   "tenant-create",
		Short: "Create a tenant",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withStore(cmd.Context(), func(st *store.Store, plans *quotas.Catalogue) error {
				if _, ok := plans.Plan(plan); !ok {
					return fmt.Errorf("unknown plan %q (plans: %s)", plan, strings.Join(plans.Names(), ", "))
				}
				var ov map[string]quotas.Limit
				if overrides != "" {
					if err := json.Unmarshal([]byte(overrides), &ov); err != nil {
						return fmt.Errorf("--overrides: %w", err)
					}
					if err := quotas.ValidateOverrides(ov); err != nil {
						return fmt.Errorf("--overrides: %w", err)
					}
				}
				p := store.CreateTenantParams{ID: id, Name: name, Plan: plan, Overrides: ov}
				if p.Name == "" {
					p.Name = id
				}
				if weight > 0 {
					p.Weight = &weight
				}
				t, err := st.CreateTenant(cmd.Context(), p)
				if err != nil {
					return err
				}
				return printJSON(t)
			})
		},
	}
	tenantCreate.Flags().StringVar(&id, "id", "", "tenant id (required)")
	tenantCreate.Flags().StringVar(&name, "name", "", "display name (default: the id)")
	tenantCreate.Flags().StringVar(&plan, "plan", "free", "plan name")
	tenantCreate.Flags().IntVar(&weight, "weight", 0, "fair-share weight (default: the plan's)")
	tenantCreate.Flags().StringVar(&overrides, "overrides", "", `limit overrides as JSON: a number is the limit (0 allows nothing), "unlimited" turns it off, e.g. {"tenant_rate":5,"usd_monthly":"unlimited"}`)
	_ = tenantCreate.MarkFlagRequired("id")

	tenantList := &cobra.Command{
		Use:   "tenant-list",
		Short: "List tenants",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withStore(cmd.Context(), func(st *store.Store, _ *quotas.Catalogue) error {
				ts, err := st.ListTenants(cmd.Context())
				if err != nil {
					return err
				}
				return printJSON(ts)
			})
		},
	}

	keyCreate := &cobra.Command{
		Use:   "key-create TENANT",
		Short: "Create an API key for a tenant; the plaintext is printed once",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withStore(cmd.Context(), func(st *store.Store, _ *quotas.Catalogue) error {
				kid, plaintext, hash := apikey.New(args[0])
				sc := store.Scopes{Agents: splitList(agents), Principals: splitList(principals)}
				if _, err := st.CreateKey(cmd.Context(), store.CreateKeyParams{Kid: kid, TenantID: args[0], SecretHash: hash, Scopes: sc}); err != nil {
					return err
				}
				return printJSON(map[string]string{"kid": kid, "key": plaintext})
			})
		},
	}
	keyCreate.Flags().StringVar(&agents, "agents", "", "comma-separated agents the key may run (default all)")
	keyCreate.Flags().StringVar(&principals, "principals", "", "comma-separated users the key may act for (default all)")

	keyRotate := &cobra.Command{
		Use:   "key-rotate KID",
		Short: "Give a key a new secret; the old one stops working",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withStore(cmd.Context(), func(st *store.Store, _ *quotas.Catalogue) error {
				plaintext, hash := apikey.NewSecret(args[0])
				if _, err := st.RotateKey(cmd.Context(), store.RotateKeyParams{Kid: args[0], SecretHash: hash}); err != nil {
					return err
				}
				return printJSON(map[string]string{"kid": args[0], "key": plaintext})
			})
		},
	}
	keyRevoke := &cobra.Command{
		Use:   "key-revoke KID",
		Short: "Revoke a key",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withStore(cmd.Context(), func(st *store.Store, _ *quotas.Catalogue) error {
				ctx := cmd.Context()
				k, err := st.GetKey(ctx, args[0])
				if err != nil {
					return err
				}
				if err := st.RevokeKey(ctx, args[0]); err != nil {
					return err
				}
				fmt.Println("revoked", args[0])
				// Tell running servers at once and drop the key's limit state, as the admin
				// API does; without Redis, servers still stop honouring it within a second.
				cfg, _ := config.FromEnv()
				rdb, err := redisx.Connect(ctx, cfg.RedisURL)
				if err != nil {
					fmt.Fprintln(os.Stderr, "note: Redis unreachable; the key's limit state expires on its own:", err)
					return nil
				}
				defer rdb.Close()
				keys := rkeys.New(cfg.RedisPrefix, cfg.Shards)
				_ = rdb.Publish(ctx, keys.KeysChangedChannel(), "k:"+args[0]).Err()
				return quotas.New(rdb, keys, nil).DropKey(ctx, k.TenantID, args[0])
			})
		},
	}
	cmd.AddCommand(tenantCreate, tenantList, keyCreate, keyRotate, keyRevoke)
	return cmd
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
