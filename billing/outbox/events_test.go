package outbox_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/uuid"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/quotas"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		cause outbox.Cause
		want  outbox.Classification
	}{
		{outbox.Cause{Threshold: 80}, outbox.Informational},
		{outbox.Cause{Threshold: 85, By: outbox.LimitedByPlatform}, outbox.Informational}, // a warning limits nothing
		{outbox.Cause{Threshold: 90}, outbox.AtRisk},
		{outbox.Cause{Threshold: 100}, outbox.EnforcedLimit}, // a refusal by default
		{outbox.Cause{Threshold: 100, By: outbox.LimitedByTenant, How: outbox.HowDelayed}, outbox.EnforcedLimit},
		{outbox.Cause{Threshold: 100, By: outbox.LimitedByTenant, How: outbox.HowPaused}, outbox.EnforcedLimit},
		{outbox.Cause{Threshold: 100, By: outbox.LimitedByPlatform, How: outbox.HowRefused}, outbox.EligibleBreach},
		{outbox.Cause{Threshold: 100, By: outbox.LimitedByPlatform, How: outbox.HowCommitmentMissed}, outbox.EligibleBreach},
		{outbox.Cause{Threshold: 100, By: outbox.LimitedByPlatform, How: outbox.HowDelayed}, outbox.EligibleBreach}, // no row: the platform's
	} {
		if got := outbox.Classify(c.cause); got != c.want {
			t.Errorf("Classify(%+v) = %s, want %s", c.cause, got, c.want)
		}
	}
}

// The classification table is fixed: every rule's inputs and class, rendered as
// docs/limits.md shows them. A change is a change of what finance credits, made on
// purpose with -update.
func TestClassificationGolden(t *testing.T) {
	var got bytes.Buffer
	fmt.Fprintln(&got, "| threshold | limited by | how | sla_classification | when |")
	fmt.Fprintln(&got, "| --- | --- | --- | --- | --- |")
	seen := map[outbox.Cause]bool{}
	for _, r := range outbox.Rules {
		if seen[r.Cause] {
			t.Errorf("two rules for %+v", r.Cause)
		}
		seen[r.Cause] = true
		if c := outbox.Classify(r.Cause); c != r.Class {
			t.Errorf("Classify(%+v) = %s, its rule says %s", r.Cause, c, r.Class)
		}
		fmt.Fprintf(&got, "| %d %% | %s | %s | %s | %s |\n", r.Threshold, r.By, r.How, r.Class, r.When)
	}
	path := filepath.Join("testdata", "classification.golden")
	if *update {
		if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("classification table changed (go test -update to accept):\ngot\n%s\nwant\n%s", got.Bytes(), want)
	}
	// docs/limits.md shows the same table.
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "limits.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(doc, want) {
		t.Errorf("docs/limits.md lacks the classification table of testdata/classification.golden")
	}
}

// The crossing rule is >=: a threshold is reached at exactly its share of the limit.
func TestCrossed(t *testing.T) {
	for _, c := range []struct {
		name                 string
		before, after, limit int64
		want                 []int
	}{
		{"exactly 80 % reaches it", 799, 800, 1000, []int{80}},
		{"just below 80 % does not", 0, 799, 1000, nil},
		{"already at 80 %", 800, 850, 1000, nil},
		{"exactly 90 %", 850, 900, 1000, []int{90}},
		{"exactly 100 %", 999, 1000, 1000, []int{100}},
		{"above the limit from below 80 %", 0, 5000, 1000, []int{80, 90, 100}},
		{"80 and 90 in one step", 700, 950, 1000, []int{80, 90}},
		{"past every threshold already", 1000, 1200, 1000, nil},
		{"no change", 800, 800, 1000, nil},
		{"a fractional share rounds up: 80 % of 3 is 2.4", 0, 2, 3, nil},
		{"3 of 3 reaches all three", 2, 3, 3, []int{80, 90, 100}},
		{"usage going down crosses nothing", 1000, 0, 1000, nil},
		{"a limit of 0 has no thresholds", 0, 10, 0, nil},
		{"an off limit has none", 0, 10, -1, nil},
		{"micro-dollars: $80 of $100", 79_999_999, 80_000_000, 100_000_000, []int{80}},
		{"huge limits do not overflow", 0, 1<<63 - 1, 1<<63 - 1, []int{80, 90, 100}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := outbox.Crossed(c.before, c.after, c.limit); !slices.Equal(got, c.want) {
				t.Fatalf("Crossed(%d, %d, %d) = %v, want %v", c.before, c.after, c.limit, got, c.want)
			}
		})
	}
}

func TestThresholdValue(t *testing.T) {
	for _, c := range []struct {
		limit     int64
		threshold int
		want      int64
	}{
		{1000, 80, 800}, {3, 80, 3}, {3, 90, 3}, {3, 100, 3}, {10, 85, 9}, {1, 80, 1},
		{1<<63 - 1, 100, 1<<63 - 1}, {1<<63 - 1, 80, 7378697629483820646},
	} {
		if got := outbox.ThresholdValue(c.limit, c.threshold); got != c.want {
			t.Errorf("ThresholdValue(%d, %d) = %d, want %d", c.limit, c.threshold, got, c.want)
		}
	}
}

func TestDedupeKeys(t *testing.T) {
	start := time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC)
	if got := outbox.PeriodKey("acme", quotas.USDMonthly, start, 80); got != "acme|usd_monthly|2026-11-15T00:00:00Z|80" {
		t.Errorf("PeriodKey = %s", got)
	}
	// The same instant in another zone is the same period.
	if got := outbox.PeriodKey("acme", quotas.USDMonthly, start.In(time.FixedZone("x", 3600)), 80); got != "acme|usd_monthly|2026-11-15T00:00:00Z|80" {
		t.Errorf("PeriodKey in another zone = %s", got)
	}
	at := time.Date(2026, 12, 1, 14, 30, 59, 999_999_999, time.UTC)
	if got := outbox.WindowKey("acme", quotas.TenantRate, at); got != "acme|tenant_rate|2026-12-01T14:30:00Z" {
		t.Errorf("WindowKey = %s", got)
	}
	if outbox.WindowKey("acme", quotas.TenantRate, at) != outbox.WindowKey("acme", quotas.TenantRate, at.Add(-59*time.Second)) {
		t.Error("two refusals in one minute have different keys")
	}
	if outbox.WindowKey("acme", quotas.TenantRate, at) == outbox.WindowKey("acme", quotas.TenantRate, at.Add(time.Nanosecond)) {
		t.Error("refusals in two minutes share a key")
	}
	if d := outbox.DaySpan(at); !d.Start.Equal(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)) || d.End.Sub(d.Start) != 24*time.Hour {
		t.Errorf("DaySpan = %+v", d)
	}
	for lt, want := range map[string]bool{quotas.AgentStepsDaily: true, quotas.AITokensMonthly: true, quotas.USDMonthly: true,
		quotas.TenantRate: false, quotas.ConcurrentSessions: false, quotas.QueueBacklog: false, outbox.LimitTaskBudget: false} {
		if outbox.IsPeriodQuota(lt) != want {
			t.Errorf("IsPeriodQuota(%s) = %v", lt, !want)
		}
	}
}

func TestEventIDIsDeterministic(t *testing.T) {
	a, b := outbox.EventID("acme|usd_monthly|2026-11-15T00:00:00Z|80"), outbox.EventID("acme|usd_monthly|2026-11-15T00:00:00Z|90")
	if a != outbox.EventID("acme|usd_monthly|2026-11-15T00:00:00Z|80") || a == b {
		t.Fatalf("ids %s %s", a, b)
	}
	u, err := uuid.Parse(a)
	if err != nil || u.Version() != 5 {
		t.Fatalf("id %s: version %d, %v", a, u.Version(), err)
	}
	// Python's uuid.uuid5 gives the same: ids are UUIDv5 of the key in agentq's
	// namespace, which never changes (a changed id would be a new event to consumers).
	if a != "8a92f78e-16eb-5a38-aaac-eebf436845a1" {
		t.Fatalf("the id of the reference key is %s", a)
	}
}

func TestUSDAmounts(t *testing.T) {
	for micro, s := range map[int64]string{0: "0.000000", 1: "0.000001", 12_500_000: "12.500000", 100_000_000: "100.000000", -1_500_000: "-1.500000"} {
		if got := outbox.FormatUSD(micro); got != s {
			t.Errorf("FormatUSD(%d) = %s, want %s", micro, got, s)
		}
		if got, err := outbox.ParseUSD(s); err != nil || got != micro {
			t.Errorf("ParseUSD(%s) = %d, %v", s, got, err)
		}
	}
	if got, err := outbox.ParseUSD("12.5"); err != nil || got != 12_500_000 {
		t.Errorf("ParseUSD(12.5) = %d, %v", got, err)
	}
	for _, bad := range []string{"", "1.0000001", "x", "1.-5", "--1", ".5", "99999999999999999999"} {
		if _, err := outbox.ParseUSD(bad); err == nil {
			t.Errorf("ParseUSD(%q) accepted", bad)
		}
	}
}

var (
	novPeriod = outbox.Span{Start: time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC), End: time.Date(2026, 12, 15, 0, 0, 0, 0, time.UTC)}
	eventAt   = time.Date(2026, 12, 1, 14, 30, 12, 345678000, time.UTC)
	events    = outbox.Events{Source: "/agentq", UpgradeURL: "https://agentq.example/upgrade"}
	usd       = outbox.Quota{TenantID: "acme", Plan: "pro", LimitType: quotas.USDMonthly, Limit: 100_000_000, Period: novPeriod}
)

// decoded is an event read back with the CloudEvents SDK.
func decoded(t *testing.T, ev outbox.Event) (cloudevents.Event, outbox.LimitData) {
	t.Helper()
	var ce cloudevents.Event
	if err := json.Unmarshal(ev.Payload, &ce); err != nil {
		t.Fatalf("%s: %v", ev.Payload, err)
	}
	if err := ce.Validate(); err != nil {
		t.Fatal(err)
	}
	var d outbox.LimitData
	if err := ce.DataAs(&d); err != nil {
		t.Fatal(err)
	}
	return ce, d
}

func TestCrossingEvents(t *testing.T) {
	evs, err := events.Crossings(usd, 79_000_000, 100_000_000, eventAt)
	if err != nil || len(evs) != 3 {
		t.Fatalf("%d events, %v", len(evs), err)
	}
	for i, want := range []struct {
		typ       string
		threshold int
		class     outbox.Classification
		enf       outbox.Enforcement
	}{
		{outbox.TypeApproachingLimit, 80, outbox.Informational, outbox.EnforcementNone},
		{outbox.TypeApproachingLimit, 90, outbox.AtRisk, outbox.EnforcementNone},
		{outbox.TypeLimitHit, 100, outbox.EnforcedLimit, outbox.EnforcementRefused},
	} {
		ev := evs[i]
		ce, d := decoded(t, ev)
		key := outbox.PeriodKey("acme", quotas.USDMonthly, novPeriod.Start, want.threshold)
		if ev.Type != want.typ || ev.DedupeKey != key || ev.ID != outbox.EventID(key) || ev.TenantID != "acme" {
			t.Errorf("event %d: %+v", i, ev)
		}
		if ce.SpecVersion() != "1.0" || ce.ID() != ev.ID || ce.Type() != want.typ || ce.Subject() != "acme" || ce.Source() != "/agentq" ||
			!ce.Time().Equal(eventAt) || ce.DataContentType() != "application/json" {
			t.Errorf("event %d: %s", i, ev.Payload)
		}
		if d.Threshold != want.threshold || d.SLAClassification != want.class || d.Enforcement != want.enf ||
			d.LimitValue != (outbox.Amount{N: 100_000_000, USD: true}) || d.CurrentUsage != (outbox.Amount{N: 100_000_000, USD: true}) ||
			d.Period == nil || !d.Period.Start.Equal(novPeriod.Start) || d.Window != nil || d.Plan != "pro" || d.UpgradeURL != events.UpgradeURL {
			t.Errorf("event %d data: %+v", i, d)
		}
	}
	if !bytes.Contains(evs[0].Payload, []byte(`"limit_value":"100.000000"`)) {
		t.Errorf("USD is not a decimal string: %s", evs[0].Payload)
	}
	// Built again (another replica, a retry): the same bytes.
	again, _ := events.Crossings(usd, 79_000_000, 100_000_000, eventAt)
	for i := range evs {
		if !bytes.Equal(again[i].Payload, evs[i].Payload) {
			t.Fatalf("event %d built twice differs:\n%s\n%s", i, evs[i].Payload, again[i].Payload)
		}
	}
	if _, err := events.Crossings(outbox.Quota{TenantID: "acme", LimitType: quotas.TenantRate, Limit: 10}, 0, 10, eventAt); err == nil {
		t.Error("a rate limit's crossing was built")
	}
	if _, err := events.Crossings(outbox.Quota{LimitType: quotas.USDMonthly, Limit: 10}, 0, 10, eventAt); err == nil {
		t.Error("an event without a tenant was built")
	}
}

func TestLimitHitEvents(t *testing.T) {
	// A refusal by a period quota shares its period's 100 % event.
	quota, err := events.LimitHit(outbox.Refusal{TenantID: "acme", Plan: "pro", LimitType: quotas.USDMonthly,
		Limit: usd.Limit, Used: usd.Limit, Period: &novPeriod, At: eventAt.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	crossed, _ := events.Crossings(usd, 0, usd.Limit, eventAt)
	if quota.DedupeKey != crossed[2].DedupeKey || quota.ID != crossed[2].ID {
		t.Errorf("a quota refusal's key %s, the 100 %% crossing's %s", quota.DedupeKey, crossed[2].DedupeKey)
	}
	if _, err := events.LimitHit(outbox.Refusal{TenantID: "acme", LimitType: quotas.AITokensMonthly, At: eventAt}); err == nil {
		t.Error("a period quota's refusal without its period was built")
	}
	// A rate refusal dedupes per minute, and says its window.
	rate, err := events.LimitHit(outbox.Refusal{TenantID: "acme", Plan: "pro", LimitType: quotas.TenantRate, Limit: 10, Used: 10, At: eventAt})
	if err != nil {
		t.Fatal(err)
	}
	_, d := decoded(t, rate)
	if rate.DedupeKey != "acme|tenant_rate|2026-12-01T14:30:00Z" || d.Window == nil || d.Window.End.Sub(d.Window.Start) != time.Minute ||
		d.Period != nil || d.Threshold != 0 || d.SLAClassification != outbox.EnforcedLimit || d.Enforcement != outbox.EnforcementRefused ||
		d.LimitValue != (outbox.Amount{N: 10}) {
		t.Errorf("rate refusal: %s", rate.Payload)
	}
	// Refused by the platform: eligible for the SLA.
	platform, _ := events.LimitHit(outbox.Refusal{TenantID: "acme", Plan: "pro", LimitType: quotas.ConcurrentSessions, Limit: 4, Used: 2, Platform: true, At: eventAt})
	if _, d := decoded(t, platform); d.SLAClassification != outbox.EligibleBreach {
		t.Errorf("platform refusal: %s", platform.Payload)
	}
	budget, _ := events.LimitHit(outbox.Refusal{TenantID: "acme", Plan: "pro", LimitType: outbox.LimitTaskBudget, Limit: 5, Used: 5,
		Enforcement: outbox.EnforcementStopped, At: eventAt})
	if _, d := decoded(t, budget); d.Enforcement != outbox.EnforcementStopped || d.SLAClassification != outbox.EnforcedLimit {
		t.Errorf("budget: %s", budget.Payload)
	}
}

// The payload bytes of each event type are fixed: a change to them is a change to the
// contract, made on purpose with -update.
func TestEventsGolden(t *testing.T) {
	approaching, err := events.Crossings(usd, 0, 80_000_000, eventAt)
	if err != nil {
		t.Fatal(err)
	}
	tokens := outbox.Quota{TenantID: "acme", Plan: "pro", LimitType: quotas.AITokensMonthly, Limit: 1_000_000, Period: novPeriod}
	hit, err := events.Crossings(tokens, 999_999, 1_000_000, eventAt)
	if err != nil {
		t.Fatal(err)
	}
	rate, err := events.LimitHit(outbox.Refusal{TenantID: "acme", Plan: "free", LimitType: quotas.TenantRate, Limit: 5, Used: 5, Platform: true, At: eventAt})
	if err != nil {
		t.Fatal(err)
	}
	breach, err := events.Breach(outbox.Breach{TenantID: "acme", Plan: "pro", LimitType: outbox.LimitSLAStart,
		Committed: time.Minute, Measured: 61500 * time.Millisecond, At: eventAt})
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	for _, ev := range []outbox.Event{approaching[0], hit[0], rate, breach} {
		fmt.Fprintf(&got, "%s\n", ev.Payload)
	}
	path := filepath.Join("testdata", "events.golden")
	if *update {
		if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("event payloads changed (go test -update to accept):\ngot\n%s\nwant\n%s", got.Bytes(), want)
	}
}
