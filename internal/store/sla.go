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

// UnscopedFirstStartsWaiting lists up to limit queued tasks that never started, oldest
// first (tasks_live_idx): the tasks whose start commitment may be lapsing.
func (s *Store) UnscopedFirstStartsWaiting(ctx context.Context, limit int) ([]Task, error) {
	rows, err := s.db.Query(ctx, `SELECT `+taskCols+` FROM tasks
		WHERE state = 'queued' AND started_at IS NULL ORDER BY created_at LIMIT $1`, limit)
	return collect(rows, err, scanTask)
}
