package scheduler

import (
	"testing"
	"time"

	"github.com/agentq/agentq/internal/testenv"
)

// The dispatcher survives being started and stopped from many goroutines at once (the
// race detector watches).
func TestDispatcherStartStopStress(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0, 0)
	testenv.Stress(t, NewDispatcher(f.s, f.rdb, &recordingEnqueuer{}, DispatcherOptions{FallbackEvery: 20 * time.Millisecond}))
}
