package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq"

	"github.com/google/uuid"

	"github.com/agentq/agentq/internal/appparts"
	"github.com/agentq/agentq/internal/netguard"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
	"github.com/agentq/agentq/runtime"
	"github.com/agentq/agentq/scheduler"
	"github.com/agentq/agentq/web"
)

// harness is a whole agentq process (API, scheduler, workers) on the test's own
// Postgres schema and Redis prefix, served on a random port.
type harness struct {
	t       *testing.T
	app     app
	base    string
	admin   string
	stopped bool
}

// app is an agentq.App with its components at hand, for the tests that check what a
// request or a task left in Postgres and Redis, or drive a component directly.
type app struct {
	*agentq.App
	parts appparts.Parts
}

func newApp(a *agentq.App) app { return app{App: a, parts: appparts.Of(a)} }

func (a app) Store() *store.Store             { return a.parts.Store }
func (a app) Redis() redis.UniversalClient    { return a.parts.Redis }
func (a app) Keys() rkeys.Keys                { return a.parts.Keys }
func (a app) Quotas() *admission.Store        { return a.parts.Quotas }
func (a app) Admission() *admission.Guard     { return a.parts.Admission }
func (a app) Scheduler() *scheduler.Scheduler { return a.parts.Scheduler }
func (a app) Worker() *runtime.Worker         { return a.parts.Worker }
func (a app) API() *web.Server                { return a.parts.API }
func (a app) JanitorLeads() bool              { return a.parts.JanitorLeads() }

// env is the shared state several agentq processes of one test run on.
type env struct {
	pool  *pgxpool.Pool
	rdb   redis.UniversalClient
	keys  rkeys.Keys
	admin string
	// apiStarted: a process with the api role has run on the env (and advertised
	// its address).
	apiStarted atomic.Bool
}

func newEnv(t *testing.T) *env {
	pool := testenv.Postgres(t)
	rdb, keys := testenv.Redis(t, 1)
	return &env{pool: pool, rdb: rdb, keys: keys, admin: "admin-" + testenv.ID()}
}

func start(t *testing.T, tweak ...func(*agentq.Options)) *harness {
	t.Helper()
	return newEnv(t).start(t, tweak...)
}

// start runs one agentq process (all roles unless tweaked) on the env. A worker
// without the api role takes the address of an API process started on the env
// before it, as in production; with none, it is given a public URL of its own.
func (e *env) start(t *testing.T, tweak ...func(*agentq.Options)) *harness {
	t.Helper()
	o := e.options(t, tweak...)
	if c := &o.Config; c.Has(agentq.RoleWorker) && !c.Has(agentq.RoleAPI) && c.PublicURL == "" && !e.apiStarted.Load() {
		c.PublicURL = "http://api.agentq.test" // a worker of a split process set writes approval links for the API
	}
	return e.run(t, o)
}

// options is the Options of a process on the env (all roles unless tweaked).
func (e *env) options(t *testing.T, tweak ...func(*agentq.Options)) agentq.Options {
	t.Helper()
	cfg := agentq.DefaultConfig()
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.AdminToken = e.admin
	cfg.RedisPrefix = e.keys.Prefix()
	cfg.WorkerConcurrency = 8
	cfg.ShutdownTimeout = 5 * time.Second
	// The race detector and parallel tests slow everything down; degraded mode has its
	// own test with a dead Redis.
	cfg.RedisTimeout = 2 * time.Second
	// The tests' webhook receivers are local servers.
	cfg.WebhookAllowNets = netguard.Loopback()
	cfg.PlansFile = testPlans(t)
	o := agentq.Options{
		Config: cfg, Redis: e.rdb, Pool: e.pool,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if testing.Verbose() {
		o.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	for _, f := range tweak {
		f(&o)
	}
	return o
}

// run starts the process o describes and stops it when the test ends.
func (e *env) run(t *testing.T, o agentq.Options) *harness {
	t.Helper()
	ctx := context.Background()
	app, err := agentq.New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if o.Config.Has(agentq.RoleAPI) {
		e.apiStarted.Store(true)
	}
	h := &harness{t: t, app: newApp(app), admin: o.Config.AdminToken}
	if app.Addr() != nil {
		h.base = "http://" + app.Addr().String()
		contractCheck.watch(t, h.base)
	}
	t.Cleanup(func() { h.stop() })
	return h
}

// testPlans is the shipped plan catalogue with one plan more, pro_stop: pro, but
// stopping a task at every limit (on_limit: stop), for the tests of what a stop does
// on a paid plan (pro pauses at most limits). It is written once, for every test.
func testPlans(t *testing.T) string {
	t.Helper()
	testPlansOnce.Do(func() {
		plans, err := loadShippedPlans()
		if err != nil {
			testPlansErr = err
			return
		}
		stop := plans["pro"]
		stop.OnLimit = quotas.OnLimits{Default: quotas.OnLimitStop}
		plans["pro_stop"] = stop
		f, err := os.CreateTemp("", "agentq-e2e-plans-*.yaml")
		if err != nil {
			testPlansErr = err
			return
		}
		f.Close()
		testPlansErr, testPlansFile = writePlans(f.Name(), plans), f.Name()
	})
	if testPlansErr != nil {
		t.Fatal(testPlansErr)
	}
	return testPlansFile
}

var (
	testPlansOnce sync.Once
	testPlansFile string
	testPlansErr  error
)

// stop shuts the process down gracefully (once).
func (h *harness) stop() {
	if h.stopped {
		return
	}
	h.stopped = true
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.app.Shutdown(ctx); err != nil {
		h.t.Errorf("shutdown: %v", err)
	}
}

// do sends a request and decodes a JSON answer into out (if not nil).
func (h *harness) do(method, path, token string, body any, out any) (int, http.Header) {
	h.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			h.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, h.base+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			h.t.Fatalf("%s %s: %d %q is not JSON: %v", method, path, resp.StatusCode, raw, err)
		}
	}
	return resp.StatusCode, resp.Header
}

// errBody is the documented error body.
type errBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func decodeJSON(t *testing.T, resp *http.Response, out any) {
	t.Helper()
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatalf("%d %q is not JSON: %v", resp.StatusCode, raw, err)
	}
}

func storeParams(tenantID, id string) store.GetTaskParams {
	return store.GetTaskParams{TenantID: tenantID, ID: uuid.MustParse(id)}
}

func pgConnect(ctx context.Context) (*pgxpool.Pool, error) {
	return pgxpool.New(ctx, testenv.DatabaseURL())
}
