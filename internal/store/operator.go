package store

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The operator view's reads across tenants, and the janitor's record of what it
// corrected. Every call here is unscoped: the operator sees every tenant.

// TenantActivity is what one tenant's tasks did in a window of time.
type TenantActivity struct {
	TenantID string
	// WorkerSeconds is the worker time its tasks held in the window: for each task
	// that started, (its end, or the window's end while it runs) − its start, clipped
	// to the window. A task handed back to the queue counts nothing while it waits.
	WorkerSeconds float64
	// Waited: one of its tasks waited in the window: it is queued now (and was
	// created before the window's end), or it ended in the window without starting.
	Waited bool
	// Started is how many of its tasks started in the window, and P99Wait the 99th
	// percentile of their waits (created → first start); 0 when none started.
	Started int
	P99Wait time.Duration
	// CapacityWaits is how many of its tasks are queued now waiting for token capacity
	// (its tokens per minute, a model pool, or a throttled agent's retry time).
	CapacityWaits int
}

// ActivityParams select the window [At − Window, At]. A nil At is Postgres's now().
type ActivityParams struct {
	At     *time.Time
	Window time.Duration
}

// UnscopedTenantActivity sums the worker time, waits and starts of every tenant's
// tasks over the window, for the tenants with any (the others did nothing). It reads
// the live tasks (tasks_live_idx) and those that ended in the window
// (tasks_finished_idx), never the whole table.
func (s *Store) UnscopedTenantActivity(ctx context.Context, p ActivityParams) ([]TenantActivity, error) {
	rows, err := s.db.Query(ctx, `
		WITH w AS (
			SELECT COALESCE($1::timestamptz, now()) AS hi, COALESCE($1::timestamptz, now()) - $2::interval AS lo
		), t AS (
			SELECT tenant_id, state, created_at, started_at, finished_at, wait_reason FROM tasks
			WHERE state IN ('queued', 'running')
			UNION ALL
			SELECT tenant_id, state, created_at, started_at, finished_at, NULL FROM tasks, w
			WHERE finished_at IS NOT NULL AND finished_at > w.lo
		)
		SELECT t.tenant_id,
			COALESCE(sum(EXTRACT(EPOCH FROM LEAST(COALESCE(t.finished_at, w.hi), w.hi) - GREATEST(t.started_at, w.lo)))
				FILTER (WHERE t.state <> 'queued' AND t.started_at < w.hi AND COALESCE(t.finished_at, w.hi) > w.lo), 0)::float8,
			COALESCE(bool_or(t.created_at < w.hi AND (t.state = 'queued' OR (t.started_at IS NULL AND t.finished_at IS NOT NULL))), false),
			count(*) FILTER (WHERE t.started_at >= w.lo AND t.started_at < w.hi),
			COALESCE(percentile_cont(0.99) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM t.started_at - t.created_at))
				FILTER (WHERE t.started_at >= w.lo AND t.started_at < w.hi), 0)::float8,
			count(*) FILTER (WHERE t.state = 'queued' AND t.wait_reason IS NOT NULL)
		FROM t, w
		GROUP BY t.tenant_id
		ORDER BY t.tenant_id`, p.At, interval(p.Window))
	return collect(rows, err, func(row pgx.Row) (TenantActivity, error) {
		var a TenantActivity
		var p99 float64
		err := row.Scan(&a.TenantID, &a.WorkerSeconds, &a.Waited, &a.Started, &p99, &a.CapacityWaits)
		a.P99Wait = time.Duration(p99 * float64(time.Second))
		return a, err
	})
}

// LimitHits are a tenant's limit_hit events and refused admissions since a time.
type LimitHits struct {
	Events   int64 // usage.limit_hit events written
	Refusals int64 // admissions refused (flushed counts; the last minute may be missing)
}

// UnscopedLimitHits counts, per tenant of ids, the events of type eventType written
// since since, and the refused admissions counted since since. Tenants with neither
// are absent. It reads the window alone (events_type_time_idx); it is planned for its
// arguments (the simple protocol), since the generic plan this pool's statements get
// cannot know that the window is a day of a long history, and scanned all of it.
func (s *Store) UnscopedLimitHits(ctx context.Context, ids []string, eventType string, since time.Time) (map[string]LimitHits, error) {
	out := map[string]LimitHits{}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := s.db.Query(ctx, `
		SELECT tenant_id, sum(events)::bigint, sum(refusals)::bigint FROM (
			SELECT tenant_id, count(*) AS events, 0 AS refusals FROM events
			WHERE tenant_id = ANY($1) AND type = $2 AND created_at >= $3 GROUP BY tenant_id
			UNION ALL
			SELECT tenant_id, 0, sum(count) FROM limit_rejections
			WHERE tenant_id = ANY($1) AND minute >= $3 GROUP BY tenant_id
		) x GROUP BY tenant_id`, pgx.QueryExecModeSimpleProtocol, ids, eventType, since)
	type hit struct {
		id string
		h  LimitHits
	}
	hs, err := collect(rows, err, func(row pgx.Row) (hit, error) {
		var h hit
		err := row.Scan(&h.id, &h.h.Events, &h.h.Refusals)
		return h, err
	})
	if err != nil {
		return nil, err
	}
	for _, h := range hs {
		out[h.id] = h.h
	}
	return out, nil
}

// JanitorRun is one run of a janitor pass that corrected something.
type JanitorRun struct {
	ID          int64
	Pass        string
	RanAt       time.Time
	Corrections map[string]int64 // kind of drift → how much was fixed
}

// janitorRunsKept is how long janitor runs are kept.
const janitorRunsKept = 30 * 24 * time.Hour

// UnscopedRecordJanitorRun records that a run of pass corrected what corrections
// say, and deletes the runs older than 30 days.
func (s *Store) UnscopedRecordJanitorRun(ctx context.Context, pass string, corrections map[string]int64) error {
	body, err := json.Marshal(corrections)
	if err != nil {
		return err
	}
	_, err = s.db.Exec(ctx, `
		WITH pruned AS (DELETE FROM janitor_runs WHERE ran_at < now() - $3::interval)
		INSERT INTO janitor_runs (pass, corrections) VALUES ($1, $2)`, pass, body, interval(janitorRunsKept))
	return err
}

// UnscopedJanitorRuns returns the runs recorded since since, newest first, at most
// limit, and the totals per kind of drift over all of them (not only the limit).
func (s *Store) UnscopedJanitorRuns(ctx context.Context, since time.Time, limit int) ([]JanitorRun, map[string]int64, error) {
	rows, err := s.db.Query(ctx, `
		SELECT id, pass, ran_at, corrections FROM janitor_runs WHERE ran_at >= $1 ORDER BY id DESC LIMIT $2`, since, limit)
	runs, err := collect(rows, err, func(row pgx.Row) (JanitorRun, error) {
		var r JanitorRun
		err := row.Scan(&r.ID, &r.Pass, &r.RanAt, &r.Corrections)
		return r, err
	})
	if err != nil {
		return nil, nil, err
	}
	rows, err = s.db.Query(ctx, `
		SELECT e.key, sum(e.value::bigint)::bigint FROM janitor_runs, jsonb_each_text(corrections) AS e
		WHERE ran_at >= $1 GROUP BY e.key`, since)
	type kv struct {
		k string
		n int64
	}
	kvs, err := collect(rows, err, func(row pgx.Row) (kv, error) {
		var x kv
		err := row.Scan(&x.k, &x.n)
		return x, err
	})
	if err != nil {
		return nil, nil, err
	}
	totals := make(map[string]int64, len(kvs))
	for _, x := range kvs {
		totals[x.k] = x.n
	}
	return runs, totals, nil
}

// WebhookHealth is an endpoint with the state of its deliveries.
type WebhookHealth struct {
	ID             uuid.UUID
	URL            string
	TenantID       string // "" = every tenant
	DisabledAt     *time.Time
	DisabledReason string
	Pending        int64 // deliveries not yet done
	Retrying       int64 // of Pending, those with a failed (or lapsed) attempt behind them
	Failed         int64 // deliveries given up
	// LastFailure is the newest failed attempt among the endpoint's last
	// recentAttempts attempts; nil when there is none.
	LastFailure *WebhookAttempt
}

// recentAttempts bounds how far back WebhookHealth looks for a failed attempt.
const recentAttempts = 200

// UnscopedWebhookHealth lists every endpoint, oldest first, with its deliveries'
// state. It never reads a secret. Each count reads the endpoint's own rows
// (webhook_deliveries_pending_idx, webhook_deliveries_failed_idx), and the last
// failure is looked for among the endpoint's last attempts in
// webhook_attempts_endpoint_result_idx alone, so a quiet endpoint next to a busy one
// costs no walk through the busy one's attempts.
func (s *Store) UnscopedWebhookHealth(ctx context.Context) ([]WebhookHealth, error) {
	rows, err := s.db.Query(ctx, `
		SELECT e.id, e.url, COALESCE(e.tenant_id, ''), e.disabled_at, COALESCE(e.disabled_reason, ''),
			(SELECT count(*) FROM webhook_deliveries d WHERE d.endpoint_id = e.id AND d.state = 'pending'),
			(SELECT count(*) FROM webhook_deliveries d WHERE d.endpoint_id = e.id AND d.state = 'pending'
				AND (d.attempts > 1 OR (d.attempts = 1 AND d.lease_id IS NULL))),
			(SELECT count(*) FROM webhook_deliveries d WHERE d.endpoint_id = e.id AND d.state = 'failed'),
			f.id, f.delivery_id, f.event_id, f.attempt, f.attempted_at, f.status_code, f.error, f.duration_ms, f.result
		FROM webhook_endpoints e
		LEFT JOIN LATERAL (
			SELECT max(r.id) FILTER (WHERE r.result <> 'succeeded') AS id FROM (
				SELECT a.id, a.result FROM webhook_attempts a WHERE a.endpoint_id = e.id ORDER BY a.id DESC LIMIT `+strconv.Itoa(recentAttempts)+`
			) r
		) last ON true
		LEFT JOIN LATERAL (
			SELECT a.id, a.delivery_id, a.event_id, a.attempt, a.attempted_at, COALESCE(a.status_code, 0) AS status_code,
				COALESCE(a.error, '') AS error, a.duration_ms, a.result
			FROM webhook_attempts a WHERE a.id = last.id
		) f ON true
		ORDER BY e.created_at, e.id`)
	return collect(rows, err, func(row pgx.Row) (WebhookHealth, error) {
		var h WebhookHealth
		var (
			id, delivery, ms *int64
			event, errText   *string
			result           *string
			attempt, status  *int
			attemptedAt      *time.Time
		)
		err := row.Scan(&h.ID, &h.URL, &h.TenantID, &h.DisabledAt, &h.DisabledReason, &h.Pending, &h.Retrying, &h.Failed,
			&id, &delivery, &event, &attempt, &attemptedAt, &status, &errText, &ms, &result)
		if err == nil && id != nil {
			h.LastFailure = &WebhookAttempt{
				ID: *id, DeliveryID: *delivery, EndpointID: h.ID, EventID: *event, Attempt: *attempt,
				AttemptedAt: *attemptedAt, StatusCode: *status, Error: *errText,
				Duration: time.Duration(*ms) * time.Millisecond, Result: *result,
			}
		}
		return h, err
	})
}
