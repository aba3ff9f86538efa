package e2e_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/testenv"
)

// pgTrips counts a pool's round trips (a statement alone or a batch) and statements.
type pgTrips struct{ trips, stmts atomic.Int64 }

func (p *pgTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	p.trips.Add(1)
	p.stmts.Add(1)
	return ctx
}
func (p *pgTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (p *pgTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	p.trips.Add(1)
	return ctx
}
func (p *pgTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	p.stmts.Add(1)
}
func (p *pgTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// countedAPI starts the API role on a Redis client and a Postgres pool whose round
// trips are counted, and returns its base URL and the admin token.
func countedAPI(t testing.TB) (base, admin string, rt *redisCount, pt *pgTrips) {
	t.Helper()
	ctx := context.Background()
	schemaPool := testenv.Postgres(t)
	pcfg := schemaPool.Config()
	pt = &pgTrips{}
	pcfg.ConnConfig.Tracer = pt
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	rdb, keys := testenv.Redis(t, 1)
	rt = &redisCount{}
	rdb.AddHook(rt)
	cfg := agentq.DefaultConfig()
	cfg.HTTPAddr, cfg.AdminToken, cfg.RedisPrefix = "127.0.0.1:0", "admin-trips", keys.Prefix()
	cfg.Roles = []string{config.RoleAPI}
	app, err := agentq.New(ctx, agentq.Options{Config: cfg, Redis: rdb, Pool: pool, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = app.Shutdown(ctx)
	})
	return "http://" + app.Addr().String(), cfg.AdminToken, rt, pt
}

// httpCall is one request to the API, failing tb unless it answers want.
func httpCall(tb testing.TB, hc *http.Client, base, method, path, token, body string, want int) []byte {
	tb.Helper()
	req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		tb.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, raw)
	}
	return raw
}

// A usage report of a tenant without live tasks costs at most five Redis round trips
// (the key bucket, the request slot's take and release, the peek, and one pipeline of
// the other reads) and four Postgres ones (the live tasks, the refusal counts, the limit
// hits with the days in one pipeline, the SLA breaches).
func TestUsageRoundTrips(t *testing.T) {
	t.Parallel()
	base, admin, rt, pt := countedAPI(t)
	hc := &http.Client{}
	httpCall(t, hc, base, "POST", "/v1/admin/tenants", admin, toJSON(map[string]any{"id": "rt", "plan": "pro"}), 201)
	var k struct{ Key string }
	if err := json.Unmarshal(httpCall(t, hc, base, "POST", "/v1/admin/tenants/rt/keys", admin, "{}", 201), &k); err != nil {
		t.Fatal(err)
	}
	// Background work only adds trips: the fewest over a few calls are the call's own.
	minR, minP := int64(1<<62), int64(1<<62)
	for range 5 {
		r0, p0 := rt.trips.Load(), pt.trips.Load()
		httpCall(t, hc, base, "GET", "/v1/usage?days=1", k.Key, "", 200)
		minR, minP = min(minR, rt.trips.Load()-r0), min(minP, pt.trips.Load()-p0)
	}
	t.Logf("GET /v1/usage: %d Redis round trips, %d Postgres round trips", minR, minP)
	if minR > wantUsageRedisTrips || minP > wantUsagePGTrips {
		t.Fatalf("GET /v1/usage: %d Redis and %d Postgres round trips, want at most %d and %d",
			minR, minP, wantUsageRedisTrips, wantUsagePGTrips)
	}
}

const (
	wantUsageRedisTrips = 5
	wantUsagePGTrips    = 4
)
