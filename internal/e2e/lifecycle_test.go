package e2e_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/agentq/agentq"
)

// A process whose API cannot listen fails to start and stops what it had started: its
// worker withdraws its capacity and its API replica its registration, so the running
// process is not left sharing limits and work with one that never served.
func TestFailedStartStopsWhatStarted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up := e.start(t)
	ctx := context.Background()
	count := func() (workers, replicas int64) {
		return e.rdb.ZCard(ctx, e.keys.Workers()).Val(), e.rdb.ZCard(ctx, e.keys.APIReplicas()).Val()
	}
	deadline := time.Now().Add(5 * time.Second)
	for w, r := count(); w != 1 || r != 1; w, r = count() {
		if time.Now().After(deadline) {
			t.Fatalf("the running process: %d workers, %d API replicas registered", w, r)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cfg := agentq.DefaultConfig()
	cfg.HTTPAddr = up.app.Addr().String() // taken
	cfg.AdminToken, cfg.RedisPrefix, cfg.ShutdownTimeout = e.admin, e.keys.Prefix(), time.Second
	app, err := agentq.New(ctx, agentq.Options{Config: cfg, Redis: e.rdb, Pool: e.pool, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = app.Shutdown(ctx) })
	if err := app.Start(ctx); err == nil {
		t.Fatal("a second process started on an address in use")
	}
	if w, r := count(); w != 1 || r != 1 {
		t.Fatalf("after the failed start: %d workers, %d API replicas registered; want the running process's only", w, r)
	}
}
