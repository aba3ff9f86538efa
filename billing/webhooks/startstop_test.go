package webhooks_test

import (
	"testing"
	"time"

	"github.com/agentq/agentq/billing/webhooks"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv"
)

// The relay survives being started and stopped from many goroutines at once (the
// race detector watches its pool of senders and its poller).
func TestRelayStartStopStress(t *testing.T) {
	t.Parallel()
	st := store.New(testenv.Postgres(t))
	testenv.Stress(t, webhooks.NewRelay(st, webhooks.RelayConfig{PollInterval: 5 * time.Millisecond}))
}
