package web

import (
	"testing"

	"github.com/agentq/agentq/internal/testenv"
)

// The cache listener survives being started and stopped from many goroutines at once
// (the race detector watches). The server itself is not stressed: it refuses to start
// again once stopped, by design.
func TestCacheListenerStartStopStress(t *testing.T) {
	t.Parallel()
	testenv.Stress(t, newServerFixture(t).s.CacheListener())
}
