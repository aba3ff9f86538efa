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
	// RedisCPUPerOp is set by RunMeasuringRedis. Other clients of the same Redis count
	// in it too: measure on a Redis nothing else uses.
	RedisCPUPerOp time.Duration
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

// RunMeasuringRedis is Run, also reporting the Redis main thread's CPU per operation.
func RunMeasuringRedis(ctx context.Context, rdb redis.UniversalClient, concurrency int, d time.Duration, op func(ctx context.Context, worker int, seq int64) error) (Result, error) {
	before, err := RedisCPU(ctx, rdb)
	if err != nil {
		return Result{}, err
	}
	r := Run(ctx, concurrency, d, op)
	after, err := RedisCPU(ctx, rdb)
	if err != nil {
		return Result{}, err
	}
	if r.Ops > 0 {
		r.RedisCPUPerOp = (after - before) / time.Duration(r.Ops)
	}
	return r, nil
}
