package admission

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Breaker thresholds. One failure never opens the breaker: it takes tripAfter in a row,
// or a failure rate of at least half over the last rateWindow with rateMinCalls calls
// at least (a flaky Redis that answers every other call). Either way the failures must
// last: from the first of them to the one that trips, at least the admission timeout
// passed. Admissions in flight together fail together when Redis stalls for a moment
// (coalesced, they share one round trip): that is one failure, however many callers
// saw it, and it must not refuse every submission of the cool-down.
const (
	tripAfter    = 3
	rateMinCalls = 10
	rateWindow   = 5 // seconds, one bucket each
)

// breaker decides whether a call goes to Redis. Closed (openUntil 0): every call does.
// Open: none until openUntil. Then half-open: one call at a time probes Redis; its
// success closes the breaker, its failure opens it for another cool-down.
type breaker struct {
	cooldown time.Duration
	lasting  time.Duration // how long failures must go on to trip it
	log      *slog.Logger

	openUntil atomic.Int64 // unix ms; 0 when closed
	probing   atomic.Bool  // a half-open probe is out

	mu          sync.Mutex
	consecutive int
	streakFrom  time.Time // the first failure of the consecutive ones
	win         [rateWindow]struct{ sec, calls, fails, firstFailMs int64 }
}

// allow says whether a call may go to Redis, and whether it is the half-open probe
// (then its outcome must be recorded or abandoned).
func (b *breaker) allow() (try, probe bool) {
	until := b.openUntil.Load()
	if until == 0 {
		return true, false
	}
	if time.Now().UnixMilli() < until {
		return false, false
	}
	if b.probing.CompareAndSwap(false, true) {
		return true, true
	}
	return false, false
}

// record books a call's outcome.
func (b *breaker) record(ok, probe bool) {
	if probe {
		if ok {
			b.close()
		} else {
			b.open("the probe after the cool-down failed")
		}
		b.probing.Store(false)
		return
	}
	now := time.Now()
	sec := now.Unix()
	b.mu.Lock()
	w := &b.win[sec%rateWindow]
	if w.sec != sec {
		w.sec, w.calls, w.fails, w.firstFailMs = sec, 0, 0, 0
	}
	w.calls++
	if ok {
		b.consecutive = 0
		b.mu.Unlock()
		return
	}
	if w.fails == 0 {
		w.firstFailMs = now.UnixMilli()
	}
	w.fails++
	if b.consecutive == 0 {
		b.streakFrom = now
	}
	b.consecutive++
	var calls, fails int64
	firstFailMs := now.UnixMilli()
	for _, bk := range b.win {
		if bk.sec > sec-rateWindow {
			calls, fails = calls+bk.calls, fails+bk.fails
			if bk.fails > 0 {
				firstFailMs = min(firstFailMs, bk.firstFailMs)
			}
		}
	}
	lasted := func(from time.Time) bool { return now.Sub(from) >= b.lasting }
	trip := (b.consecutive >= tripAfter && lasted(b.streakFrom)) ||
		(calls >= rateMinCalls && 2*fails >= calls && lasted(time.UnixMilli(firstFailMs)))
	consecutive := b.consecutive
	b.mu.Unlock()
	if trip && b.openUntil.Load() == 0 {
		b.open(fmt.Sprintf("%d consecutive failures, %d of %d calls in %d s", consecutive, fails, calls, rateWindow))
	}
}

// abandon ends a probe whose caller left before Redis answered: the next call probes.
func (b *breaker) abandon(probe bool) {
	if probe {
		b.probing.Store(false)
	}
}

func (b *breaker) open(why string) {
	if b.openUntil.Swap(time.Now().Add(b.cooldown).UnixMilli()) == 0 {
		b.log.Warn("admission store failing: degrading (local rate buckets, quotas fail closed)", "why", why, "cooldown", b.cooldown)
	}
	b.reset()
}

func (b *breaker) close() {
	if b.openUntil.Swap(0) != 0 {
		b.log.Info("admission store answers again: leaving degraded mode")
	}
	b.reset()
}

// reset forgets past outcomes, so a closed breaker starts afresh.
func (b *breaker) reset() {
	b.mu.Lock()
	b.consecutive = 0
	b.win = [rateWindow]struct{ sec, calls, fails, firstFailMs int64 }{}
	b.mu.Unlock()
}
