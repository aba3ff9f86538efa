package main

import (
	"errors"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/web/api"
)

// taskResumeCommand is task-resume: a paused task resumed for its tenant through the
// tasks service the API uses (the same ceiling, the same session check), optionally
// with a raise of its budget.
func taskResumeCommand(withEnv adminEnvRunner) *cobra.Command {
	var tenant string
	var steps int
	var wallclock, cost float64
	cmd := &cobra.Command{
		Use:   "task-resume TASK",
		Short: "Resume a paused task, optionally raising its budget up to the plan's ceiling",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := uuid.Parse(args[0])
			if err != nil {
				return errors.New("TASK must be a task id (a UUID)")
			}
			var raise *tasks.BudgetRequest
			f := cmd.Flags()
			if f.Changed("max-steps") || f.Changed("max-wallclock-s") || f.Changed("max-cost-usd") {
				raise = &tasks.BudgetRequest{}
				if f.Changed("max-steps") {
					raise.MaxSteps = &steps
				}
				if f.Changed("max-wallclock-s") {
					raise.MaxWallclockS = &wallclock
				}
				if f.Changed("max-cost-usd") {
					raise.MaxCostUSD = &cost
				}
			}
			return withEnv(cmd.Context(), true, func(env adminEnv) error {
				if env.tasks == nil {
					return errors.New("resuming a task needs Redis (REDIS_URL): the task takes a session and goes back to its queue there")
				}
				t, err := env.tasks.Resume(cmd.Context(), tasks.ResumeParams{TenantID: tenant, ID: id, Budget: raise})
				if err != nil {
					return err
				}
				return printJSON(cmd, api.NewTaskJSON(t))
			})
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "the task's tenant (required)")
	_ = cmd.MarkFlagRequired("tenant")
	cmd.Flags().IntVar(&steps, "max-steps", 0, "raise the task's max_steps (at most the plan's ceiling)")
	cmd.Flags().Float64Var(&wallclock, "max-wallclock-s", 0, "raise the task's max_wallclock_s (at most the plan's ceiling)")
	cmd.Flags().Float64Var(&cost, "max-cost-usd", 0, "raise the task's max_cost_usd (at most the plan's ceiling)")
	return cmd
}

// taskTreeCommand is task-tree: the whole tree a task belongs to, as GET
// /v1/tasks/{id}/tree shows it to its tenant (every node: no key's scopes apply).
func taskTreeCommand(withEnv adminEnvRunner) *cobra.Command {
	var tenant string
	cmd := &cobra.Command{
		Use:   "task-tree TASK",
		Short: "Show the tree a task belongs to: its tasks, their totals, the tree budget and what is left",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := uuid.Parse(args[0])
			if err != nil {
				return errors.New("TASK must be a task id (a UUID)")
			}
			return withEnv(cmd.Context(), true, func(env adminEnv) error {
				if env.tasks == nil {
					return errors.New("reading a task tree needs Redis (REDIS_URL) as the tasks service does")
				}
				tr, err := env.tasks.Tree(cmd.Context(), tenant, tasks.Scope{}, id)
				if err != nil {
					return err
				}
				return printJSON(cmd, api.NewTreeJSON(tr))
			})
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "the task's tenant (required)")
	_ = cmd.MarkFlagRequired("tenant")
	return cmd
}
