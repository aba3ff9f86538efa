package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime/pprof"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/agentq/agentq/internal/bench"
	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/redisx"
)

func benchCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Run a benchmark scenario against real Redis (REDIS_URL)"}
	var asJSON bool
	var concurrency, tenants int
	var duration time.Duration
	var profile string
	admission := &cobra.Command{
		Use:   "admission",
		Short: "Decisions per second of the full admission script vs a single-key GCRA limiter",
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, rdb, err := benchRedis(cmd)
			if err != nil {
				return err
			}
			defer rdb.Close()
			if profile != "" {
				stop, err := startCPUProfile(profile)
				if err != nil {
					return err
				}
				defer stop()
			}
			res, err := bench.RunAdmission(cmd.Context(), rdb, bench.AdmissionOptions{
				Concurrency: concurrency, Duration: duration, Tenants: tenants, Progress: os.Stderr,
			})
			if err != nil {
				return err
			}
			return printBench(asJSON, res, fmt.Sprintf(
				"full admission %.0f/s (p50 %.0f µs, p99 %.0f µs) vs single-key GCRA %.0f/s: %.2fx; every limit refusing %.0f/s (%.2fx the passing case); raw EVALSHA %.0f/s; %.0f Redis bytes per active tenant",
				res.AdmissionsPerS, res.P50us, res.P99us, res.SingleBucketPerS, res.Ratio, res.RefusingPerS, res.RefusingRatio,
				res.RawEvalshaPerS, res.RedisBytesPerTenant))
		},
	}
	admission.Flags().IntVar(&concurrency, "concurrency", 32, "concurrent clients")
	admission.Flags().DurationVar(&duration, "duration", 4*time.Second, "length of each measured phase")
	admission.Flags().IntVar(&tenants, "tenants", 100, "tenants the load spreads over")
	admission.Flags().StringVar(&profile, "profile", "", "write a Go CPU profile of the run to this file")
	var light, shallow time.Duration
	var heavy, weightTasks, workers int
	fairness := &cobra.Command{
		Use:   "fairness",
		Short: "Noisy neighbour, weights, shards and scale of the fair scheduler (DATABASE_URL and REDIS_URL)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.FromEnv()
			if err != nil {
				return err
			}
			res, err := bench.RunFairness(cmd.Context(), bench.FairnessOptions{
				DatabaseURL: cfg.DatabaseURL, RedisURL: cfg.RedisURL, Concurrency: workers, Light: light,
				HeavyTasks: heavy, WeightTasks: weightTasks, Shallow: shallow, Progress: os.Stderr,
			})
			if err != nil {
				return err
			}
			return printBench(asJSON, res, fmt.Sprintf(
				"light p99 wait %.0f ms (alone %.0f ms, plain asynq FIFO %.0f ms); weighted share error %.3f (16 shards %.3f), Jain %.4f; shallow-queue share error %.3f; dispatch %.0f µs/task at 10 tenants, %.0f at 10k",
				res.LightP99WaitMs, res.LightP99WaitUncontendedMs, res.FIFOLightP99WaitMs, res.WeightedShareMaxError,
				res.WeightedShareMaxError16, res.JainIndex, res.ShallowShareMaxError, res.DispatchUsPerTask10, res.DispatchUsPerTask10k))
		},
	}
	fairness.Flags().DurationVar(&light, "light", 20*time.Second, "how long the light tenants submit")
	fairness.Flags().IntVar(&heavy, "heavy-tasks", 10000, "the heavy tenant's backlog")
	fairness.Flags().DurationVar(&shallow, "shallow", 12*time.Second, "each weight setting of the shallow-queue scenario")
	fairness.Flags().IntVar(&weightTasks, "weight-tasks", 2000, "tasks per tenant in the weights scenario")
	fairness.Flags().IntVar(&workers, "workers", 20, "worker concurrency")
	var e2eTasks, e2eClients, e2eWorkers, e2eTenants int
	var e2eProfile string
	e2e := &cobra.Command{
		Use:   "e2e",
		Short: "End-to-end tasks per second over HTTP (loadgen's load) against plain asynq (DATABASE_URL and REDIS_URL)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.FromEnv()
			if err != nil {
				return err
			}
			if e2eProfile != "" {
				stop, err := startCPUProfile(e2eProfile)
				if err != nil {
					return err
				}
				defer stop()
			}
			res, err := bench.RunE2E(cmd.Context(), bench.E2EOptions{
				DatabaseURL: cfg.DatabaseURL, RedisURL: cfg.RedisURL, Tasks: e2eTasks, Concurrency: e2eClients,
				Workers: e2eWorkers, Tenants: e2eTenants, Progress: os.Stderr,
			})
			if err != nil {
				return err
			}
			return printBench(asJSON, res, fmt.Sprintf(
				"agentq %.0f tasks/s end to end (p99 %.0f ms) vs plain asynq %.0f tasks/s: %.3fx; %d tasks, %d producers, %d workers",
				res.AgentqTasksPerS, res.P99LatencyMs, res.AsynqTasksPerS, res.Ratio, res.Tasks, res.Concurrency, res.Workers))
		},
	}
	e2e.Flags().IntVar(&e2eTasks, "tasks", 4000, "tasks to run")
	e2e.Flags().IntVar(&e2eClients, "concurrency", 32, "concurrent producers")
	e2e.Flags().IntVar(&e2eWorkers, "workers", 20, "worker concurrency")
	e2e.Flags().IntVar(&e2eTenants, "tenants", 4, "tenants the load is spread over")
	e2e.Flags().StringVar(&e2eProfile, "profile", "", "write a Go CPU profile of the run (the agentq process is this one) to this file")

	cmd.AddCommand(webhooksBenchCmd(&asJSON), tokensBenchCmd(&asJSON), treesBenchCmd(&asJSON))
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print one JSON object on stdout")
	cmd.AddCommand(admission, fairness, e2e)
	return cmd
}

func printBench(asJSON bool, v any, summary string) error {
	if asJSON {
		return json.NewEncoder(os.Stdout).Encode(v)
	}
	fmt.Println(summary)
	return nil
}

// startCPUProfile writes a CPU profile of this process to path until the returned stop.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

func webhooksBenchCmd(asJSON *bool) *cobra.Command {
	var o bench.WebhooksOptions
	cmd := &cobra.Command{
		Use:   "webhooks",
		Short: "Delay to healthy webhook endpoints' first attempts with a hung endpoint and its backlog, and without (DATABASE_URL)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.FromEnv()
			if err != nil {
				return err
			}
			o.DatabaseURL, o.Progress = cfg.DatabaseURL, os.Stderr
			res, err := bench.RunWebhooks(cmd.Context(), o)
			if err != nil {
				return err
			}
			return printBench(*asJSON, res, fmt.Sprintf(
				"first attempts with a hung endpoint and %d due to it: p50 %.0f ms, p90 %.0f ms, max %.0f ms (%d missed); without: p50 %.0f ms, p90 %.0f ms, max %.0f ms",
				res.Backlog, res.Hung.P50Ms, res.Hung.P90Ms, res.Hung.MaxMs, res.Hung.Missed,
				res.Baseline.P50Ms, res.Baseline.P90Ms, res.Baseline.MaxMs))
		},
	}
	cmd.Flags().IntVar(&o.Backlog, "backlog", 10000, "the events each hung endpoint has due when the probes start")
	cmd.Flags().IntVar(&o.Hung, "hung", 1, "hung endpoints, each taking every event")
	cmd.Flags().IntVar(&o.Probes, "probes", 100, "events to the healthy endpoints per phase")
	cmd.Flags().IntVar(&o.Endpoints, "endpoints", 4, "healthy endpoints")
	cmd.Flags().DurationVar(&o.Interval, "interval", 50*time.Millisecond, "between probe events")
	cmd.Flags().IntVar(&o.Relay.Workers, "workers", 0, "the relay's pool (0: its default)")
	cmd.Flags().IntVar(&o.Relay.PerEndpoint, "per-endpoint", 0, "the relay's per-endpoint cap (0: its default)")
	return cmd
}

// tokensOut is `agentq bench tokens`' answer: the pool scenarios', then the server's.
type tokensOut struct {
	bench.TokensResult
	*bench.TokensE2E // nil (and absent from the JSON) with --server=false
}

func tokensBenchCmd(asJSON *bool) *cobra.Command {
	var o bench.TokensConfig
	var e bench.TokensE2EOptions
	var server bool
	cmd := &cobra.Command{
		Use: "tokens",
		Short: "A model pool's weighted shares, 60 s window, light tenant's wait and throttling, through the real pool scripts (REDIS_URL); " +
			"then, on a server of its own (DATABASE_URL), a tenant parked on its tokens per minute and an uncontended pool's cost",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, rdb, err := benchRedis(cmd)
			if err != nil {
				return err
			}
			defer rdb.Close()
			o.Redis, o.Progress = rdb, os.Stderr
			var out tokensOut
			if out.TokensResult, err = bench.Tokens(cmd.Context(), o); err != nil {
				return err
			}
			if server {
				e.DatabaseURL, e.RedisURL, e.Progress = cfg.DatabaseURL, cfg.RedisURL, os.Stderr
				s, err := bench.RunTokensE2E(cmd.Context(), e)
				if err != nil {
					return err
				}
				out.TokensE2E = &s
			}
			res, s := out.TokensResult, bench.TokensE2E{}
			if out.TokensE2E != nil {
				s = *out.TokensE2E
			}
			return printBench(*asJSON, out, fmt.Sprintf(
				"pool shares %v (max error %.4f); with estimates 30-50 %% short %v (max error %.4f); 60 s window %.4f of burst + rate (slack %.6f); light wait p99 %.1f ms (alone %.1f ms); "+
					"throttled %.4f of steps, achieved %.3f of the upstream; mixed sizes throttled %.4f, achieved %.3f; parked tasks held %d worker slots, the other tenant kept %.3f of its throughput; "+
					"an uncontended pool runs at %.3f of none",
				res.PoolShares, res.PoolShareMaxError, res.ShortEstimateShares, res.ShortEstimateShareMaxError, res.PoolWindowMaxRatio, res.PoolWindowAllowedExcessRatio,
				res.LightPoolWaitP99Ms, res.LightPoolWaitP99UncontendedMs, res.AIMDThrottledRatio, res.AIMDAchievedRatio,
				res.AIMDMixedThrottledRatio, res.AIMDMixedAchievedRatio, s.WorkerSlotsHeldByParked, s.OtherThroughputRatio, s.PoolOverheadRatio))
		},
	}
	f := cmd.Flags()
	f.BoolVar(&server, "server", true, "also run the scenarios that need a server (Postgres at DATABASE_URL)")
	f.IntVar(&e.OtherTasks, "other-tasks", 60, "the other tenant's tasks (one 200 ms step) beside the parked one")
	f.IntVar(&e.OverheadTasks, "overhead-tasks", 2000, "one-step tasks in each run of the pool-overhead pairs")
	f.IntVar(&e.OverheadPairs, "overhead-pairs", 8, "pairs of runs, with and without a pool (in alternating order)")
	f.Int64Var(&o.PoolTokensPerMinute, "pool-tokens-per-minute", 6_000_000, "the pool's configured rate")
	f.Int64Var(&o.PoolBurstTokens, "pool-burst", 500_000, "the pool's burst in tokens")
	f.IntVar(&o.Workers, "workers", 8, "simulated workers per flooding tenant")
	f.DurationVar(&o.Step, "step", 100*time.Millisecond, "how long a simulated step runs")
	f.DurationVar(&o.Flood, "flood", 75*time.Second, "the flood measuring shares, the 60 s window and the light tenant's wait")
	f.DurationVar(&o.Warmup, "warmup", 5*time.Second, "the flood's first part, left out of the shares (the initial burst)")
	f.DurationVar(&o.LightEvery, "light-every", 200*time.Millisecond, "between the light tenant's asks")
	f.DurationVar(&o.Uncontended, "uncontended", 10*time.Second, "the light tenant alone on an idle pool")
	f.DurationVar(&o.ShortFlood, "short-flood", 40*time.Second, "the flood whose every estimate falls 30-50 % short")
	f.DurationVar(&o.AIMDWarmup, "aimd-warmup", time.Minute, "the throttled flood before its measured window")
	f.DurationVar(&o.AIMDWindow, "aimd-window", 30*time.Second, "the throttled flood's measured window")
	f.DurationVar(&o.MixedWarmup, "aimd-mixed-warmup", 50*time.Second, "the mixed step sizes' throttled flood before its measured window")
	f.DurationVar(&o.MixedWindow, "aimd-mixed-window", 50*time.Second, "the mixed step sizes' measured window")
	f.StringVar(&o.Only, "only", "", "run one of the pool scenarios alone: flood, alone, short, aimd or aimd-mixed")
	f.DurationVar(&o.RetryAfter, "retry-after", 100*time.Millisecond, "the least retry time a simulated upstream's refusal says")
	f.Int64Var(&o.UpstreamBurst, "upstream-burst", 0, "the simulated upstream's burst in tokens (0: one second of its rate)")
	return cmd
}

// benchRedis reads the configuration from the environment and opens its Redis
// (REDIS_URL, or the cluster's addresses), for the scenarios that drive Redis
// directly.
func benchRedis(cmd *cobra.Command) (config.Config, redis.UniversalClient, error) {
	cfg, err := config.FromEnv()
	if err != nil {
		return cfg, nil, err
	}
	rdb, err := redisx.Open(cmd.Context(), cfg.RedisURL, cfg.RedisClusterAddrs)
	return cfg, rdb, err
}

// treesBenchCmd is `agentq bench trees`: a three-level tree's cost per child against
// plain submissions, and the other tenants' share beside it.
func treesBenchCmd(asJSON *bool) *cobra.Command {
	var o bench.TreesOptions
	var profile string
	cmd := &cobra.Command{
		Use:   "trees",
		Short: "A 3-level task tree's machine time per child against plain submissions, and a flood's share beside it (DATABASE_URL and REDIS_URL)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.FromEnv()
			if err != nil {
				return err
			}
			o.DatabaseURL, o.RedisURL, o.Progress = cfg.DatabaseURL, cfg.RedisURL, os.Stderr
			if profile != "" {
				stop, err := startCPUProfile(profile)
				if err != nil {
					return err
				}
				defer stop()
			}
			res, err := bench.RunTrees(cmd.Context(), o)
			if err != nil {
				return err
			}
			return printBench(*asJSON, res, fmt.Sprintf(
				"a tree of %d tasks (%d leaves): %.3f ms of machine a task against %.3f for plain submissions (%.2fx); "+
					"the flood's share of worker time beside it %.3f, beside plain tasks %.3f (change %.3f)",
				res.Tasks, res.Leaves, res.TreeMsPerTask, res.PlainMsPerTask, res.OverheadPerChild,
				res.FloodShareBesideTree, res.FloodShareBesidePlain, res.ShareChange))
		},
	}
	cmd.Flags().IntVar(&o.Mids, "mids", 20, "children of the root")
	cmd.Flags().IntVar(&o.Leaves, "leaves", 50, "leaves of each child (at most 50: a step's spawns)")
	cmd.Flags().IntVar(&o.StepMs, "step-ms", 2, "each task's step")
	cmd.Flags().IntVar(&o.Workers, "workers", 20, "worker concurrency")
	cmd.Flags().StringVar(&profile, "profile", "", "write a Go CPU profile of the run (the agentq process is this one) to this file")
	return cmd
}
