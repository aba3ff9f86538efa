package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/billing/webhooks"
	"github.com/agentq/agentq/web/api"
)

// tenantWebhookCommands are tenant-webhook-create, -list, -delete and -rotate: a
// tenant's own endpoints (those of GET /v1/webhooks), managed for it by the operator
// through the service the tenant API uses, with the same rules and the same
// webhook_endpoints limit.
func tenantWebhookCommands(withEnv func(context.Context, bool, func(adminEnv) error) error,
	printJSON func(*cobra.Command, any) error) []*cobra.Command {
	var tenant, hookURL, types string
	tenantFlag := func(c *cobra.Command) {
		c.Flags().StringVar(&tenant, "tenant", "", "the tenant whose own endpoints these are (required)")
		_ = c.MarkFlagRequired("tenant")
	}
	withSecret := func(cmd *cobra.Command, w webhooks.WebhookWithSecret) error {
		return printJSON(cmd, api.WebhookWithSecret{WebhookJSON: api.NewWebhookJSON(w.Webhook), Secret: w.Secret})
	}
	create := &cobra.Command{
		Use:   "tenant-webhook-create",
		Short: "Create a webhook endpoint of a tenant's own, for its events only; its secret is printed once",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				w, err := env.webhooks.CreateForTenant(cmd.Context(), webhooks.TenantWebhookParams{
					TenantID: tenant, URL: hookURL, Types: splitList(types),
				})
				if err != nil {
					return err
				}
				return withSecret(cmd, w)
			})
		},
	}
	tenantFlag(create)
	create.Flags().StringVar(&hookURL, "url", "", "absolute http or https URL the events are POSTed to (required)")
	create.Flags().StringVar(&types, "types", outbox.TypeLimitHit+","+outbox.TypeApproachingLimit, "comma-separated event types")
	_ = create.MarkFlagRequired("url")
	list := &cobra.Command{
		Use:   "tenant-webhook-list",
		Short: "List a tenant's own webhook endpoints (never their secrets)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				ws, err := env.webhooks.ListForTenant(cmd.Context(), tenant)
				if err != nil {
					return err
				}
				return printJSON(cmd, api.NewWebhooksJSON(ws))
			})
		},
	}
	tenantFlag(list)
	del := &cobra.Command{
		Use:   "tenant-webhook-delete ID",
		Short: "Delete one of a tenant's own webhook endpoints",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				if err := env.webhooks.DeleteForTenant(cmd.Context(), tenant, args[0]); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "deleted", args[0])
				return nil
			})
		},
	}
	tenantFlag(del)
	rotate := &cobra.Command{
		Use:   "tenant-webhook-rotate ID",
		Short: "Give one of a tenant's own webhook endpoints a new secret; the old one also signs for 24 h",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				w, err := env.webhooks.RotateSecretForTenant(cmd.Context(), tenant, args[0])
				if err != nil {
					return err
				}
				return withSecret(cmd, w)
			})
		},
	}
	tenantFlag(rotate)
	return []*cobra.Command{create, list, del, rotate}
}
