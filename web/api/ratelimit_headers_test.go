package api

import (
	"net/http"
	"testing"
	"time"

	"github.com/agentq/agentq/quotas"
)

// The rate-limit fields name every scope that is on, in the decision's order, with
// its window when it has one; money goes out in dollars; the X-RateLimit trio names
// the scope closest to exhaustion, and a refusal adds Retry-After.
func TestRateHeadersSpellEveryScope(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	d := quotas.Decision{Scopes: []quotas.Scope{
		{Name: quotas.KeyRate, Limit: 20, Remaining: 19, Window: time.Second, Reset: 50 * time.Millisecond},
		{Name: quotas.TenantRate, Limit: 0.5, Remaining: 0, Window: 2 * time.Second, Reset: 1500 * time.Millisecond,
			Violated: true, RetryAfter: 1500 * time.Millisecond},
		{Name: quotas.QueueBacklog, Limit: -1}, // off
		{Name: quotas.USDMonthly, Limit: 25e6, Remaining: 12_500_001, Reset: 48 * time.Hour},
	}}
	h := http.Header{}
	setRateHeaders(h, d, now)
	want := map[string]string{
		"RateLimit-Policy":      `"key";q=20;w=1, "tenant";q=0.5;w=2, "usd_monthly";q=25`,
		"RateLimit":             `"key";r=19;t=1, "tenant";r=0;t=2, "usd_monthly";r=12;t=172800`,
		"X-RateLimit-Limit":     "0",
		"X-RateLimit-Remaining": "0",
		"X-RateLimit-Reset":     "1800000002",
		"Retry-After":           "2",
	}
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
}

// BenchmarkRateHeaders measures the headers of an admitted submission of a tenant
// with every limit on.
func BenchmarkRateHeaders(b *testing.B) {
	now := time.Unix(1_800_000_000, 0)
	var d quotas.Decision
	for _, name := range []string{quotas.KeyRate, quotas.TenantRate, quotas.KeyAgentRate, quotas.UserTasksHourly,
		quotas.ConcurrentSessions, quotas.LongRunningInflight, quotas.QueueBacklog, quotas.AgentStepsDaily,
		quotas.AITokensMonthly, quotas.USDMonthly} {
		d.Scopes = append(d.Scopes, quotas.Scope{Name: name, Limit: 1000, Remaining: 998, Window: time.Minute, Reset: 1500 * time.Millisecond})
	}
	d.Allowed = true
	b.ReportAllocs()
	for b.Loop() {
		setRateHeaders(http.Header{}, d, now)
	}
}
