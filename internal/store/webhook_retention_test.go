package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv"
)

// seedDelivery writes an event, one delivery of it to endpoint in state, created at
// created and finished at finished (nil: not finished), with attempts attempts, and
// returns the delivery's id.
func seedDelivery(t *testing.T, ctx context.Context, pool *pgxpool.Pool, endpoint uuid.UUID, state string,
	created time.Time, finished *time.Time, attempts int) int64 {
	t.Helper()
	var seq int64
	evID := "ev-" + testenv.ID()
	if err := pool.QueryRow(ctx, `
		INSERT INTO events (id, tenant_id, type, dedupe_key, payload, created_at) VALUES ($1, 'acme', 'usage.limit_hit', $1, '\x7b7d', $2)
		RETURNING seq`, evID, created).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := pool.QueryRow(ctx, `
		INSERT INTO webhook_deliveries (endpoint_id, event_seq, event_id, state, attempts, next_attempt_at, created_at, finished_at)
		VALUES ($1, $2, $3, $4, $5, $6, $6, $7) RETURNING id`,
		endpoint, seq, evID, state, attempts, created, finished).Scan(&id); err != nil {
		t.Fatal(err)
	}
	for a := 1; a <= attempts; a++ {
		at := created.Add(time.Duration(a) * time.Minute)
		if _, err := pool.Exec(ctx, `
			INSERT INTO webhook_attempts (delivery_id, endpoint_id, event_id, attempt, attempted_at, status_code, duration_ms, result)
			VALUES ($1, $2, $3, $4, $5, 500, 12, 'retrying')`, id, endpoint, evID, a, at); err != nil {
			t.Fatal(err)
		}
	}
	return id
}

// Pruning deletes exactly the finished deliveries (succeeded, failed, cancelled) that
// finished before the cut, with their attempts, a bounded batch per call; pending
// deliveries are kept however old, and so are their attempts.
func TestPruneWebhookDeliveries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	st := store.New(pool)
	if _, err := st.CreateTenant(ctx, store.CreateTenantParams{ID: "acme", Name: "Acme", Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	endpoint := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO webhook_endpoints (id, url, types, secret) VALUES ($1, 'https://hooks.example/x', '{usage.limit_hit}', 'whsec_x')`, endpoint); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	cut := now.Add(-30 * 24 * time.Hour)
	ago := func(d time.Duration) *time.Time { t := now.Add(-d); return &t }
	day := 24 * time.Hour

	var old, kept []int64
	for i := range 23 { // more than two batches
		state := []string{"succeeded", "failed", "cancelled"}[i%3]
		old = append(old, seedDelivery(t, ctx, pool, endpoint, state, now.Add(-60*day), ago(40*day+time.Duration(i)*time.Minute), 1+i%3))
	}
	kept = append(kept,
		seedDelivery(t, ctx, pool, endpoint, "pending", now.Add(-90*day), nil, 5),                       // pending, however old
		seedDelivery(t, ctx, pool, endpoint, "pending", now.Add(-40*day), nil, 0),                       // never tried
		seedDelivery(t, ctx, pool, endpoint, "succeeded", now.Add(-60*day), ago(29*day), 2),             // finished inside the retention
		seedDelivery(t, ctx, pool, endpoint, "failed", now.Add(-day), ago(time.Hour), 3),                // recent
		seedDelivery(t, ctx, pool, endpoint, "succeeded", now.Add(-31*day), ago(30*day-time.Second), 1), // just inside
	)

	var deliveries, attempts int64
	calls := 0
	for {
		d, a, err := st.UnscopedPruneWebhookDeliveries(ctx, store.PruneWebhookDeliveriesParams{Before: cut, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		if d > 10 {
			t.Fatalf("one call pruned %d deliveries, over its limit of 10", d)
		}
		calls++
		deliveries, attempts = deliveries+d, attempts+a
		if d == 0 || calls > 10 {
			break
		}
	}
	var wantAttempts int64
	for i := range 23 {
		wantAttempts += int64(1 + i%3)
	}
	if deliveries != 23 || attempts != wantAttempts || calls != 4 {
		t.Fatalf("pruned %d deliveries and %d attempts in %d calls, want 23, %d in 3 calls and an empty one", deliveries, attempts, calls, wantAttempts)
	}
	rows, err := pool.Query(ctx, `SELECT id FROM webhook_deliveries ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var left []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		left = append(left, id)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if !slices.Equal(left, kept) {
		t.Fatalf("deliveries left %v, want exactly %v (pruned: %v)", left, kept, old)
	}
	var orphans, keptAttempts int64
	if err := pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE d.id IS NULL), count(*) FILTER (WHERE d.id IS NOT NULL)
		FROM webhook_attempts a LEFT JOIN webhook_deliveries d ON d.id = a.delivery_id`).Scan(&orphans, &keptAttempts); err != nil {
		t.Fatal(err)
	}
	if orphans != 0 || keptAttempts != 5+0+2+3+1 {
		t.Fatalf("attempts left: %d of kept deliveries (want 11), %d of pruned ones", keptAttempts, orphans)
	}
	if _, _, err := st.UnscopedPruneWebhookDeliveries(ctx, store.PruneWebhookDeliveriesParams{Before: cut}); err == nil {
		t.Fatal("a prune without a batch limit was accepted")
	}
}
