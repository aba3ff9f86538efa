package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// produce runs n submissions from c goroutines, one at a time each, and returns how
// long they took, how many failed and the first failure.
func produce(n, c int, submit func(i int) error) (time.Duration, int64, error) {
	var next, errs atomic.Int64
	var first sync.Once
	var firstErr error
	start := time.Now()
	var wg sync.WaitGroup
	for range c {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				if err := submit(int(i)); err != nil {
					errs.Add(1)
					first.Do(func() { firstErr = err })
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), errs.Load(), firstErr
}

// simArgs are the sim agent's input as the three systems carry it.
type simArgs struct {
	Steps  int `json:"steps"`
	StepMs int `json:"step_ms"`
}

// Kind names River's job kind.
func (simArgs) Kind() string { return "sim" }

// simRun is the River and asynq workers' work, shaped as agentq's sim agent: each
// step sleeps StepMs and encodes its state, the last also the output.
func simRun(ctx context.Context, a simArgs) error {
	for step := 1; step <= a.Steps; step++ {
		if a.StepMs > 0 {
			t := time.NewTimer(time.Duration(a.StepMs) * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
		if _, err := json.Marshal(map[string]int{"done": step}); err != nil {
			return err
		}
	}
	_, err := json.Marshal(map[string]int{"steps": a.Steps, "tokens": 0})
	return err
}

// waitEnds reads one outcome per ended task (true: completed) until n have ended.
func waitEnds(ctx context.Context, ends <-chan bool, n int64) (notCompleted int64, err error) {
	for seen := int64(0); seen < n; seen++ {
		select {
		case ok := <-ends:
			if !ok {
				notCompleted++
			}
		case <-ctx.Done():
			return notCompleted, fmt.Errorf("%d of %d tasks ended: %w", seen, n, ctx.Err())
		}
	}
	return notCompleted, nil
}

// runID keeps one run's tenants, queue and keys apart from another's.
func runID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
