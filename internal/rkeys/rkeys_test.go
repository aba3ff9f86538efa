package rkeys_test

import (
	"context"
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/agentq/agentq/internal/testenv"
)

// AsynqKeyPrefix must cover the keys asynq really writes for a deployment's queue,
// or tests and benchmarks leave them behind.
func TestAsynqKeyPrefixCoversAsynqQueueKeys(t *testing.T) {
	rdb, keys := testenv.Redis(t, 1)
	ctx := context.Background()
	queue := keys.AsynqQueue("default")
	t.Cleanup(func() { rdb.SRem(context.Background(), "asynq:queues", queue) }) // asynq's global set of queue names
	cl := asynq.NewClientFromRedisClient(rdb)
	if _, err := cl.EnqueueContext(ctx, asynq.NewTask("probe", nil), asynq.Queue(queue), asynq.TaskID("probe1")); err != nil {
		t.Fatal(err)
	}
	var found []string
	iter := rdb.Scan(ctx, 0, "asynq:*"+keys.Prefix()+"*", 1000).Iterator()
	for iter.Next(ctx) {
		found = append(found, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 {
		t.Fatal("asynq wrote no key naming the queue: the probe measured nothing")
	}
	for _, k := range found {
		if !strings.HasPrefix(k, keys.AsynqKeyPrefix()) {
			t.Errorf("asynq key %q of queue %q is not under AsynqKeyPrefix %q", k, queue, keys.AsynqKeyPrefix())
		}
	}
}
