package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"

	"github.com/agentq/agentq/internal/wire"
)

// The dispatcher writes a task into asynq's queue exactly as asynq's client does: the
// same message under the same keys, which asynq's tools and servers read as their own;
// a second write of the id is refused as asynq's client refuses it.
func TestAsynqWriterWritesWhatAsynqsClientWrites(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100, 0)
	ctx := context.Background()
	queue := f.keys.TaskQueue()
	t.Cleanup(func() { f.rdb.SRem(context.Background(), asynqAllQueues, queue) })
	d := Dispatched{TaskID: uuid.NewString(), TenantID: "acme", Priority: 7, EstimateMs: 120, Gen: 2,
		TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	key := "asynq:{" + queue + "}:t:" + d.asynqID()
	task, err := NewAsynqTask(f.keys, d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := asynq.NewClientFromRedisClient(f.rdb).EnqueueContext(ctx, task); err != nil {
		t.Fatal(err)
	}
	theirs := f.rdb.HGet(ctx, key, "msg").Val()
	insp := asynq.NewInspectorFromRedisClient(f.rdb)
	if err := insp.DeleteTask(queue, d.asynqID()); err != nil {
		t.Fatal(err)
	}
	f.rdb.SRem(ctx, asynqAllQueues, queue)

	w := &asynqWriter{s: f.s}
	if errs := w.enqueue(ctx, []Dispatched{d}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if ours := f.rdb.HGet(ctx, key, "msg").Val(); ours != theirs {
		t.Fatalf("message written %x, asynq's client writes %x", ours, theirs)
	}
	if !f.rdb.SIsMember(ctx, asynqAllQueues, queue).Val() {
		t.Fatal("the task queue is not in asynq's set of queues")
	}
	info, err := insp.GetTaskInfo(queue, d.asynqID())
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		TaskID string `json:"task_id"`
	}
	if err := json.Unmarshal(info.Payload, &p); err != nil || p.TaskID != d.TaskID || info.State != asynq.TaskStatePending ||
		info.MaxRetry != asynqMaxRetry || info.Timeout != asynqTimeout {
		t.Fatalf("asynq reads %+v (payload task %q, %v)", info, p.TaskID, err)
	}
	if errs := w.enqueue(ctx, []Dispatched{d}); !errors.Is(errs[0], asynq.ErrTaskIDConflict) {
		t.Fatalf("a second write of the id: %v, want asynq's conflict", errs[0])
	}
	if n := f.rdb.LLen(ctx, "asynq:{"+queue+"}:pending").Val(); n != 1 {
		t.Fatalf("pending holds %d, want 1", n)
	}
}

// An archived message left under a task's id (an earlier attempt's) would block the
// task for good: the dispatcher deletes it and sends the task; a pending one it leaves,
// and the task counts as sent.
func TestDispatcherReplacesAnArchivedLeftover(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100, 0)
	ctx := context.Background()
	queue := f.keys.TaskQueue()
	t.Cleanup(func() { f.rdb.SRem(context.Background(), asynqAllQueues, queue) })
	cl := asynq.NewClientFromRedisClient(f.rdb)
	insp := asynq.NewInspectorFromRedisClient(f.rdb)
	archived, pending := f.enqueue("a", 5, 1, 0).String(), f.enqueue("b", 5, 1, 0).String()
	for _, id := range []string{archived, pending} {
		if _, err := cl.EnqueueContext(ctx, asynq.NewTask("leftover", nil), asynq.Queue(queue), asynq.TaskID(id)); err != nil {
			t.Fatal(err)
		}
	}
	if err := insp.ArchiveTask(queue, archived); err != nil {
		t.Fatal(err)
	}
	d := NewDispatcher(f.s, f.rdb, cl, DispatcherOptions{})
	if n, err := d.RunOnce(ctx); err != nil || n != 2 {
		t.Fatalf("RunOnce = %d, %v; want 2 sent", n, err)
	}
	for id, want := range map[string]string{archived: wire.TaskType, pending: "leftover"} {
		info, err := insp.GetTaskInfo(queue, id)
		if err != nil || info.State != asynq.TaskStatePending || info.Type != want {
			t.Fatalf("task %s: %+v, %v; want a pending %s message", id, info, err, want)
		}
	}
	if n := f.rdb.ZCard(ctx, f.keys.Inflight(0)).Val(); n != 2 {
		t.Fatalf("inflight holds %d, want both tasks confirmed", n)
	}
}

// A task of a tenant with nothing running goes to the head of asynq's pending list,
// ahead of the tasks the prefetch already holds for tenants with work in progress;
// those keep their order behind it.
func TestIdleTenantsTaskGoesAheadOfThePrefetch(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2, 2)
	ctx := context.Background()
	queue := f.keys.TaskQueue()
	t.Cleanup(func() { f.rdb.SRem(context.Background(), asynqAllQueues, queue) })
	d := NewDispatcher(f.s, f.rdb, asynq.NewClientFromRedisClient(f.rdb), DispatcherOptions{})
	heavy := []string{f.enqueue("heavy", 5, 1, 0).String(), f.enqueue("heavy", 5, 1, 0).String(), f.enqueue("heavy", 5, 1, 0).String()}
	if _, err := d.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	light := f.enqueue("light", 5, 1, 0).String()
	if _, err := d.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	// asynq's workers pop from the right end.
	got := f.rdb.LRange(ctx, "asynq:{"+queue+"}:pending", 0, -1).Val()
	slices.Reverse(got)
	// The heavy tenant's first task went ahead too: nothing of it ran then.
	want := []string{light, heavy[0], heavy[1], heavy[2]}
	if !slices.Equal(got, want) {
		t.Fatalf("asynq pops %v, want %v", got, want)
	}
}
