package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/agentq/agentq/internal/pools"
	"github.com/agentq/agentq/web/api"
)

// poolCommands are `pools put|get|list|delete`, through the pool service the admin
// API uses. They ask for Redis (best effort): a pool's answer shows its live state,
// and without Redis that state reads as idle.
func poolCommands(withEnv adminEnvRunner) *cobra.Command {
	group := &cobra.Command{Use: "pools", Short: "Manage model pools: token capacity shared by every tenant's steps"}
	var tpm, burst, rpm int64
	put := &cobra.Command{
		Use:   "put NAME",
		Short: "Create a pool or replace its whole configuration (a flag left out is back to its default)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := pools.ConfigParams{Name: args[0], TokensPerMinute: &tpm}
			if cmd.Flags().Changed("burst-tokens") {
				p.BurstTokens = &burst
			}
			if cmd.Flags().Changed("requests-per-minute") {
				p.RequestsPerMinute = &rpm
			}
			cfg, err := pools.ConfigOf(p)
			if err != nil {
				return err
			}
			return withEnv(cmd.Context(), true, func(env adminEnv) error {
				if _, err := env.pools.Put(cmd.Context(), cfg); err != nil {
					return err
				}
				pl, err := env.pools.Get(cmd.Context(), cfg.Name)
				if err != nil {
					return err
				}
				return printJSON(cmd, api.NewPoolJSON(pl))
			})
		},
	}
	put.Flags().Int64Var(&tpm, "tokens-per-minute", 0, "the pool's rate in tokens a minute (required)")
	put.Flags().Int64Var(&burst, "burst-tokens", 0, "the most tokens lent at once, at most --tokens-per-minute (default one minute's worth)")
	put.Flags().Int64Var(&rpm, "requests-per-minute", 0, "steps a minute the pool allows (default not limited)")
	_ = put.MarkFlagRequired("tokens-per-minute")

	get := &cobra.Command{
		Use:   "get NAME",
		Short: "Print a pool with its live state and its agents",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withEnv(cmd.Context(), true, func(env adminEnv) error {
				pl, err := env.pools.Get(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return printJSON(cmd, api.NewPoolJSON(pl))
			})
		},
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List pools with their live state, as GET /v1/admin/pools",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withEnv(cmd.Context(), true, func(env adminEnv) error {
				ps, err := env.pools.List(cmd.Context())
				if err != nil {
					return err
				}
				return printJSON(cmd, api.NewPoolsJSON(ps))
			})
		},
	}
	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a pool and unbind its agents",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				if err := env.pools.Delete(cmd.Context(), args[0]); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "deleted", args[0])
				return nil
			})
		},
	}
	group.AddCommand(put, get, list, del)
	return group
}

// agentCommands are `agents pool` and `agents unbind`: an agent's binding to a pool.
// The CLI knows the built-in agent and the HTTP agents; an agent an embedding
// program registers in process is bound through the admin API of that program.
func agentCommands(withEnv adminEnvRunner) *cobra.Command {
	group := &cobra.Command{Use: "agents", Short: "Bind agents to model pools"}
	var pool string
	var perStep int64
	bind := &cobra.Command{
		Use:   "pool AGENT",
		Short: "Bind AGENT to --pool, each step reserving --tokens-per-step; without flags, print its binding",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f := cmd.Flags()
			if f.Changed("pool") != f.Changed("tokens-per-step") {
				return errors.New("give both --pool and --tokens-per-step to bind, or neither to print the binding")
			}
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				if f.Changed("pool") {
					if _, err := env.pools.Bind(cmd.Context(), pools.BindParams{Agent: args[0], Pool: pool, TokensPerStep: perStep}); err != nil {
						return err
					}
				}
				b, err := env.pools.GetBinding(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return printJSON(cmd, api.NewAgentPoolJSON(b))
			})
		},
	}
	bind.Flags().StringVar(&pool, "pool", "", "the pool the agent's steps reserve from")
	bind.Flags().Int64Var(&perStep, "tokens-per-step", 0, "tokens each step reserves before it runs")
	unbind := &cobra.Command{
		Use:   "unbind AGENT",
		Short: "Unbind AGENT from its pool: its steps then reserve from none",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				if err := env.pools.Unbind(cmd.Context(), args[0]); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "unbound", args[0])
				return nil
			})
		},
	}
	group.AddCommand(bind, unbind)
	return group
}
