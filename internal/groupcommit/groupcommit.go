// Package groupcommit runs the work of concurrent calls together: each call adds its
// item and waits; a waiting call flushes every item pending, so a batch is as large as
// what arrived while the previous flush ran. Nothing waits on a timer: a call that
// finds a flush free flushes its own item at once.
//
// It is the one batching mechanism of the task path: the workers' task ends share one
// Postgres transaction through it, the Redis calls of concurrent callers one pipeline
// (redisx.Batch), and concurrent admissions of a shard one script call (quotas).
package groupcommit

import "sync"

// Group batches the items of concurrent Do calls into calls of Flush. The zero value
// is not usable: set Flush.
type Group[T any] struct {
	// Flush does the work of a batch in the goroutine of one of the batch's Do calls.
	// It reports each item's outcome through the item itself.
	Flush func(batch []T)
	// MaxBatch bounds a batch; 0 means 64.
	MaxBatch int
	// Flushers bounds the flushes that run at once; 0 means 1. With more than one, a
	// batch is built and its answers read in Go while another one is out, which pays
	// where that work is a large part of a flush. Batches in flight together have no
	// order between them.
	Flushers int

	mu       sync.Mutex
	pending  []*waiter[T]
	flushing int // flushes running, or handed to a waiting call
}

type waiter[T any] struct {
	item T
	// wake gets one message: the batch this call flushes, or nil once the item's
	// batch was flushed by another call. One buffered channel, not two, for both:
	// a call is handed a batch or told it is done, never both.
	wake chan []*waiter[T]
}

// Do adds item to the next batch and returns once a Flush of that batch returned.
func (g *Group[T]) Do(item T) {
	w := &waiter[T]{item: item, wake: make(chan []*waiter[T], 1)}
	g.mu.Lock()
	g.pending = append(g.pending, w)
	var batch []*waiter[T]
	if g.flushing < max(g.Flushers, 1) {
		// A flush is free, so nothing was pending before this call: it goes at once.
		g.flushing++
		batch = g.take()
		g.mu.Unlock()
	} else {
		g.mu.Unlock()
		if batch = <-w.wake; batch == nil {
			return
		}
	}
	g.flush(batch)
}

// take removes the next batch from pending, the oldest items first. g.mu is held.
func (g *Group[T]) take() []*waiter[T] {
	limit := g.MaxBatch
	if limit <= 0 {
		limit = 64
	}
	n := min(len(g.pending), limit)
	batch := make([]*waiter[T], n)
	copy(batch, g.pending)
	g.pending = append(g.pending[:0], g.pending[n:]...)
	return batch
}

// flush runs Flush on batch, then hands the next batch, if any is pending, to its
// oldest call.
func (g *Group[T]) flush(batch []*waiter[T]) {
	defer func() {
		// Even if Flush panicked: the batch's callers return and the next one leads.
		for _, b := range batch {
			b.wake <- nil // buffered and empty: the flushing call took its batch, the others wait
		}
		g.mu.Lock()
		if len(g.pending) > 0 {
			next := g.take()
			next[0].wake <- next // buffered, and each call is handed at most one batch
		} else {
			g.flushing--
		}
		g.mu.Unlock()
	}()
	items := make([]T, len(batch))
	for i, b := range batch {
		items[i] = b.item
	}
	g.Flush(items)
}
