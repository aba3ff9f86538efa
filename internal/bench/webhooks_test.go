package bench

import (
	"context"
	"testing"
	"time"

	"github.com/agentq/agentq/billing/webhooks"
	"github.com/agentq/agentq/internal/testenv"
)

// A small run of the webhooks benchmark: every probe reaches its healthy endpoint in
// both phases, well before the hung endpoint's sends time out.
func TestWebhooksBenchDeliversEveryProbe(t *testing.T) {
	t.Parallel()
	testenv.Postgres(t) // makes sure the test database exists
	res, err := RunWebhooks(context.Background(), WebhooksOptions{
		DatabaseURL: testenv.DatabaseURL(), Backlog: 300, Probes: 12, Endpoints: 2, Interval: 20 * time.Millisecond,
		Relay: webhooks.RelayConfig{Timeout: 30 * time.Second, PollInterval: 50 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, d := range map[string]WebhookDelays{"hung": res.Hung, "baseline": res.Baseline} {
		if d.Probes != 12 || d.Missed != 0 || d.P50Ms <= 0 || d.P90Ms < d.P50Ms || d.MaxMs < d.P90Ms {
			t.Errorf("%s: %+v", name, d)
		}
		if d.MaxMs >= 10000 {
			t.Errorf("%s: a probe waited %.0f ms: behind the hung endpoint's 30 s timeout", name, d.MaxMs)
		}
	}
	if res.Backlog != 300 || res.TimeoutS != 30 {
		t.Errorf("result %+v", res)
	}
}
