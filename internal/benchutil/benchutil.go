// Package benchutil runs closed-loop load against a function and summarises it; the
// `agentq bench` scenarios share it.
package benchutil

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Result of one load run.
type Result struct {
	Ops      int64
	Errors   int64
	Elapsed  time.Duration
	PerSec   float64
	P50, P99 time.Duration
	// RedisCPUPerOp is set by RunInterleaved. Other clients of the same Redis count
	// in it too: measure on a Redis nothing else uses.
	RedisCPUPerOp time.Duration
}

// Op is one operation of a load run; it gets the worker index and a per-worker
// sequence number.
type Op func(ctx context.Context, worker int, seq int64) error

// Run calls op from concurrency goroutines for d and measures throughput and latency.
// op gets the worker index and a per-worker sequence number.
func Run(ctx context.Context, concurrency int, d time.Duration, op Op) Result {
	var t tally
	t.run(ctx, concurrency, d, op)
	return t.result()
}

// tally accumulates load runs of one operation.
type tally struct {
	ops, errs int64
	elapsed   time.Duration
	lat       []time.Duration // a sample: every 4th operation
	next      []int64         // each worker's next sequence number
}

// run loads op for d. Each worker's sequence carries on from the tally's previous
// run, so that runs of one tally spread their keys as one long run would.
func (t *tally) run(ctx context.Context, concurrency int, d time.Duration, op Op) {
	var ops, errs atomic.Int64
	lat := make([][]time.Duration, concurrency)
	if len(t.next) < concurrency {
		t.next = append(t.next, make([]int64, concurrency-len(t.next))...)
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range concurrency {
		wg.Go(func() {
			seq := t.next[w]
			defer func() { t.next[w] = seq }() // read after wg.Wait
			for ctx.Err() == nil {
				t0 := time.Now()
				err := op(ctx, w, seq)
				seq++ // used, even by a call the deadline cut short
				if ctx.Err() != nil {
					return // not counted: it may or may not have happened
				}
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
	t.elapsed += time.Since(start)
	t.ops += ops.Load()
	t.errs += errs.Load()
	for _, l := range lat {
		t.lat = append(t.lat, l...)
	}
}

func (t *tally) result() Result {
	all := slices.Clone(t.lat)
	slices.Sort(all)
	r := Result{Ops: t.ops, Errors: t.errs, Elapsed: t.elapsed}
	if t.elapsed > 0 {
		r.PerSec = float64(t.ops) / t.elapsed.Seconds()
	}
	if len(all) > 0 {
		r.P50 = all[len(all)*50/100]
		r.P99 = all[min(len(all)-1, len(all)*99/100)]
	}
	return r
}

// RedisCPU reads the CPU time Redis's main thread has used (INFO cpu), which is where
// scripts and commands run. The difference over a run, divided by its operations, is
// a figure that does not move with the client's share of the machine.
func RedisCPU(ctx context.Context, rdb redis.UniversalClient) (time.Duration, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys_main_thread" || k == "used_cpu_user_main_thread") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("benchutil: INFO cpu %s: %w", k, err)
			}
			total += f
		}
	}
	return time.Duration(total * float64(time.Second)), nil
}

// RunInterleaved loads each of ops for d in all, in turns: rounds slices of d/rounds
// each, one op after the other. A machine whose speed drifts within seconds (a shared
// host) then slows every op alike, and the ratios of their results hold where back to
// back runs of d each would compare one moment with another. It reports each op's
// totals over its slices, with the Redis main thread's CPU per operation.
func RunInterleaved(ctx context.Context, rdb redis.UniversalClient, concurrency int, d time.Duration, rounds int, ops ...Op) ([]Result, error) {
	rounds = max(rounds, 1)
	tallies := make([]tally, len(ops))
	cpu := make([]time.Duration, len(ops))
	for range rounds {
		for i, op := range ops {
			before, err := RedisCPU(ctx, rdb)
			if err != nil {
				return nil, err
			}
			tallies[i].run(ctx, concurrency, d/time.Duration(rounds), op)
			after, err := RedisCPU(ctx, rdb)
			if err != nil {
				return nil, err
			}
			cpu[i] += after - before
		}
	}
	out := make([]Result, len(ops))
	for i := range tallies {
		out[i] = tallies[i].result()
		if out[i].Ops > 0 {
			out[i].RedisCPUPerOp = cpu[i] / time.Duration(out[i].Ops)
		}
	}
	return out, nil
}
