package maintenance

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/store"
)

// The retention pass prunes the finished deliveries, with their attempts, that
// finished longer than the retention ago, in batches until none is left, and leaves
// pending deliveries and recent ones alone. Without a pruner it does nothing.
func TestWebhookRetentionPrunesOldFinishedDeliveries(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.tenant("acme")
	ep := uuid.New()
	f.exec(`INSERT INTO webhook_endpoints (id, url, types, secret) VALUES ($1, 'https://hooks.example/x', '{usage.limit_hit}', 'whsec_x')`, ep)
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	seed := func(state string, finishedAgo time.Duration, attempts int) {
		t.Helper()
		ev := "ev-" + uuid.NewString()
		var fin *time.Time
		if state != "pending" {
			at := now.Add(-finishedAgo)
			fin = &at
		}
		f.exec(`WITH e AS (INSERT INTO events (id, tenant_id, type, dedupe_key, payload) VALUES ($1, 'acme', 'usage.limit_hit', $1, '\x7b7d') RETURNING seq),
			d AS (INSERT INTO webhook_deliveries (endpoint_id, event_seq, event_id, state, attempts, next_attempt_at, finished_at)
				SELECT $2, seq, $1, $3, $4, $5, $6 FROM e RETURNING id)
			INSERT INTO webhook_attempts (delivery_id, endpoint_id, event_id, attempt, attempted_at, duration_ms, result)
			SELECT d.id, $2, $1, g, $5, 1, 'retrying' FROM d, generate_series(1, $4) g`,
			ev, ep, state, attempts, now.Add(-100*24*time.Hour), fin)
	}
	for range 7 {
		seed("succeeded", 31*24*time.Hour, 2)
	}
	seed("failed", 45*24*time.Hour, 3)
	seed("cancelled", 90*24*time.Hour, 1)
	seed("pending", 0, 4)                 // never pruned
	seed("succeeded", 29*24*time.Hour, 1) // inside the default retention
	seed("failed", time.Hour, 2)          // recent

	f.Webhooks = store.New(f.Pool)
	f.Archetype = &baseservice.Archetype{Clock: func() time.Time { return now }}
	p := NewWebhookRetention(f.Deps, NewElector(f.Deps, ElectorConfig{}), WebhookRetentionConfig{BatchSize: 4})
	if p.cfg.Retention != DefaultWebhookRetention || DefaultWebhookRetention != 720*time.Hour {
		t.Fatalf("retention %v, want the default of 720h", p.cfg.Retention)
	}
	res, err := p.runOnce(f.ctx)
	if err != nil || res.Deliveries != 9 || res.Attempts != 7*2+3+1 || !res.Stats.Done || res.Batches != 3 {
		t.Fatalf("run: %+v %v; want 9 deliveries and 18 attempts pruned in 3 batches of at most 4", res, err)
	}
	var left, leftAttempts int
	if err := f.Pool.QueryRow(f.ctx, `SELECT (SELECT count(*) FROM webhook_deliveries), (SELECT count(*) FROM webhook_attempts)`).Scan(&left, &leftAttempts); err != nil {
		t.Fatal(err)
	}
	if left != 3 || leftAttempts != 4+1+2 {
		t.Fatalf("%d deliveries and %d attempts left, want 3 and 7", left, leftAttempts)
	}
	if res, err := p.runOnce(f.ctx); err != nil || res.Deliveries != 0 || !res.Stats.Done {
		t.Fatalf("a second run: %+v %v", res, err)
	}
	// A shorter retention takes the delivery 29 days old too.
	short := NewWebhookRetention(f.Deps, NewElector(f.Deps, ElectorConfig{}), WebhookRetentionConfig{Retention: 7 * 24 * time.Hour})
	if res, err := short.runOnce(f.ctx); err != nil || res.Deliveries != 1 || res.Attempts != 1 {
		t.Fatalf("a 7-day retention: %+v %v", res, err)
	}
	d := f.Deps
	d.Webhooks = nil
	off := NewWebhookRetention(d, NewElector(d, ElectorConfig{}), WebhookRetentionConfig{})
	if res, err := off.runOnce(f.ctx); err != nil || !res.Stats.Done || res.Deliveries != 0 {
		t.Fatalf("without a pruner: %+v %v", res, err)
	}
}

// A run cut at its budget with more left to delete is followed by the next one soon,
// not an Interval later, so a backlog larger than one run's budget is worked through;
// a run that finished, or failed, waits the Interval.
func TestWebhookRetentionWorksThroughABacklog(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p := NewWebhookRetention(f.Deps, NewElector(f.Deps, ElectorConfig{}), WebhookRetentionConfig{Interval: time.Hour})
	cut := WebhookRetentionResult{Batches: 40, Deliveries: 40000}
	if d := p.nextRun(cut, nil); d > 5*time.Second {
		t.Fatalf("after a run cut at its budget: next run in %v, want within seconds", d)
	}
	done := WebhookRetentionResult{Batches: 1, Stats: PassStats{Done: true}}
	if d := p.nextRun(done, nil); d != time.Hour {
		t.Fatalf("after a finished run: %v, want the interval", d)
	}
	if d := p.nextRun(cut, context.DeadlineExceeded); d != time.Hour {
		t.Fatalf("after a failed run: %v, want the interval", d)
	}
}
