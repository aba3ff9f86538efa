package admission

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/quotas"
)

func TestStepReservationWaitsForTokensPerMinute(t *testing.T) {
	t.Parallel()
	f := newQ(t)
	ctx := context.Background()
	l := quotas.NoLimits()
	l.TokensPerMinute, l.TokensPerMinuteBurst = 600, 300 // 10 tokens a second
	step := func(est int64) error {
		return f.q.ReserveStep(ctx, quotas.StepParams{TenantID: "acme", Period: f.period(), Limits: l, Tokens: est})
	}
	settle := func(delta int64) {
		t.Helper()
		if err := f.q.SettleStep(ctx, nil, quotas.StepParams{TenantID: "acme", Period: f.period(), Limits: l, Tokens: delta}); err != nil {
			t.Fatal(err)
		}
	}
	waitOf := func(err error) time.Duration {
		t.Helper()
		var cw *quotas.CapacityWait
		if !errors.As(err, &cw) || cw.Reason != agentqtype.WaitTokensPerMinute {
			t.Fatalf("reservation answered %v; want a wait for %s", err, agentqtype.WaitTokensPerMinute)
		}
		return cw.Wait
	}
	if err := step(200); err != nil {
		t.Fatalf("first step within the burst: %v", err)
	}
	// 100 left: a step estimated at 200 waits for 100 more tokens, 10 s, and takes
	// nothing meanwhile (no step counted, no monthly tokens).
	if w := waitOf(step(200)); w != 10*time.Second {
		t.Fatalf("wait %v, want 10s", w)
	}
	if n := f.rdb.HLen(ctx, f.keys.StepsDaily("acme")).Val(); n != 1 {
		t.Fatalf("steps hash has %d hours, want the one step's", n)
	}
	// The first step used 50 more than it reserved: debt. Refill 10 s (100), level
	// 100 - 50 + 100 = 150: an estimate of 200 still waits 5 s.
	settle(50)
	f.advance(10 * time.Second)
	if w := waitOf(step(200)); w != 5*time.Second {
		t.Fatalf("wait after the excess %v, want 5s", w)
	}
	// A refund of 150 brings the level to 300, the burst: the step goes.
	settle(-150)
	if err := step(200); err != nil {
		t.Fatalf("after the refund: %v", err)
	}
	// In debt, even a step of unknown cost (estimate 0) waits until the debt is paid.
	settle(400) // level 100 - 400 = -300
	if w := waitOf(step(0)); w != 30*time.Second {
		t.Fatalf("wait in debt %v, want 30s", w)
	}
	// Off (the zero value, or Off): never waits.
	l.TokensPerMinute = quotas.Off
	if err := step(1_000_000); err != nil {
		t.Fatalf("limit off: %v", err)
	}
}
