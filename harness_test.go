package agentq_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/internal/testenv"
)

// harness is one agentq process on the test's own Postgres schema and Redis prefix,
// served on a random port, for the tests that hold the library to the HTTP API. The
// end-to-end suite (internal/e2e) has the fuller one.
type harness struct {
	t     *testing.T
	app   *agentq.App
	base  string
	admin string
}

// start runs one agentq process, all roles unless tweaked, and stops it at the end.
func start(t *testing.T, tweak ...func(*agentq.Options)) *harness {
	t.Helper()
	rdb, keys := testenv.Redis(t, 1)
	cfg := agentq.DefaultConfig()
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.AdminToken = "admin-" + testenv.ID()
	cfg.RedisPrefix = keys.Prefix()
	cfg.WorkerConcurrency = 8
	cfg.ShutdownTimeout = 5 * time.Second
	cfg.RedisTimeout = 2 * time.Second // the race detector and parallel tests are slow
	o := agentq.Options{Config: cfg, Redis: rdb, Pool: testenv.Postgres(t),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, f := range tweak {
		f(&o)
	}
	ctx := context.Background()
	app, err := agentq.New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := app.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	h := &harness{t: t, app: app, admin: o.Config.AdminToken}
	if app.Addr() != nil {
		h.base = "http://" + app.Addr().String()
	}
	return h
}

// do sends a request, the body a string or a value to encode as JSON, and decodes a
// JSON answer into out (if not nil).
func (h *harness) do(method, path, token string, body any, out any) (int, http.Header) {
	h.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = bytes.NewReader([]byte(b))
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

// setupTenant creates a tenant through the admin API and returns a key for it.
func (h *harness) setupTenant(id, plan string, scopes any) string {
	h.t.Helper()
	var tenant map[string]any
	if st, _ := h.do("POST", "/v1/admin/tenants", h.admin, map[string]any{"id": id, "name": id, "plan": plan}, &tenant); st != 201 {
		h.t.Fatalf("create tenant %s: %d %v", id, st, tenant)
	}
	var key struct{ Kid, Key string }
	if st, _ := h.do("POST", "/v1/admin/tenants/"+id+"/keys", h.admin, map[string]any{"scopes": scopes}, &key); st != 201 || key.Key == "" {
		h.t.Fatalf("create key for %s: %d", id, st)
	}
	return key.Key
}

// errBody is the documented error body.
type errBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}
