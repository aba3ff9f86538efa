package admission

import (
	"testing"
	"time"

	"github.com/agentq/agentq/internal/testenv"
)

// The admission guard survives being started and stopped from many
// goroutines at once (the race detector watches).
func TestGuardStartStopStress(t *testing.T) {
	t.Parallel()
	rdb, keys := testenv.Redis(t, 1)
	q := New(rdb, keys, nil)
	testenv.Stress(t, NewGuard(q, GuardOptions{Timeout: 50 * time.Millisecond}))
}
