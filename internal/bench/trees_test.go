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
	// A tree this small gives a window of a few starts: a share may be 0 or 1.
	share := func(f float64) bool { return f >= 0 && f <= 1 }
	if res.Tasks != 16 || res.Leaves != 12 || res.PlainMsPerTask <= 0 || res.TreeMsPerTask <= 0 || res.OverheadPerChild <= 0 ||
		!share(res.FloodShareBesidePlain) || !share(res.FloodShareBesideTree) {
		t.Fatalf("result %+v", res)
	}
}
