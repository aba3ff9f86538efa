package redisx

import (
	"context"
	"errors"
	"sync"
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
// Calls that must share one round trip are queued on one Do's pipe: a call that owns
// the round trip takes the calls riding with it as functions of its pipe
// (scheduler.Done's along), and each riding call takes that pipe as an argument
// (quotas' Release and SettleStep).
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
	from, to int // its commands' range in the pipeline
	cmds     []redis.Cmder
	err      error // the pipeline's own failure (connection), not a command's
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
	it := &batchItem{ctx: ctx, queue: queue}
	b.g.Do(it)
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
	ctx = context.WithoutCancel(ctx)
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
