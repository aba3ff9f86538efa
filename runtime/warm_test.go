package runtime

import (
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestWarmGoroutinesAreReused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newWarmGoroutines(time.Second)
		ran := 0
		for range 5 {
			g.Run(func() { ran++ })
			synctest.Wait() // the goroutine is idle again, waiting for work
		}
		if ran != 5 || g.begun.Load() != 1 {
			t.Fatalf("5 calls one after the other: ran %d, on %d goroutines; want 5 on 1", ran, g.begun.Load())
		}
		// Calls at the same time each get a goroutine; they are reused afterwards.
		var wg sync.WaitGroup
		hold := make(chan struct{})
		for range 3 {
			wg.Go(func() { g.Run(func() { <-hold }) })
		}
		synctest.Wait()
		close(hold)
		wg.Wait()
		synctest.Wait()
		if n := g.begun.Load(); n != 3 {
			t.Fatalf("3 calls at once: %d goroutines begun in all, want 3", n)
		}
		done := make(chan struct{})
		g.Go(func() { close(done) })
		<-done
		if n := g.begun.Load(); n != 3 {
			t.Errorf("a call after them began a goroutine (%d in all)", n)
		}
		time.Sleep(time.Second) // they idle out
	})
}

func TestWarmGoroutinesEndWhenIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newWarmGoroutines(time.Second)
		g.Run(func() {})
		time.Sleep(999 * time.Millisecond)
		synctest.Wait()
		g.Run(func() {}) // still there
		if n := g.begun.Load(); n != 1 {
			t.Fatalf("%d goroutines begun before the idle time passed, want 1", n)
		}
		time.Sleep(time.Second)
		synctest.Wait() // synctest.Test fails if a goroutine outlives the bubble
		g.Run(func() {})
		if n := g.begun.Load(); n != 2 {
			t.Fatalf("%d goroutines begun after the first idled out, want 2", n)
		}
		time.Sleep(time.Second)
	})
}

func TestWarmGoroutinesRaisePanicsInTheCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newWarmGoroutines(time.Second)
		var got any
		func() {
			defer func() { got = recover() }()
			g.Run(func() { panic("boom") })
		}()
		if s, _ := got.(string); !strings.Contains(s, "boom") {
			t.Fatalf("recovered %v, want the panic's value", got)
		}
		// The goroutine that panicked is still there for the next call.
		ran := false
		g.Run(func() { ran = true })
		if !ran || g.begun.Load() != 1 {
			t.Errorf("after a panic: ran %v on %d goroutines", ran, g.begun.Load())
		}
		time.Sleep(time.Second)
	})
}
