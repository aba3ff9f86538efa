// Package benchutil runs closed-loop load against a function and summarises it; the
// `agentq bench` scenarios share it.
package benchutil

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Result of one load run.
type Result struct {
	Ops      int64
	Errors   int64
	Elapsed  time.Duration
	PerSec   float64
	P50, P99 time.Duration
}

// Run calls op from concurrency goroutines for d and measures throughput and latency.
// op gets the worker index and a per-worker sequence number.
func Run(ctx context.Context, concurrency int, d time.Duration, op func(ctx context.Context, worker int, seq int64) error) Result {
	var ops, errs atomic.Int64
	lat := make([][]time.Duration, concurrency)
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range concurrency {
		wg.Go(func() {
			var seq int64
			for ctx.Err() == nil {
				t0 := time.Now()
				err := op(ctx, w, seq)
				if ctx.Err() != nil {
					return
				}
				seq++
				if err != nil {
					errs.Add(1)
					continue
				}
				ops.Add(1)
				if seq%4 == 0 { // a sample bounds memory on long runs
					lat[w] = append(lat[w], time.Since(t0))
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	r := Result{Ops: ops.Load(), Errors: errs.Load(), Elapsed: el, PerSec: float64(ops.Load()) / el.Seconds()}
	if len(all) > 0 {
		r.P50 = all[len(all)*50/100]
		r.P99 = all[min(len(all)-1, len(all)*99/100)]
	}
	return r
}
