package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/credentials"
	"github.com/agentq/agentq/web/api"
)

// credentialCommands is `admin credentials create|list|rotate|revoke`, through the
// credential service the admin API uses. A token is printed once, by create and
// rotate; list never shows one. With Redis, running servers drop a rotated or
// revoked credential at once; without it, within a second.
func credentialCommands(withEnv adminEnvRunner) *cobra.Command {
	cmd := &cobra.Command{Use: "credentials", Short: "Manage the named admin credentials and their roles"}
	var role string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create an admin credential with a role (admin, operator, finance, viewer); its token is printed once",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withEnv(cmd.Context(), true, func(env adminEnv) error {
				c, err := env.credentials.Create(cmd.Context(), credentials.CreateParams{Name: args[0], Role: agentqtype.Role(role)})
				if err != nil {
					return err
				}
				return printJSON(cmd, api.NewCredentialCreated(c))
			})
		},
	}
	create.Flags().StringVar(&role, "role", "", "admin, operator, finance or viewer (required)")
	_ = create.MarkFlagRequired("role")
	list := &cobra.Command{
		Use:   "list",
		Short: "List the admin credentials, the environment's and the stored ones, revoked ones included (never a token)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				cs, err := env.credentials.List(cmd.Context())
				if err != nil {
					return err
				}
				out := make([]api.CredentialJSON, 0, len(cs))
				for _, c := range cs {
					out = append(out, api.NewCredentialJSON(c))
				}
				return printJSON(cmd, out)
			})
		},
	}
	cmd.AddCommand(create, list, credentialRotate(withEnv), credentialRevoke(withEnv))
	return cmd
}

func credentialRotate(withEnv adminEnvRunner) *cobra.Command {
	return &cobra.Command{
		Use:   "rotate NAME",
		Short: "Give a stored admin credential a new token, printed once; the old one stops working",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withEnv(cmd.Context(), true, func(env adminEnv) error {
				c, err := env.credentials.Rotate(cmd.Context(), credentials.RotateParams{Name: args[0]})
				if err != nil {
					return err
				}
				return printJSON(cmd, api.NewCredentialCreated(c))
			})
		},
	}
}

func credentialRevoke(withEnv adminEnvRunner) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke NAME",
		Short: "Revoke a stored admin credential: its token and its operator view sessions stop working",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withEnv(cmd.Context(), true, func(env adminEnv) error {
				if _, err := env.credentials.Revoke(cmd.Context(), credentials.RevokeParams{Name: args[0]}); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "revoked", args[0])
				return nil
			})
		},
	}
}
