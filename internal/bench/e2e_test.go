package bench

import (
	"context"
	"testing"
	"time"

	"github.com/agentq/agentq/internal/testenv"
)

// A small run of the end-to-end benchmark: every task submitted over HTTP completes,
// both phases report a rate, and the latency percentiles come from the tasks' rows.
func TestE2EBenchRunsEveryTask(t *testing.T) {
	t.Parallel()
	testenv.Postgres(t) // makes sure the test database exists
	res, err := RunE2E(context.Background(), E2EOptions{
		DatabaseURL: testenv.DatabaseURL(), RedisURL: testenv.RedisURL(), Tasks: 60, Concurrency: 4, Workers: 4, Tenants: 2,
		// Beside the whole suite under -race, an admission can take longer than the
		// 80 ms after which a replica answers as if Redis were away (503 for a plan
		// with quotas): that is the degraded mode's test, not this one's.
		RedisTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 0 || res.AgentqTasksPerS <= 0 || res.AsynqTasksPerS <= 0 || res.P99LatencyMs < res.P50LatencyMs || res.P50LatencyMs <= 0 {
		t.Fatalf("result %+v", res)
	}
}
