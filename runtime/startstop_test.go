package runtime_test

import (
	"context"
	"testing"

	"github.com/agentq/agentq/internal/testenv"
)

// The worker (its asynq servers and its cancel subscription) survives being started
// and stopped from many goroutines at once (the race detector watches). A Stop that
// lands while Start still registers the worker's heartbeat makes that Start return
// context.Canceled.
func TestWorkerStartStopStress(t *testing.T) {
	t.Parallel()
	testenv.Stress(t, newRig(t).w, context.Canceled)
}
