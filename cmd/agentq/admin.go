package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/billing/usage"
	"github.com/agentq/agentq/billing/webhooks"
	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/credentials"
	"github.com/agentq/agentq/internal/keys"
	"github.com/agentq/agentq/internal/pg"
	"github.com/agentq/agentq/internal/pools"
	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/services"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/migrations"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
	"github.com/agentq/agentq/runtime"
	"github.com/agentq/agentq/web/api"
)

func connectPG(ctx context.Context, url string) (*pgxpool.Pool, error) {
	return pg.Connect(ctx, url, "")
}

func migrationsUp(ctx context.Context, pool *pgxpool.Pool) ([]int64, error) {
	return migrations.Up(ctx, pool)
}

// adminEnv is what the admin commands work on: the domain services the admin API
// uses, so the CLI refuses exactly what the API refuses.
type adminEnv struct {
	tenants  *tenants.Service
	apiKeys  *keys.Service
	events   *outbox.Feed
	webhooks *webhooks.Webhooks
	usage    *usage.Rollups
	pools    *pools.Service
	audit    *audit.Log
	// tasks is nil without Redis: a resume takes a session lease and queues the
	// task there.
	tasks *tasks.Service
	// credentials are the admin credentials: the environment's, listed, and the
	// stored ones, managed.
	credentials *credentials.Service
}

// adminServices builds the admin commands' services. With Redis, a changed key or
// tenant reaches running servers at once and a revoked key's limit state is dropped,
// as through the admin API; without it (rdb nil), servers see changes within a second
// and the limit state expires on its own.
func adminServices(pool *pgxpool.Pool, plans *quotas.Catalogue, rdb redis.UniversalClient, rk rkeys.Keys,
	allowNets []netip.Prefix, admins envAdmins) adminEnv {
	// The command's own logger, as set up by main, gets the services' warnings; the
	// runtime's registry names the built-in agent, which a pool may be bound to.
	arch := &baseservice.Archetype{Logger: slog.Default()}
	var guard *admission.Guard
	if rdb != nil {
		guard = admission.NewGuard(admission.New(rdb, rk, nil, admission.Options{}), admission.GuardOptions{Timeout: 2 * time.Second, Archetype: arch})
	}
	svc := services.New(services.Deps{Pool: pool, Plans: plans, Redis: rdb, Keys: rk, Agents: runtime.NewRegistry(),
		Admission: guard, Webhooks: webhooks.WebhooksOptions{AllowNets: allowNets}, Archetype: arch,
		AdminToken: admins.token, AdminTokens: admins.tokens})
	return adminEnv{tenants: svc.Tenants, apiKeys: svc.Keys, events: svc.Events, webhooks: svc.Webhooks, usage: svc.Usage,
		pools: svc.Pools, tasks: svc.Tasks, credentials: svc.Credentials, audit: svc.Audit}
}

// envAdmins are the admin credentials the environment defines: the CLI lists them,
// and refuses to create, rotate or revoke them.
type envAdmins struct {
	token  string
	tokens []config.AdminCredential
}

// adminOpener connects the admin commands to a deployment; withRedis asks for Redis
// too (best effort: running servers are told of changes through it). close releases
// what open took.
type adminOpener func(ctx context.Context, withRedis bool) (env adminEnv, close func(), err error)

// openAdminEnv connects to the deployment the environment names, as `agentq serve`
// does: the same plan catalogue with the same global limits, so the tenant rules are
// the server's.
func openAdminEnv(ctx context.Context, withRedis bool) (adminEnv, func(), error) {
	cfg, err := config.FromEnv()
	if err != nil {
		return adminEnv{}, nil, err
	}
	plans, err := tenants.LoadCatalogue(cfg)
	if err != nil {
		return adminEnv{}, nil, err
	}
	pool, err := connectPG(ctx, cfg.DatabaseURL)
	if err != nil {
		return adminEnv{}, nil, err
	}
	if _, err := migrationsUp(ctx, pool); err != nil {
		pool.Close()
		return adminEnv{}, nil, err
	}
	closeAll := pool.Close
	var rdb redis.UniversalClient
	if withRedis {
		if c, err := redisx.Open(ctx, cfg.RedisURL, cfg.RedisClusterAddrs); err != nil {
			fmt.Fprintln(os.Stderr, "note: Redis unreachable; running servers catch up on their own:", err)
		} else {
			rdb = c
			closeAll = func() { _ = c.Close(); pool.Close() }
		}
	}
	return adminServices(pool, plans, rdb, rkeys.New(cfg.RedisPrefix, cfg.Shards), cfg.WebhookAllowNets,
		envAdmins{token: cfg.AdminToken, tokens: cfg.AdminTokens}), closeAll, nil
}

// adminCmd manages tenants and keys directly in Postgres (no server needed). Running
// servers see changes within a second (their caches live at most that long).
func adminCmd() *cobra.Command { return newAdminCmd(openAdminEnv) }

// adminEnvRunner runs f over an open deployment (withRedis as for adminOpener) and
// closes it afterwards.
type adminEnvRunner = func(ctx context.Context, withRedis bool, f func(adminEnv) error) error

// newAdminCmd builds the admin commands over open (tests pass their own database).
// Tenants and keys are created and changed through the tenant and key services, so the
// CLI refuses exactly what the admin API refuses.
func newAdminCmd(open adminOpener) *cobra.Command {
	cmd := &cobra.Command{Use: "admin", Short: "Manage tenants, API keys, webhook endpoints, model pools and admin credentials in Postgres"}
	var reason string
	cmd.PersistentFlags().StringVar(&reason, "reason", "", "why you make this change: kept in the audit log with it")
	withEnv := func(ctx context.Context, withRedis bool, f func(adminEnv) error) error {
		env, closeEnv, err := open(ctx, withRedis)
		if err != nil {
			return err
		}
		defer closeEnv()
		return f(env)
	}
	// The CLI's changes are recorded as its operating-system user's.
	cmd.PersistentPreRun = func(c *cobra.Command, _ []string) {
		c.SetContext(agentqtype.WithActor(c.Context(), cliActor(reason)))
	}
	cmd.AddCommand(tenantCommands(withEnv)...)
	cmd.AddCommand(keyCommands(withEnv)...)
	cmd.AddCommand(panelLinksRevokeCommand(withEnv), eventsCommand(withEnv), usageExportCommand(withEnv))
	cmd.AddCommand(webhookCommands(withEnv, printJSON)...)
	cmd.AddCommand(tenantWebhookCommands(withEnv, printJSON)...)
	cmd.AddCommand(poolCommands(withEnv), agentCommands(withEnv), taskResumeCommand(withEnv), taskTreeCommand(withEnv), auditCommands(withEnv))
	cmd.AddCommand(credentialCommands(withEnv))
	return cmd
}

// cliActor is who acts through the CLI: "cli:<os user>", with the reason given.
func cliActor(reason string) agentqtype.Actor {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if name == "" {
		name = "unknown"
	}
	return agentqtype.Actor{Kind: agentqtype.ActorCLI, Name: "cli:" + name, Reason: reason}
}

// printJSON writes v to the command's output as indented JSON.
func printJSON(cmd *cobra.Command, v any) error {
	enc := json.NewEncoder(cmd.OutOrStdout())
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// parseOverrides reads --overrides: limit overrides as JSON.
func parseOverrides(s string) (map[string]quotas.Limit, error) {
	var ov map[string]quotas.Limit
	if err := json.Unmarshal([]byte(s), &ov); err != nil {
		return nil, fmt.Errorf("--overrides: %w", err)
	}
	if ov == nil {
		ov = map[string]quotas.Limit{} // "null" or "{}": no overrides
	}
	return ov, nil
}

// tenantCommands are tenant-create, tenant-update and tenant-list, through the
// tenant service the admin API uses.
func tenantCommands(withEnv adminEnvRunner) []*cobra.Command {
	var id, name, plan, overrides, status, timeZone string
	var weight, billingDay int
	// anchorFields reads the billing anchor flags given; a flag not given is nil.
	anchorFields := func(cmd *cobra.Command) (dayp *int, zonep *string) {
		if cmd.Flags().Changed("billing-day") {
			dayp = &billingDay
		}
		if cmd.Flags().Changed("time-zone") {
			zonep = &timeZone
		}
		return
	}
	// tenantFields reads the flags given on the command line; a flag not given is nil.
	tenantFields := func(cmd *cobra.Command) (namep, planp, statusp *string, weightp *int, ov map[string]quotas.Limit, err error) {
		f := cmd.Flags()
		if f.Changed("name") {
			namep = &name
		}
		if f.Changed("plan") {
			planp = &plan
		}
		if f.Changed("status") {
			statusp = &status
		}
		if f.Changed("weight") {
			weightp = &weight
		}
		if f.Changed("overrides") {
			ov, err = parseOverrides(overrides)
		}
		return
	}
	overridesHelp := `limit overrides as JSON: a number is the limit (0 allows nothing), "unlimited" turns it off, e.g. {"tenant_rate":5,"usd_monthly":"unlimited"}`

	tenantCreate := &cobra.Command{
		Use:   "tenant-create",
		Short: "Create a tenant",
		RunE: func(cmd *cobra.Command, _ []string) error {
			namep, _, _, weightp, ov, err := tenantFields(cmd)
			if err != nil {
				return err
			}
			dayp, zonep := anchorFields(cmd)
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				t, err := env.tenants.Create(cmd.Context(), tenants.CreateParams{
					ID: id, Name: namep, Plan: &plan, Weight: weightp, Overrides: ov, BillingDay: dayp, TimeZone: zonep,
				})
				if err != nil {
					return err
				}
				return printJSON(cmd, tenantOut(env, t))
			})
		},
	}
	tenantCreate.Flags().StringVar(&id, "id", "", "tenant id (required)")
	tenantCreate.Flags().StringVar(&name, "name", "", "display name (default: the id)")
	tenantCreate.Flags().StringVar(&plan, "plan", "free", "plan name")
	tenantCreate.Flags().IntVar(&weight, "weight", 0, "fair-share weight, 1 to 1000 (default: the plan's)")
	tenantCreate.Flags().StringVar(&overrides, "overrides", "", overridesHelp)
	tenantCreate.Flags().IntVar(&billingDay, "billing-day", 0, "day of the month billing periods start on, 1 to 31, clamped to the month's end (default: the UTC day of creation)")
	tenantCreate.Flags().StringVar(&timeZone, "time-zone", "", "IANA time zone whose midnight starts billing periods, e.g. Europe/Paris (default UTC)")
	_ = tenantCreate.MarkFlagRequired("id")

	tenantUpdate := &cobra.Command{
		Use:   "tenant-update TENANT",
		Short: "Change a tenant's name, plan, weight, overrides or status; only the flags given change",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			namep, planp, statusp, weightp, ov, err := tenantFields(cmd)
			if err != nil {
				return err
			}
			dayp, zonep := anchorFields(cmd)
			return withEnv(cmd.Context(), true, func(env adminEnv) error {
				t, err := env.tenants.Update(cmd.Context(), tenants.UpdateParams{
					ID: args[0], Name: namep, Plan: planp, Weight: weightp, Overrides: ov, Status: statusp,
					BillingDay: dayp, TimeZone: zonep,
				})
				if err != nil {
					return err
				}
				return printJSON(cmd, tenantOut(env, t))
			})
		},
	}
	tenantUpdate.Flags().StringVar(&name, "name", "", "display name")
	tenantUpdate.Flags().StringVar(&plan, "plan", "", "plan name")
	tenantUpdate.Flags().IntVar(&weight, "weight", 0, "fair-share weight, 1 to 1000")
	tenantUpdate.Flags().StringVar(&overrides, "overrides", "", overridesHelp+"; replaces every override")
	tenantUpdate.Flags().StringVar(&status, "status", "", "active or suspended")
	tenantUpdate.Flags().IntVar(&billingDay, "billing-day", 0, "day of the month billing periods start on, 1 to 31; the tenant's usage rollups are rebuilt under it")
	tenantUpdate.Flags().StringVar(&timeZone, "time-zone", "", "IANA time zone whose midnight starts billing periods; the tenant's usage rollups are rebuilt under it")

	tenantList := &cobra.Command{
		Use:   "tenant-list",
		Short: "List tenants",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				ts, err := env.tenants.List(cmd.Context())
				if err != nil {
					return err
				}
				var out []api.TenantJSON // none prints null, as it always has
				for _, t := range ts {
					out = append(out, tenantOut(env, t))
				}
				return printJSON(cmd, out)
			})
		},
	}

	return []*cobra.Command{tenantCreate, tenantUpdate, tenantList}
}

// keyCommands are key-create, key-list, key-rotate and key-revoke, through the key
// service the admin API uses.
func keyCommands(withEnv adminEnvRunner) []*cobra.Command {
	var agents, principals string
	keyCreate := &cobra.Command{
		Use:   "key-create TENANT",
		Short: "Create an API key for a tenant; the plaintext is printed once",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				k, err := env.apiKeys.Create(cmd.Context(), keys.CreateParams{
					TenantID: args[0],
					Scopes:   keys.Scopes{Agents: splitList(agents), Principals: splitList(principals)},
				})
				if err != nil {
					return err
				}
				return printJSON(cmd, map[string]string{"kid": k.Kid, "key": k.Plaintext})
			})
		},
	}
	keyCreate.Flags().StringVar(&agents, "agents", "", "comma-separated agents the key may run (default all)")
	keyCreate.Flags().StringVar(&principals, "principals", "", "comma-separated users the key may act for (default all)")

	keyList := &cobra.Command{
		Use:   "key-list TENANT",
		Short: "List a tenant's API keys, revoked ones included (never their secrets)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				ks, err := env.apiKeys.List(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				out := make([]api.KeyJSON, 0, len(ks))
				for _, k := range ks {
					out = append(out, api.NewKeyJSON(k))
				}
				return printJSON(cmd, out)
			})
		},
	}

	keyRotate := &cobra.Command{
		Use:   "key-rotate KID",
		Short: "Give a key a new secret; the old one stops working",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withEnv(cmd.Context(), true, func(env adminEnv) error {
				k, err := env.apiKeys.Rotate(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return printJSON(cmd, map[string]string{"kid": k.Kid, "key": k.Plaintext})
			})
		},
	}
	keyRevoke := &cobra.Command{
		Use:   "key-revoke KID",
		Short: "Revoke a key",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withEnv(cmd.Context(), true, func(env adminEnv) error {
				if _, err := env.apiKeys.Revoke(cmd.Context(), args[0]); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "revoked", args[0])
				return nil
			})
		},
	}
	return []*cobra.Command{keyCreate, keyList, keyRotate, keyRevoke}
}

// panelLinksRevokeCommand is panel-links-revoke.
func panelLinksRevokeCommand(withEnv adminEnvRunner) *cobra.Command {
	panelRevoke := &cobra.Command{
		Use:   "panel-links-revoke TENANT",
		Short: "Revoke every tenant panel link of TENANT issued until now; links issued afterwards work",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withEnv(cmd.Context(), true, func(env adminEnv) error {
				t, err := env.tenants.RevokePanelLinks(cmd.Context(), args[0], time.Now())
				if errors.Is(err, agentqtype.ErrNotFound) {
					return fmt.Errorf("%s", fmt.Sprintf("No tenant %q.", args[0])) // the API's words
				}
				if err != nil {
					return err
				}
				return printJSON(cmd, api.PanelLinksRevoked{TenantID: t.ID, LinksValidAfter: t.PanelLinksValidAfter.UTC()})
			})
		},
	}
	return panelRevoke
}

// eventsCommand is events: a page of the usage events feed, as the admin API gives it.
func eventsCommand(withEnv adminEnvRunner) *cobra.Command {
	var evType, evTenant, evAfter string
	var evLimit int
	events := &cobra.Command{
		Use:   "events",
		Short: "Print a page of the usage events feed (every tenant's, or --tenant's), as GET /v1/admin/events",
		Long: "Prints {\"events\":[…],\"next_cursor\":\"…\"}, each event the stored CloudEvent. " +
			"Pass next_cursor as --after for the next page; from it, every event shows once, in order.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if evType != "" && !outbox.KnownType(evType) {
				return fmt.Errorf("--type: unknown event type %q: use %s", evType, strings.Join(outbox.Types, ", "))
			}
			if evLimit < 1 || evLimit > outbox.MaxFeedLimit {
				return fmt.Errorf("--limit must be between 1 and %d", outbox.MaxFeedLimit)
			}
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				page, err := env.events.All(cmd.Context(), evTenant, outbox.FeedParams{Type: evType, After: evAfter, Limit: evLimit})
				if errors.Is(err, outbox.ErrBadCursor) {
					return errors.New("--after: malformed cursor: pass a next_cursor this feed gave")
				}
				if err != nil {
					return err
				}
				_, err = cmd.OutOrStdout().Write(api.EventsBody(page))
				return err
			})
		},
	}
	events.Flags().StringVar(&evType, "type", "", "only events of this type ("+strings.Join(outbox.Types, ", ")+")")
	events.Flags().StringVar(&evTenant, "tenant", "", "only this tenant's events")
	events.Flags().StringVar(&evAfter, "after", "", "the next_cursor of the previous page")
	events.Flags().IntVar(&evLimit, "limit", outbox.DefaultFeedLimit, "events per page")
	return events
}

// usageExportCommand is usage-export: every tenant's use in a billing period.
func usageExportCommand(withEnv adminEnvRunner) *cobra.Command {
	var period, format string
	usageExport := &cobra.Command{
		Use:   "usage-export",
		Short: "Print every tenant's use in its billing period starting in a month, per meter (JSON or CSV)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "json" && format != "csv" {
				return fmt.Errorf("--format must be json or csv")
			}
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				exp, err := env.usage.Export(cmd.Context(), period)
				if errors.Is(err, usage.ErrBadPeriod) {
					return fmt.Errorf("%s", usage.BadPeriodMessage) // the API's words
				}
				if err != nil {
					return err
				}
				if format == "csv" {
					return usage.WriteCSV(cmd.OutOrStdout(), exp)
				}
				return printJSON(cmd, exp)
			})
		},
	}
	usageExport.Flags().StringVar(&period, "period", "", "the month, YYYY-MM: each tenant's billing period that starts in it (required)")
	usageExport.Flags().StringVar(&format, "format", "json", "json or csv")
	_ = usageExport.MarkFlagRequired("period")
	return usageExport
}

// webhookCommands are webhook-create, webhook-list, webhook-delete and
// webhook-rotate, through the endpoint service the admin API uses.
func webhookCommands(withEnv func(context.Context, bool, func(adminEnv) error) error,
	printJSON func(*cobra.Command, any) error) []*cobra.Command {
	var hookURL, types, tenant string
	create := &cobra.Command{
		Use:   "webhook-create",
		Short: "Create a webhook endpoint for usage events; its secret is printed once",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				w, err := env.webhooks.Create(cmd.Context(), webhooks.CreateWebhookParams{
					URL: hookURL, Types: splitList(types), TenantID: tenant,
				})
				if err != nil {
					return err
				}
				return printJSON(cmd, api.WebhookWithSecret{WebhookJSON: api.NewWebhookJSON(w.Webhook), Secret: w.Secret})
			})
		},
	}
	create.Flags().StringVar(&hookURL, "url", "", "absolute http or https URL the events are POSTed to (required)")
	create.Flags().StringVar(&types, "types", outbox.TypeLimitHit+","+outbox.TypeApproachingLimit, "comma-separated event types")
	create.Flags().StringVar(&tenant, "tenant", "", "only this tenant's events (default every tenant's)")
	_ = create.MarkFlagRequired("url")

	list := &cobra.Command{
		Use:   "webhook-list",
		Short: "List webhook endpoints, disabled ones included (never their secrets)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				ws, err := env.webhooks.List(cmd.Context())
				if err != nil {
					return err
				}
				return printJSON(cmd, api.NewWebhooksJSON(ws))
			})
		},
	}
	del := &cobra.Command{
		Use:   "webhook-delete ID",
		Short: "Delete a webhook endpoint and its pending deliveries",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				if err := env.webhooks.Delete(cmd.Context(), args[0]); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "deleted", args[0])
				return nil
			})
		},
	}
	rotate := &cobra.Command{
		Use:   "webhook-rotate ID",
		Short: "Give a webhook endpoint a new secret; the old one also signs for 24 h",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				w, err := env.webhooks.RotateSecret(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return printJSON(cmd, api.WebhookWithSecret{WebhookJSON: api.NewWebhookJSON(w.Webhook), Secret: w.Secret})
			})
		},
	}
	var enabled bool
	update := &cobra.Command{
		Use:   "webhook-update ID --enabled=true|false",
		Short: "Enable or disable a webhook endpoint (a disabled one receives nothing)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("enabled") {
				return errors.New("--enabled is required: true or false")
			}
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				w, err := env.webhooks.SetEnabled(cmd.Context(), args[0], enabled)
				if err != nil {
					return err
				}
				return printJSON(cmd, api.NewWebhookJSON(w))
			})
		},
	}
	update.Flags().BoolVar(&enabled, "enabled", true, "true to enable, false to disable")
	return []*cobra.Command{create, list, del, rotate, update}
}

// tenantOut is t as the admin API shows it.
func tenantOut(env adminEnv, t tenants.Tenant) api.TenantJSON {
	p, _ := env.tenants.Policy(t) // a plan missing from the catalogue still has a weight
	return api.NewTenantJSON(t, p)
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
