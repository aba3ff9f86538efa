package maintenance

import (
	"fmt"
	"testing"
	"time"

	"github.com/agentq/agentq/internal/testenv"
)

// Every service of the janitor, and the recovery sweep, survives being started and
// stopped from many goroutines at once (the race detector watches).
func TestServicesStartStopStress(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	j := NewJanitor(f.Deps, JanitorConfig{Interval: time.Hour, Elector: ElectorConfig{Interval: 20 * time.Millisecond}})
	svcs := append(j.Services(), NewRecovery(f.Deps, RecoveryConfig{Interval: time.Hour}))
	for _, svc := range svcs {
		t.Run(fmt.Sprintf("%T", svc), func(t *testing.T) {
			testenv.Stress(t, svc)
		})
	}
}
