// Package groupcommit runs the work of concurrent calls together: each call adds its
// item and waits; one of the waiting calls at a time flushes every item pending, so a
// batch is as large as what arrived while the previous flush ran. Nothing waits on a
// timer: a call that finds no flush running flushes its own item at once.
//
// It is how the workers' task ends share one Postgres transaction (one commit, a few
// statements for all of them) instead of one each.
package groupcommit

import "sync"

// Group batches the items of concurrent Do calls into calls of Flush. The zero value
// is not usable: set Flush.
type Group[T any] struct {
	// Flush does the work of a batch, one flush at a time, in the goroutine of one of
	// the batch's Do calls. It reports each item's outcome through the item itself.
	Flush func(batch []T)
	// MaxBatch bounds a batch; 0 means 64.
	MaxBatch int

	mu      sync.Mutex
	pending []*waiter[T]
	busy    bool // a flush runs, or a call was handed the lead
}

type waiter[T any] struct {
	item T
	lead chan struct{} // this call flushes next
	done chan struct{} // the item's batch was flushed
}

// Do adds item to the next batch and returns once a Flush of that batch returned.
func (g *Group[T]) Do(item T) {
	w := &waiter[T]{item: item, lead: make(chan struct{}, 1), done: make(chan struct{})}
	g.mu.Lock()
	g.pending = append(g.pending, w)
	if g.busy {
		g.mu.Unlock()
		select {
		case <-w.done:
			return
		case <-w.lead:
		}
	} else {
		g.busy = true
		g.mu.Unlock()
	}
	// This call leads, and is the oldest pending one: its item is in the batch.
	g.mu.Lock()
	limit := g.MaxBatch
	if limit <= 0 {
		limit = 64
	}
	n := min(len(g.pending), limit)
	batch := make([]*waiter[T], n)
	copy(batch, g.pending)
	g.pending = append(g.pending[:0], g.pending[n:]...)
	g.mu.Unlock()
	defer func() {
		// Even if Flush panicked: the batch's callers return and the next one leads.
		for _, b := range batch {
			close(b.done)
		}
		g.mu.Lock()
		if len(g.pending) > 0 {
			g.pending[0].lead <- struct{}{}
		} else {
			g.busy = false
		}
		g.mu.Unlock()
	}()
	items := make([]T, n)
	for i, b := range batch {
		items[i] = b.item
	}
	g.Flush(items)
}
