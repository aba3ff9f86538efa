package groupcommit

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// Calls that arrive while a flush runs are flushed together by the next one; every
// item is flushed exactly once, one flush at a time, and no batch exceeds MaxBatch.
func TestCallsArrivingDuringAFlushShareTheNext(t *testing.T) {
	release := make(chan struct{})
	var running, maxRunning atomic.Int32
	var mu sync.Mutex
	var batches [][]int
	g := &Group[int]{MaxBatch: 5, Flush: func(b []int) {
		if n := running.Add(1); n > maxRunning.Load() {
			maxRunning.Store(n)
		}
		if b[0] == 0 {
			<-release // the first flush holds until the others queued
		}
		mu.Lock()
		batches = append(batches, append([]int(nil), b...))
		mu.Unlock()
		running.Add(-1)
	}}
	var wg sync.WaitGroup
	wg.Go(func() { g.Do(0) })
	for {
		g.mu.Lock()
		busy := g.flushing > 0
		g.mu.Unlock()
		if busy {
			break
		}
		runtime.Gosched()
	}
	for i := 1; i <= 12; i++ {
		wg.Go(func() { g.Do(i) })
	}
	for {
		g.mu.Lock()
		n := len(g.pending)
		g.mu.Unlock()
		if n == 12 {
			break
		}
		runtime.Gosched()
	}
	close(release)
	wg.Wait()
	if maxRunning.Load() != 1 {
		t.Fatalf("%d flushes ran at once, want 1", maxRunning.Load())
	}
	seen := map[int]int{}
	for _, b := range batches {
		if len(b) > 5 {
			t.Fatalf("a batch of %d, above MaxBatch 5", len(b))
		}
		for _, v := range b {
			seen[v]++
		}
	}
	for i := 0; i <= 12; i++ {
		if seen[i] != 1 {
			t.Fatalf("item %d flushed %d times; batches %v", i, seen[i], batches)
		}
	}
	// 1 alone, then the 12 queued behind it in batches of 5, 5 and 2.
	if len(batches) != 4 {
		t.Fatalf("batches %v, want 4: [0] and the 12 waiting ones in three", batches)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.flushing != 0 || len(g.pending) != 0 {
		t.Fatalf("after the last flush: %d flushing, %d pending", g.flushing, len(g.pending))
	}
}

// A Flush that panics still releases its batch and hands the lead on.
func TestPanickingFlushReleasesItsBatch(t *testing.T) {
	var flushed atomic.Int32
	g := &Group[int]{Flush: func(b []int) {
		if b[0] == 0 {
			panic("flush failed")
		}
		flushed.Add(int32(len(b)))
	}}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not reach the leading call")
			}
		}()
		g.Do(0)
	}()
	g.Do(1)
	if flushed.Load() != 1 {
		t.Fatalf("after the panic: %d flushed, want 1", flushed.Load())
	}
}

// With Flushers 2, a call that arrives while one flush runs goes out at once in a
// second one; calls beyond that wait and share the next free flush. No more than two
// run together, and every item is flushed exactly once.
func TestSecondFlusherTakesACallAtOnce(t *testing.T) {
	release := make(chan struct{})
	var running, maxRunning atomic.Int32
	var mu sync.Mutex
	seen := map[int]int{}
	g := &Group[int]{Flushers: 2, MaxBatch: 4, Flush: func(b []int) {
		n := running.Add(1)
		for {
			m := maxRunning.Load()
			if n <= m || maxRunning.CompareAndSwap(m, n) {
				break
			}
		}
		if b[0] == 0 {
			<-release // the first flush holds while the others arrive
		}
		mu.Lock()
		for _, v := range b {
			seen[v]++
		}
		mu.Unlock()
		running.Add(-1)
	}}
	var wg sync.WaitGroup
	wg.Go(func() { g.Do(0) })
	for {
		g.mu.Lock()
		n := g.flushing
		g.mu.Unlock()
		if n == 1 {
			break
		}
		runtime.Gosched()
	}
	g.Do(1) // the second flusher is free: this returns while flush 0 still holds
	for i := 2; i <= 20; i++ {
		wg.Go(func() { g.Do(i) })
	}
	close(release)
	wg.Wait()
	if maxRunning.Load() > 2 {
		t.Fatalf("%d flushes ran at once, want at most 2", maxRunning.Load())
	}
	for i := 0; i <= 20; i++ {
		if seen[i] != 1 {
			t.Fatalf("item %d flushed %d times", i, seen[i])
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.flushing != 0 || len(g.pending) != 0 {
		t.Fatalf("after the last flush: %d flushing, %d pending", g.flushing, len(g.pending))
	}
}
