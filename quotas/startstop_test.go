package quotas

import (
	"testing"
	"time"

	"github.com/agentq/agentq/internal/testenv"
)

// The admission guard and the coalescer survive being started and stopped from many
// goroutines at once (the race detector watches).
func TestServicesStartStopStress(t *testing.T) {
	t.Parallel()
	rdb, keys := testenv.Redis(t, 1)
	q := New(rdb, keys, nil)
	t.Run("Guard", func(t *testing.T) {
		testenv.Stress(t, NewGuard(q, GuardOptions{Timeout: 50 * time.Millisecond}))
	})
	t.Run("Coalescer", func(t *testing.T) {
		testenv.Stress(t, NewCoalescer(q, time.Second))
	})
}
