package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/testenv"
)

// `agentq dev` falls back to an embedded miniredis when no Redis is reachable: the
// whole path (admission scripts, dispatch, asynq, workers) must work on it.
func TestWholePathOnEmbeddedRedis(t *testing.T) {
	t.Parallel()
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mr.Close)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	e := &env{pool: testenv.Postgres(t), rdb: rdb, keys: rkeys.New("aq:", 1), admin: "admin-" + testenv.ID()}
	h := e.start(t, func(o *agentq.Options) { o.Config.RedisTimeout = 2 * time.Second })
	c, _ := h.tenantClient("mini", "pro", nil)
	task, err := c.SubmitTask(context.Background(), sim(3, 10))
	if err != nil {
		t.Fatal(err)
	}
	if got := waitState(t, c, task.ID, "completed", 20*time.Second); got.Usage.Steps != 3 {
		t.Fatalf("on miniredis: %+v", got)
	}
	if u := h.usage(keyOf(t, h, "mini")); u["agent_steps_daily"]["used"] != 3.0 {
		t.Fatalf("usage on miniredis: %v", u["agent_steps_daily"])
	}
}
