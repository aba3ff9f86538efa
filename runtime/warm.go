package runtime

import (
	"sync/atomic"
	"time"
)

// warmGoroutines runs functions on goroutines that outlive them. A task's delivery
// and its end go deep (pgx, go-redis, the tracer): on a goroutine of its own, begun
// for it, the stack starts small and is copied larger several times on the way down,
// which under load was a fifteenth of the worker's CPU. A goroutine that ran an
// earlier task already has the stack, and takes the next one.
//
// A goroutine waits idle for more work and ends when none came for idle. There are
// never more of them than functions running at once, plus those idling.
type warmGoroutines struct {
	jobs chan func()
	idle time.Duration
	// begun counts the goroutines begun (tests).
	begun atomic.Int64
}

func newWarmGoroutines(idle time.Duration) *warmGoroutines {
	return &warmGoroutines{jobs: make(chan func()), idle: idle}
}

// Go runs f on an idle warm goroutine, or on a new one when none is idle. It does not
// wait for f; f must recover its own panics.
func (g *warmGoroutines) Go(f func()) {
	select {
	case g.jobs <- f:
	default:
		g.begun.Add(1)
		go g.loop(f)
	}
}

// Run runs f on a warm goroutine and waits for it. A panic in f is raised again in
// the caller with the same value, as if f had run there.
func (g *warmGoroutines) Run(f func()) {
	done := make(chan any, 1)
	g.Go(func() {
		defer func() { done <- recover() }()
		f()
	})
	if r := <-done; r != nil {
		panic(r)
	}
}

func (g *warmGoroutines) loop(f func()) {
	t := time.NewTimer(g.idle)
	defer t.Stop()
	for {
		f()
		t.Reset(g.idle)
		select {
		case f = <-g.jobs:
		case <-t.C:
			return
		}
	}
}
