package telemetry

import (
	"log/slog"
	"testing"

	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/testenv"
)

// The pprof listener survives being started and stopped from many goroutines at once
// (the race detector watches).
func TestPprofStartStopStress(t *testing.T) {
	t.Parallel()
	testenv.Stress(t, &Pprof{Addr: "127.0.0.1:0", Archetype: &baseservice.Archetype{Logger: slog.New(slog.DiscardHandler)}})
}
