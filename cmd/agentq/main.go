// Command agentq runs the agentq runtime: serve (production roles), dev (everything in
// one process with demo tenants), migrate, admin and bench.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/telemetry"
)

// gcPercent is the garbage collector's target (GOGC) unless the environment sets one.
// Under load an agentq process allocates about 125 KB per task around a live heap of
// about 10 MB, so Go's default of 100 collected 65 times in a 4,000-task load-generator run;
// at 400 the heap grows to about 50 MB and the collector runs a fifth as often. In alternating
// load-generator runs that took a tenth off agentq's CPU per task. GOGC=100 restores Go's
// default; GOMEMLIMIT caps the heap.
const gcPercent = 400

// tuneGC sets gcPercent when getenv has no GOGC, and reports whether it did.
func tuneGC(getenv func(string) string) bool {
	if getenv("GOGC") != "" {
		return false
	}
	debug.SetGCPercent(gcPercent)
	return true
}

func main() {
	tuneGC(os.Getenv)
	root := &cobra.Command{
		Use:           "agentq",
		Short:         "Multi-tenant runtime for AI-agent tasks",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCmd(), devCmd(), migrateCmd(), adminCmd(), benchCmd())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "agentq:", err)
		os.Exit(1)
	}
}

// newLogger is the process's logger: JSON lines (serve), or readable text (dev); a
// line logged with a context carries its trace_id and span_id.
func newLogger(text bool) *slog.Logger {
	level := slog.LevelInfo
	if os.Getenv("AGENTQ_LOG_LEVEL") == "debug" {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewJSONHandler(os.Stderr, opts)
	if text {
		h = slog.NewTextHandler(os.Stderr, opts)
	}
	return slog.New(telemetry.LogHandler(h))
}

func serveCmd() *cobra.Command {
	var roles string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run agentq roles (api, scheduler, worker, janitor, relay); all of them by default",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := agentq.ConfigFromEnv()
			if err != nil {
				return err
			}
			if roles != "" {
				if cfg.Roles, err = config.ParseRoles(roles); err != nil {
					return err
				}
			}
			log := newLogger(false)
			slog.SetDefault(log)
			return run(cmd.Context(), agentq.Options{Config: cfg, Logger: log}, nil)
		},
	}
	cmd.Flags().StringVar(&roles, "roles", "", "comma-separated roles to run: api,scheduler,worker,janitor,relay (default all)")
	return cmd
}

// run starts an App and blocks until SIGINT/SIGTERM, then shuts down gracefully:
// stop accepting requests, let running steps finish up to the shutdown timeout, exit.
func run(ctx context.Context, o agentq.Options, started func(*agentq.App) error) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	app, err := agentq.New(ctx, o)
	if err != nil {
		return err
	}
	if err := app.Start(ctx); err != nil {
		_ = app.Shutdown(context.Background())
		return err
	}
	if started != nil {
		if err := started(app); err != nil {
			_ = app.Shutdown(context.Background())
			return err
		}
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-hup:
			app.ReloadKeys()
			o.Logger.Info("SIGHUP: key, tenant and admin credential caches reloaded")
		}
	}
	o.Logger.Info("shutting down", "timeout", o.Config.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), o.Config.ShutdownTimeout+5*time.Second)
	defer cancel()
	return app.Shutdown(sctx)
}

func migrateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Apply pending Postgres migrations and exit",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.FromEnv()
			if err != nil {
				return err
			}
			pool, err := connectPG(cmd.Context(), cfg.DatabaseURL)
			if err != nil {
				return err
			}
			defer pool.Close()
			applied, err := migrationsUp(cmd.Context(), pool)
			if err != nil {
				return err
			}
			if len(applied) == 0 {
				fmt.Println("schema is up to date")
			}
			for _, v := range applied {
				fmt.Printf("applied migration %05d\n", v)
			}
			return nil
		},
	}
}
