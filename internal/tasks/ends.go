package tasks

import (
	"context"
	"log/slog"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/wire"
)

// LeaseReleaser releases a task's session leases, queued on pipe (quotas.Quotas.Release).
type LeaseReleaser interface {
	Release(ctx context.Context, pipe redis.Pipeliner, tenantID, taskID string) (int, error)
}

// QueueRemover takes a queued task off its tenant's queue or out of the parked set
// (scheduler.Scheduler.Remove).
type QueueRemover interface {
	Remove(ctx context.Context, tenantID string, taskID uuid.UUID) (bool, error)
}

// EndsDeps are what a task's end frees and tells.
type EndsDeps struct {
	// Leases releases the ended task's session lease. Required.
	Leases LeaseReleaser
	// Queue takes a task that ended while queued off its queue; nil: dispatch skips
	// a task no longer queued.
	Queue QueueRemover
	// Pools drops the place in a model pool's line of a task that ended while it
	// waited for the pool; nil: the place lapses on its own.
	Pools PoolPlaces
	// Redis carries the calls; Batch, when set, shares their round trip with the
	// other calls of the moment (the worker's).
	Redis redis.UniversalClient
	Batch *redisx.Batch
	// Keys name the progress stream's channel and the cancel channel.
	Keys rkeys.Keys
	Log  *slog.Logger
}

// Ends is what follows every end of a task once it committed, whoever ended it (its
// worker, a cancel, the start-deadline pass, a start past the deadline, the pause
// watcher, the janitor): its session lease goes back, a task that ended while queued
// leaves its queue and its place in a model pool's line, its progress stream hears
// of the end (wire.StateProgress, with the reason and output it ended with), and a
// cancel tells the worker running the task to stop. It is a lifecycle Subscriber
// that writes nothing in the transaction: the lifecycle tells it of each committed
// change and it acts on the ends.
//
// A failure only logs: the lease pass releases the lease of an ended task, dispatch
// skips a task no longer queued, a pool place lapses, a lost message is re-read from
// Postgres by the stream, and a worker not told of a cancel stops at the end of its
// step, when its write finds the task ended.
type Ends struct {
	d EndsDeps
}

// NewEnds returns the end effects over d.
func NewEnds(d EndsDeps) *Ends {
	if d.Log == nil {
		d.Log = slog.Default()
	}
	return &Ends{d: d}
}

// Writes: an end's effects write nothing in its transaction.
func (e *Ends) Writes(ChangeKind) bool { return false }

// InTx does nothing: see Writes.
func (e *Ends) InTx(context.Context, *store.Store, Change) error { return nil }

// AfterCommit runs the effects of c when it ended a task. Under a context from
// CarryEnd, the Redis calls of the end are handed to the carrier instead of sent.
func (e *Ends) AfterCommit(ctx context.Context, c Change) {
	if !c.Ends() {
		return
	}
	t := c.Task
	if e.d.Queue != nil && (c.From == agentqtype.TaskStateQueued || c.Kind == ChangeCancelled) {
		if _, err := e.d.Queue.Remove(ctx, t.TenantID, t.ID); err != nil {
			e.d.Log.Warn("removing an ended task from its queue failed; dispatch skips it", "task_id", t.ID, "err", err)
		}
	}
	e.leavePool(ctx, t)
	calls := e.calls(c)
	if carrier, _ := ctx.Value(carryKey{}).(*CarriedEnd); carrier != nil {
		carrier.calls = append(carrier.calls, calls...)
		return
	}
	queue := func(pipe redis.Pipeliner) {
		for _, q := range calls {
			q(pipe)
		}
	}
	var err error
	if e.d.Batch != nil {
		err = e.d.Batch.Do(ctx, queue)
	} else {
		_, err = e.d.Redis.Pipelined(ctx, func(pipe redis.Pipeliner) error { queue(pipe); return nil })
	}
	if err != nil {
		e.d.Log.Warn("releasing an ended task's lease or telling of its end failed; the lease pass releases it",
			"task_id", t.ID, "state", t.State, "err", err)
	}
}

// calls are the Redis calls of c's end: the lease release, the state message, and
// for a cancel the cancel broadcast.
func (e *Ends) calls(c Change) []func(redis.Pipeliner) {
	t := c.Task
	id := t.ID.String()
	msg := wire.StateProgress(id, string(t.State), endReason(t))
	msg.Output = t.Output
	body := msg.Encode()
	calls := []func(redis.Pipeliner){
		func(pipe redis.Pipeliner) { _, _ = e.d.Leases.Release(context.Background(), pipe, t.TenantID, id) },
		func(pipe redis.Pipeliner) { pipe.Publish(context.Background(), e.d.Keys.TaskEvents(id), body) },
	}
	if c.Kind == ChangeCancelled {
		// Running: interrupt the step wherever it runs.
		calls = append(calls, func(pipe redis.Pipeliner) { pipe.Publish(context.Background(), e.d.Keys.CancelChannel(), id) })
	}
	return calls
}

// endReason is the reason t ended with, "" for none.
func endReason(t store.Task) string {
	if t.Error == nil {
		return ""
	}
	return *t.Error
}

// leavePool drops the place in its pool's line of a task that ended while it waited
// for the pool: the tenants behind it need not wait for the place to lapse.
func (e *Ends) leavePool(ctx context.Context, t store.Task) {
	if e.d.Pools == nil || t.Wait.Reason == nil || t.Wait.Until == nil {
		return
	}
	pool, ok := agentqtype.WaitReason(*t.Wait.Reason).Pool()
	if !ok {
		return
	}
	if _, err := e.d.Pools.LeavePool(ctx, pool, t.TenantID, *t.Wait.Until); err != nil {
		e.d.Log.Warn("dropping an ended task's place in its pool's line failed; it lapses on its own", "task_id", t.ID, "pool", pool, "err", err)
	}
}

type carryKey struct{}

// CarriedEnd holds the Redis calls of a task's end made under a context from
// CarryEnd, for the caller to send in a round trip of its own.
type CarriedEnd struct {
	calls []func(redis.Pipeliner)
}

// CarryEnd returns ctx under which the Redis calls of a task's end (Ends) are handed
// to the returned carrier instead of sent: the worker sends them with its slot
// release, in one round trip. The rest of the end's effects run as always.
func CarryEnd(ctx context.Context) (context.Context, *CarriedEnd) {
	c := &CarriedEnd{}
	return context.WithValue(ctx, carryKey{}, c), c
}

// Calls are the calls carried so far, in order.
func (c *CarriedEnd) Calls() []func(redis.Pipeliner) { return c.calls }
