package main

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/web/api"
)

// auditCommands are `audit list|show|revert|verify|head`: the audit log, through the
// service the admin API uses.
func auditCommands(withEnv adminEnvRunner) *cobra.Command {
	group := &cobra.Command{Use: "audit", Short: "Read, verify and revert the audit log of changes"}
	group.AddCommand(auditListCommand(withEnv), auditShowCommand(withEnv), auditRevertCommand(withEnv),
		auditVerifyCommand(withEnv), auditHeadCommand(withEnv))
	return group
}

func auditListCommand(withEnv adminEnvRunner) *cobra.Command {
	var p audit.ListParams
	var since string
	list := &cobra.Command{
		Use:   "list",
		Short: "Print a page of the audit log, newest first, as GET /v1/admin/audit",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if since != "" {
				t, err := time.Parse(time.RFC3339, since)
				if err != nil {
					return errors.New("--since must be an RFC 3339 time, e.g. 2026-01-02T15:04:05Z")
				}
				p.Since = t
			}
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				page, err := env.audit.List(cmd.Context(), p)
				if err != nil {
					return err
				}
				return printJSON(cmd, api.NewAuditPageJSON(page))
			})
		},
	}
	f := list.Flags()
	f.StringVar(&p.Tenant, "tenant", "", "only rows about this tenant")
	f.StringVar(&p.Object, "object", "", "only rows about this object: KIND or KIND:ID (tenant:acme, pool:gpt, ...)")
	f.StringVar(&p.Actor, "actor", "", "only rows of this actor's name (admin, cli:alice, a key's kid, ...)")
	f.StringVar(&since, "since", "", "only rows at or after this time (RFC 3339)")
	f.StringVar(&p.Cursor, "cursor", "", "the next_cursor of the previous page")
	f.IntVar(&p.Limit, "limit", audit.DefaultLimit, "rows per page")
	return list
}

// auditRow reads a row id argument.
func auditRow(arg string) (int64, error) {
	id, err := audit.ParseID(arg)
	if err != nil {
		return 0, fmt.Errorf("%s is not an audit row id", strconv.Quote(arg))
	}
	return id, nil
}

func auditShowCommand(withEnv adminEnvRunner) *cobra.Command {
	return &cobra.Command{
		Use:   "show ID",
		Short: "Print one row of the audit log",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := auditRow(args[0])
			if err != nil {
				return err
			}
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				r, err := env.audit.Get(cmd.Context(), id)
				if err != nil {
					return err
				}
				return printJSON(cmd, api.NewAuditEntryJSON(r))
			})
		},
	}
}

func auditRevertCommand(withEnv adminEnvRunner) *cobra.Command {
	return &cobra.Command{
		Use:   "revert ID",
		Short: "Undo a row's change if its object is still as the row left it; prints the revert's own row",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := auditRow(args[0])
			if err != nil {
				return err
			}
			return withEnv(cmd.Context(), true, func(env adminEnv) error {
				r, err := env.audit.Revert(cmd.Context(), id)
				if err != nil {
					return err
				}
				return printJSON(cmd, api.NewAuditEntryJSON(r))
			})
		},
	}
}

func auditVerifyCommand(withEnv adminEnvRunner) *cobra.Command {
	var expect string
	verify := &cobra.Command{
		Use:   "verify",
		Short: "Walk the audit log's hash chain from its first row; exit 0 when it holds",
		Long: "Checks every row's hash and its link to the row before, and that the chain ends where its head says. " +
			"With --expect-head (a head hash printed by `audit head` earlier and kept elsewhere), that row must still be in the chain. " +
			"Exits non-zero naming the first row that does not hold, or saying the expected head is missing.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				v, err := env.audit.Verify(cmd.Context(), expect)
				if err != nil {
					return err
				}
				if !v.OK() {
					return fmt.Errorf("audit log does not verify: %s", v.Problem)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "ok: %d rows, head %d %s\n", v.Rows, v.Last.ID, v.Last.Hash)
				return nil
			})
		},
	}
	verify.Flags().StringVar(&expect, "expect-head", "", "a head hash kept earlier: it must still be in the chain")
	return verify
}

func auditHeadCommand(withEnv adminEnvRunner) *cobra.Command {
	return &cobra.Command{
		Use:   "head",
		Short: "Print the chain's head {\"id\",\"hash\"}: keep it elsewhere to check later that no tail was cut off",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withEnv(cmd.Context(), false, func(env adminEnv) error {
				h, err := env.audit.Head(cmd.Context())
				if err != nil {
					return err
				}
				return printJSON(cmd, h)
			})
		},
	}
}
