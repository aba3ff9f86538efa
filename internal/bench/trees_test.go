package bench

import (
	"context"
	"testing"
	"time"

	"github.com/agentq/agentq/internal/testenv"
)

// A small run of the trees benchmark: the tree's every task completes beside the
// flood, and each phase reports its figure.
func TestTreesBenchRunsTheTree(t *testing.T) {
	t.Parallel()
	testenv.Postgres(t) // makes sure the test database exists
	res, err := RunTrees(context.Background(), TreesOptions{
		DatabaseURL: testenv.DatabaseURL(), RedisURL: testenv.RedisURL(), Mids: 3, Leaves: 4, Workers: 4,
		RedisTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Tasks != 16 || res.Leaves != 12 || res.PlainMsPerTask <= 0 || res.TreeMsPerTask <= 0 || res.OverheadPerChild <= 0 ||
		res.FloodShareBesidePlain <= 0 || res.FloodShareBesideTree <= 0 {
		t.Fatalf("result %+v", res)
	}
}
