package redisx

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/groupcommit"
)

// Batch sends the Redis calls of concurrent goroutines in shared pipelines: one flush
// at a time sends everything that arrived while the previous one ran, so N callers at
// once cost one round trip instead of N (group commit, as internal/groupcommit does
// for Postgres). Nothing waits on a timer: a call that finds no flush running is sent
// at once.
//
// It is for the calls on the task path that nothing else waits on in between: a
// finished task's settlement, lease release, progress message and slot release go
// together, and with the other workers' ends of the same moment.
//
// Commands keep their own results and errors. A script the server no longer knows
// (NOSCRIPT, after a Redis restart) is loaded and its command sent again; nothing else
// of the batch is repeated.
type Batch struct {
	rdb redis.UniversalClient
	g   groupcommit.Group[*batchItem]
	// Timeout bounds a flush whose callers set no deadline.
	timeout time.Duration

	bg      sync.WaitGroup
	closeMu sync.RWMutex
	closed  bool
}

type batchItem struct {
	ctx      context.Context
	queue    func(redis.Pipeliner)
	along    *Along // commands that ride ahead of queue's (WithAlong), or nil
	from, to int    // its commands' range in the pipeline, along's first
	own      int    // where queue's own commands start
	cmds     []redis.Cmder
	err      error // the pipeline's own failure (connection), not a command's
}

// Along is a set of commands that go out in the round trip of another call: the next
// Batch.Do made under the context WithAlong returned sends them first in its
// pipeline. Their outcome is the Along's (Send), not that call's, so a domain call
// that carries them answers for its own commands only.
type Along struct {
	queue []func(redis.Pipeliner)
	taken atomic.Bool
	cmds  []redis.Cmder
	err   error
}

type alongKey struct{}

// WithAlong returns ctx carrying queue to the next Batch.Do made under it (or under a
// context derived from it), and the Along to read their outcome from. It is how a
// caller has its own commands share the round trip of a domain call it makes next
// (a task's "running" message its first step reservation, a finished task's
// settlement and messages its slot release) without that call's API knowing of
// pipelines. With nothing to queue it returns ctx and nil.
func WithAlong(ctx context.Context, queue ...func(redis.Pipeliner)) (context.Context, *Along) {
	if len(queue) == 0 {
		return ctx, nil
	}
	a := &Along{queue: queue}
	return context.WithValue(ctx, alongKey{}, a), a
}

// takeAlong returns the Along ctx carries if no call took it yet.
func takeAlong(ctx context.Context) *Along {
	a, _ := ctx.Value(alongKey{}).(*Along)
	if a == nil || !a.taken.CompareAndSwap(false, true) {
		return nil
	}
	return a
}

// Send returns the first error of a's commands (redis.Nil aside) once they went out.
// If no Batch.Do carried them, which happens only when the call made under its
// context sent nothing through a Batch, it sends them on b now. Call it after that
// call returned; a nil Along sends nothing.
func (a *Along) Send(ctx context.Context, b *Batch) error {
	if a == nil {
		return nil
	}
	if a.taken.CompareAndSwap(false, true) {
		return b.Do(context.WithValue(ctx, alongKey{}, (*Along)(nil)), func(pipe redis.Pipeliner) {
			for _, q := range a.queue {
				q(pipe)
			}
		})
	}
	return firstErr(a.err, a.cmds)
}

// NewBatch returns a Batch on rdb. timeout bounds the calls of Go, and a flush whose
// callers set no deadline (0: 5 s). A flush runs until the latest of its callers'
// deadlines, so callers that share a Batch should want their answers within about
// the same time: the API's request slots have a Batch of their own.
func NewBatch(rdb redis.UniversalClient, timeout time.Duration) *Batch {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	b := &Batch{rdb: rdb, timeout: timeout}
	b.g = groupcommit.Group[*batchItem]{Flush: b.flush, MaxBatch: 128}
	return b
}

// Do queues the commands queue adds to the pipe it is given, and returns once they
// were sent and answered: their results are then in the commands queue created. The
// error is the first failed command's of this call (redis.Nil aside). Scripts queued
// must have been made with NewScript, so that they can be loaded again if Redis lost
// them.
func (b *Batch) Do(ctx context.Context, queue func(pipe redis.Pipeliner)) error {
	it := &batchItem{ctx: ctx, queue: queue, along: takeAlong(ctx)}
	b.g.Do(it)
	if it.along != nil && len(it.cmds) >= it.own-it.from {
		it.along.err = it.err
		it.along.cmds = it.cmds[:it.own-it.from]
		it.cmds = it.cmds[it.own-it.from:]
	}
	return firstErr(it.err, it.cmds)
}

// firstErr is err, else the first failed command's error (redis.Nil aside).
func firstErr(err error, cmds []redis.Cmder) error {
	if err != nil {
		return err
	}
	for _, c := range cmds {
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
	}
	return nil
}

// Go is Do without waiting, for calls whose outcome nobody reads (a progress message,
// a request slot's release): it runs in a goroutine the Batch owns; Close waits for
// it. done, if not nil, gets the outcome. After Close, Go does nothing.
func (b *Batch) Go(ctx context.Context, queue func(pipe redis.Pipeliner), done func(error)) {
	b.closeMu.RLock()
	defer b.closeMu.RUnlock()
	if b.closed {
		return
	}
	// Not the caller's Along: it rides with the caller's own next call.
	ctx = context.WithValue(context.WithoutCancel(ctx), alongKey{}, (*Along)(nil))
	b.bg.Go(func() {
		cctx, cancel := context.WithTimeout(ctx, b.timeout)
		defer cancel()
		err := b.Do(cctx, queue)
		if done != nil {
			done(err)
		}
	})
}

// Close waits for the calls started by Go; later calls of Go do nothing.
func (b *Batch) Close() {
	b.closeMu.Lock()
	b.closed = true
	b.closeMu.Unlock()
	b.bg.Wait()
}

func (b *Batch) flush(items []*batchItem) {
	// The batch goes out under its first call's values, without its cancel (one
	// caller going away must not fail the others), until the latest deadline.
	ctx := context.WithoutCancel(items[0].ctx)
	var latest time.Time
	for _, it := range items {
		d, ok := it.ctx.Deadline()
		if !ok {
			latest = time.Time{}
			break
		}
		if d.After(latest) {
			latest = d
		}
	}
	var cancel context.CancelFunc
	if latest.IsZero() {
		ctx, cancel = context.WithTimeout(ctx, b.timeout)
	} else {
		ctx, cancel = context.WithDeadline(ctx, latest)
	}
	defer cancel()

	pipe := b.rdb.Pipeline()
	for _, it := range items {
		it.from = pipe.Len()
		if it.along != nil {
			for _, q := range it.along.queue {
				q(pipe)
			}
		}
		it.own = pipe.Len()
		it.queue(pipe)
		it.to = pipe.Len()
	}
	if pipe.Len() == 0 {
		return
	}
	cmds, err := pipe.Exec(ctx) // every queued command, answered or failed
	for _, it := range items {
		it.cmds = cmds[it.from:it.to]
	}
	if err != nil && !onlyCommandErrors(cmds) {
		for _, it := range items {
			it.err = err
		}
		return
	}
	b.retryNoScript(ctx, items)
}

// onlyCommandErrors tells a pipeline whose every command was answered (some with
// errors of their own) from one that failed as a whole.
func onlyCommandErrors(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) && !isReplyError(err) {
			return false
		}
	}
	return true
}

func isReplyError(err error) bool {
	var re redis.Error
	ok := errors.As(err, &re)
	return ok && !redis.HasErrorPrefix(err, "LOADING") && !redis.HasErrorPrefix(err, "READONLY")
}

// scripts are the scripts made with NewScript, by hash.
var scripts sync.Map

// NewScript is redis.NewScript for a script that may be sent through a Batch: the
// Batch finds it by its hash to load it again when Redis lost it (a restart).
func NewScript(src string) *redis.Script {
	s := redis.NewScript(src)
	scripts.Store(s.Hash(), s)
	return s
}

// retryNoScript loads the scripts of the commands Redis did not know and sends those
// commands again; a command whose script is not known here keeps its error.
func (b *Batch) retryNoScript(ctx context.Context, items []*batchItem) {
	var again []redis.Cmder
	load := map[string]*redis.Script{}
	for _, it := range items {
		for _, c := range it.cmds {
			if !redis.HasErrorPrefix(c.Err(), "NOSCRIPT") || len(c.Args()) < 2 {
				continue
			}
			sha, _ := c.Args()[1].(string)
			if v, ok := scripts.Load(sha); ok {
				load[sha] = v.(*redis.Script)
				again = append(again, c)
			}
		}
	}
	if len(again) == 0 {
		return
	}
	for _, s := range load {
		if err := s.Load(ctx, b.rdb).Err(); err != nil {
			return // the commands keep their NOSCRIPT errors
		}
	}
	pipe := b.rdb.Pipeline()
	for _, c := range again {
		_ = pipe.Process(ctx, c)
	}
	_, _ = pipe.Exec(ctx)
}
