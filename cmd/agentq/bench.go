package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/quotas"
)

func benchCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Run a benchmark scenario against real Redis (REDIS_URL)"}
	var asJSON bool
	var concurrency, tenants int
	var duration time.Duration
	admission := &cobra.Command{
		Use:   "admission",
		Short: "Decisions per second of the full admission script vs a single-key GCRA limiter",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.FromEnv()
			if err != nil {
				return err
			}
			rdb, err := redisx.Connect(cmd.Context(), cfg.RedisURL)
			if err != nil {
				return err
			}
			defer rdb.Close()
			res, err := quotas.RunAdmissionBench(cmd.Context(), rdb, quotas.AdmissionBenchOptions{
				Concurrency: concurrency, Duration: duration, Tenants: tenants, Progress: os.Stderr,
			})
			if err != nil {
				return err
			}
			return printBench(asJSON, res, fmt.Sprintf(
				"full admission %.0f/s (p50 %.0f µs, p99 %.0f µs) vs single-key GCRA %.0f/s: %.2fx; raw EVALSHA %.0f/s; %.0f Redis bytes per active tenant",
				res.AdmissionsPerS, res.P50us, res.P99us, res.SingleBucketPerS, res.Ratio, res.RawEvalshaPerS, res.RedisBytesPerTenant))
		},
	}
	admission.Flags().IntVar(&concurrency, "concurrency", 32, "concurrent clients")
	admission.Flags().DurationVar(&duration, "duration", 4*time.Second, "length of each measured phase")
	admission.Flags().IntVar(&tenants, "tenants", 100, "tenants the load spreads over")
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print one JSON object on stdout")
	cmd.AddCommand(admission)
	return cmd
}

func printBench(asJSON bool, v any, summary string) error {
	if asJSON {
		return json.NewEncoder(os.Stdout).Encode(v)
	}
	fmt.Println(summary)
	return nil
}
