package scheduler

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// Enqueuer is the part of asynq.Client the dispatcher uses.
type Enqueuer interface {
	EnqueueContext(ctx context.Context, task *asynq.Task, opts ...asynq.Option) (*asynq.TaskInfo, error)
}

// Dispatcher is the long-running service that moves tasks from tenant queues into
// asynq. Several may run at once against one Redis.
type Dispatcher struct {
	sched    *Scheduler
	rdb      redis.UniversalClient
	asynq    Enqueuer
	log      *slog.Logger
	fallback time.Duration // timer between dispatch rounds when no wake-up arrives
	resend   time.Duration // age after which a "dispatching" entry is re-sent

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
	kick   chan struct{}
	next   int // round-robin start shard
}

// DispatcherOptions configure a Dispatcher.
type DispatcherOptions struct {
	Logger        *slog.Logger
	FallbackEvery time.Duration // default 1s
	ResendAfter   time.Duration // default 5s
}

// NewDispatcher returns a stopped dispatcher.
func NewDispatcher(sched *Scheduler, rdb redis.UniversalClient, enq Enqueuer, opts DispatcherOptions) *Dispatcher {
	d := &Dispatcher{
		sched: sched, rdb: rdb, asynq: enq, log: opts.Logger,
		fallback: opts.FallbackEvery, resend: opts.ResendAfter,
		kick: make(chan struct{}, 1),
	}
	if d.log == nil {
		d.log = slog.Default()
	}
	if d.fallback <= 0 {
		d.fallback = time.Second
	}
	if d.resend <= 0 {
		d.resend = 5 * time.Second
	}
	return d
}

// Start runs the dispatcher until Stop or ctx ends.
func (d *Dispatcher) Start(ctx context.Context) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cancel != nil {
		return
	}
	ctx, d.cancel = context.WithCancel(ctx)
	d.done = make(chan struct{})
	sub := d.rdb.Subscribe(ctx, d.sched.keys.WakeChannel())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // forwards wake-ups; coalesced by the 1-slot channel
		defer wg.Done()
		ch := sub.Channel()
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-ch:
				if !ok {
					return
				}
				d.Kick()
			}
		}
	}()
	go func() {
		defer wg.Done()
		d.loop(ctx)
	}()
	go func() {
		wg.Wait()
		_ = sub.Close()
		close(d.done)
	}()
}

// Stop ends the dispatcher and waits for it.
func (d *Dispatcher) Stop() {
	d.mu.Lock()
	cancel, done := d.cancel, d.done
	d.cancel = nil
	d.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

// Kick asks for a dispatch round soon (in-process wake-up).
func (d *Dispatcher) Kick() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

func (d *Dispatcher) loop(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-d.kick:
		}
		if _, err := d.RunOnce(ctx); err != nil && ctx.Err() == nil {
			d.log.Warn("dispatch round failed", "err", err)
		}
		t.Reset(d.fallback)
	}
}

// RunOnce re-sends stale "dispatching" entries, then dispatches until every shard is
// empty or out of worker capacity. It returns the number of tasks handed to asynq.
func (d *Dispatcher) RunOnce(ctx context.Context) (int, error) {
	shards := d.sched.keys.Shards()
	if err := d.resendStale(ctx); err != nil {
		return 0, err
	}
	n := 0
	active := make([]bool, shards)
	for i := range active {
		active[i] = true
	}
	left := shards
	for left > 0 {
		shard := d.next % shards
		d.next++
		if !active[shard] {
			continue
		}
		job, err := d.sched.dispatchOne(ctx, shard)
		switch {
		case errors.Is(err, errBusy):
			continue
		case errors.Is(err, errEmpty), errors.Is(err, errNoCapacity):
			active[shard] = false
			left--
			continue
		case err != nil:
			return n, err
		}
		if err := d.send(ctx, job); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

func (d *Dispatcher) send(ctx context.Context, job Dispatched) error {
	task, err := NewAsynqTask(d.sched.keys, job)
	if err != nil {
		return err
	}
	if _, err := d.asynq.EnqueueContext(ctx, task); err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		// Left in "dispatching": resendStale retries it.
		return err
	}
	return d.sched.confirm(ctx, job)
}

func (d *Dispatcher) resendStale(ctx context.Context) error {
	now := time.Now().UnixMilli()
	if d.sched.nowMs != nil {
		now = d.sched.nowMs()
	}
	cutoff := now - d.resend.Milliseconds()
	for shard := range d.sched.keys.Shards() {
		members, err := d.rdb.ZRangeByScore(ctx, d.sched.keys.Dispatching(shard), &redis.ZRangeBy{
			Min: "-inf", Max: itoa(cutoff), Count: 100,
		}).Result()
		if err != nil {
			return err
		}
		for _, m := range members {
			job, err := parseMember(m)
			if err != nil {
				d.rdb.ZRem(ctx, d.sched.keys.Dispatching(shard), m)
				continue
			}
			d.log.Info("re-sending task left in dispatching", "task_id", job.TaskID, "tenant_id", job.TenantID)
			if err := d.send(ctx, job); err != nil {
				return err
			}
		}
	}
	return nil
}
