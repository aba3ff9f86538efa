// Package periodic is the loop of a background service that works in rounds: a round
// at once, then the next after the wait the round returns, until Stop.
package periodic

import (
	"context"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"
)

// Start starts b's goroutine, owned by b and ended by its Stop, running round at once
// and then again after each wait round returns.
func Start(ctx context.Context, b *startstop.BaseStartStop, round func(ctx context.Context) (wait time.Duration)) error {
	ctx, shouldStart, started, stopped := b.StartInit(ctx)
	if !shouldStart {
		return nil
	}
	go func() {
		started()
		defer stopped()
		t := time.NewTimer(0)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			t.Reset(round(ctx))
		}
	}()
	return nil
}
