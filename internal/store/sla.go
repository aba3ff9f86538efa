package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// SLABreaches are a tenant's missed commitments of one kind (limit_type
// sla_start_within_s or sla_pool_wait_within_s) since a time: their eligible_breach
// limit_hit events, and the last one's values.
type SLABreaches struct {
	TenantID        string
	LimitType       string
	Count           int64 // events: one per commitment and minute
	Last            time.Time
	LastCommittedMs int64
	LastMeasuredMs  int64
}

// SLABreaches lists the tenant's missed commitments since since, by limit_type.
func (s *Store) SLABreaches(ctx context.Context, tenantID string, since time.Time) ([]SLABreaches, error) {
	if tenantID == "" {
		return nil, ErrNoTenant
	}
	return s.slaBreaches(ctx, []string{tenantID}, since)
}

// UnscopedSLABreaches lists the missed commitments since since of the tenants of
// ids, by tenant and limit_type.
func (s *Store) UnscopedSLABreaches(ctx context.Context, ids []string, since time.Time) ([]SLABreaches, error) {
	return s.slaBreaches(ctx, ids, since)
}

// slaBreaches reads the window of limit_hits alone (events_type_time_idx) and parses
// only the rows whose dedupe key is a commitment's (tenant|sla_…|minute|platform).
func (s *Store) slaBreaches(ctx context.Context, ids []string, since time.Time) ([]SLABreaches, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := s.db.Query(ctx, `
		SELECT tenant_id, d->>'limit_type', count(*), max(created_at),
			coalesce((array_agg((d->>'committed_ms')::bigint ORDER BY seq DESC))[1], 0),
			coalesce((array_agg((d->>'measured_ms')::bigint ORDER BY seq DESC))[1], 0)
		FROM (SELECT tenant_id, seq, created_at, convert_from(payload, 'UTF8')::jsonb -> 'data' AS d FROM events
			WHERE tenant_id = ANY($1) AND type = 'usage.limit_hit' AND created_at >= $2
				AND dedupe_key LIKE '%|sla\_%|platform') e
		WHERE d->>'sla_classification' = 'eligible_breach'
		GROUP BY 1, 2 ORDER BY 1, 2`, pgx.QueryExecModeSimpleProtocol, ids, since)
	return collect(rows, err, func(row pgx.Row) (SLABreaches, error) {
		var b SLABreaches
		err := row.Scan(&b.TenantID, &b.LimitType, &b.Count, &b.Last, &b.LastCommittedMs, &b.LastMeasuredMs)
		return b, err
	})
}

// FirstStartsWaiting is a tenant with queued tasks that never started, and when the
// oldest of them was created.
type FirstStartsWaiting struct {
	TenantID string
	Oldest   time.Time
}

// UnscopedFirstStartsWaiting lists the tenants with queued tasks that never started,
// each with its oldest such task's creation, in tenant order: the tenants whose start
// commitment may be lapsing. It skips from one tenant to the next on
// tasks_first_start_idx (one probe a tenant), however long their backlogs.
func (s *Store) UnscopedFirstStartsWaiting(ctx context.Context) ([]FirstStartsWaiting, error) {
	rows, err := s.db.Query(ctx, `
		WITH RECURSIVE w AS (
			(SELECT tenant_id, created_at FROM tasks WHERE state = 'queued' AND started_at IS NULL
				ORDER BY tenant_id, created_at LIMIT 1)
			UNION ALL
			SELECT n.tenant_id, n.created_at FROM w, LATERAL (
				SELECT tenant_id, created_at FROM tasks
				WHERE state = 'queued' AND started_at IS NULL AND tenant_id > w.tenant_id
				ORDER BY tenant_id, created_at LIMIT 1) n
		)
		SELECT tenant_id, created_at FROM w`)
	return collect(rows, err, func(row pgx.Row) (FirstStartsWaiting, error) {
		var f FirstStartsWaiting
		err := row.Scan(&f.TenantID, &f.Oldest)
		return f, err
	})
}

// UnscopedFirstStartsLapsed lists up to limit of a tenant's queued tasks that never
// started, created at or after from and more than within ago (on the Postgres clock),
// oldest first: the tasks whose start commitment of within has lapsed.
func (s *Store) UnscopedFirstStartsLapsed(ctx context.Context, tenantID string, from time.Time, within time.Duration,
	limit int) ([]Task, error) {
	rows, err := s.db.Query(ctx, `SELECT `+taskCols+` FROM tasks
		WHERE tenant_id = $1 AND state = 'queued' AND started_at IS NULL AND created_at >= $2
			AND created_at < now() - $3::interval
		ORDER BY created_at LIMIT $4`, tenantID, from, interval(within), limit)
	return collect(rows, err, scanTask)
}
