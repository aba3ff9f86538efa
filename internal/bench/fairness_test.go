package bench

import (
	"context"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/pg"
	"github.com/agentq/agentq/internal/testenv"
)

// The fairness benchmark's server takes a free port: it starts while something
// listens on the product's default address (agentq dev, say).
func TestFairnessBenchStartsBesideADevServer(t *testing.T) {
	testenv.Postgres(t)
	// Whether this test holds the default address or something else already does,
	// it is taken while the benchmark starts.
	if ln, err := net.Listen("tcp", "127.0.0.1:8080"); err == nil {
		t.Cleanup(func() { _ = ln.Close() })
	}
	ctx := context.Background()
	ropt, err := redis.ParseURL(testenv.RedisURL())
	if err != nil {
		t.Fatal(err)
	}
	b := &fairBench{o: FairnessOptions{DatabaseURL: testenv.DatabaseURL(), Concurrency: 2}, log: t.Logf, rdb: redis.NewClient(ropt)}
	t.Cleanup(func() { _ = b.rdb.Close() })
	if b.pool, err = pg.Connect(ctx, testenv.DatabaseURL(), ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.pool.Close)
	e, err := b.start(ctx, 1)
	if err != nil {
		t.Fatalf("the benchmark's server did not start beside a listener on the default address: %v", err)
	}
	e.close()
}
