package rejections_test

import (
	"testing"
	"time"

	"github.com/agentq/agentq/billing/rejections"
	"github.com/agentq/agentq/internal/testenv"
)

// The degraded-mode flush survives being started and stopped from many goroutines at
// once; each stop runs its last flush.
func TestLocalRejectionFlushStartStopStress(t *testing.T) {
	t.Parallel()
	f := newRejecting(t)
	testenv.Stress(t, rejections.NewLocalRejectionFlush(f.rej, rejections.LocalRejectionFlushOptions{Interval: 5 * time.Millisecond}))
}
