package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// RejectionRow is how many of a tenant's admissions one limit refused in one minute.
type RejectionRow struct {
	TenantID  string
	LimitType string
	Minute    time.Time
	Count     int64
}

// UnscopedAddRejections copies refusal counts read from Redis, of any tenants: each
// row keeps the larger of its stored count and the one given, since a minute's count
// only grows, so a copy made twice or racing another adds nothing twice. It returns
// the rows that were not stored before: the first refusals of a limit in a minute.
func (s *Store) UnscopedAddRejections(ctx context.Context, rows []RejectionRow) ([]RejectionRow, error) {
	if len(rows) == 0 {
		return nil, nil
	}
	tenants, limits := make([]string, len(rows)), make([]string, len(rows))
	minutes, counts := make([]time.Time, len(rows)), make([]int64, len(rows))
	for i, r := range rows {
		tenants[i], limits[i], minutes[i], counts[i] = r.TenantID, r.LimitType, r.Minute, r.Count
	}
	// xmax = 0: the row was inserted, not updated.
	out, err := s.db.Query(ctx, `
		INSERT INTO limit_rejections (tenant_id, limit_type, minute, count)
		SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::bigint[])
		ON CONFLICT (tenant_id, minute, limit_type)
		DO UPDATE SET count = GREATEST(limit_rejections.count, excluded.count)
		RETURNING tenant_id, limit_type, minute, count, xmax = 0`, tenants, limits, minutes, counts)
	all, err := collect(out, err, func(row pgx.Row) (struct {
		RejectionRow
		inserted bool
	}, error) {
		var r struct {
			RejectionRow
			inserted bool
		}
		err := row.Scan(&r.TenantID, &r.LimitType, &r.Minute, &r.Count, &r.inserted)
		return r, err
	})
	if err != nil {
		return nil, err
	}
	var inserted []RejectionRow
	for _, r := range all {
		if r.inserted {
			inserted = append(inserted, r.RejectionRow)
		}
	}
	return inserted, nil
}

// RejectionsParams select a tenant's refusal counts of the minutes in [Since, Until).
type RejectionsParams struct {
	TenantID     string
	Since, Until time.Time
}

// RejectionTotals sums a tenant's refusal counts per limit over the minutes selected.
func (s *Store) RejectionTotals(ctx context.Context, p RejectionsParams) (map[string]int64, error) {
	if p.TenantID == "" {
		return nil, ErrNoTenant
	}
	rows, err := s.db.Query(ctx, `
		SELECT limit_type, sum(count)::bigint FROM limit_rejections
		WHERE tenant_id = $1 AND minute >= $2 AND minute < $3 GROUP BY limit_type`, p.TenantID, p.Since, p.Until)
	type total struct {
		limit string
		n     int64
	}
	ts, err := collect(rows, err, func(row pgx.Row) (total, error) {
		var t total
		err := row.Scan(&t.limit, &t.n)
		return t, err
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(ts))
	for _, t := range ts {
		out[t.limit] = t.n
	}
	return out, nil
}

// Rejections returns a tenant's refusal counts of the minutes selected, one row per
// limit and minute, in minute order.
func (s *Store) Rejections(ctx context.Context, p RejectionsParams) ([]RejectionRow, error) {
	if p.TenantID == "" {
		return nil, ErrNoTenant
	}
	rows, err := s.db.Query(ctx, `
		SELECT tenant_id, limit_type, minute, count FROM limit_rejections
		WHERE tenant_id = $1 AND minute >= $2 AND minute < $3 ORDER BY minute, limit_type`, p.TenantID, p.Since, p.Until)
	return collect(rows, err, func(row pgx.Row) (RejectionRow, error) {
		var r RejectionRow
		err := row.Scan(&r.TenantID, &r.LimitType, &r.Minute, &r.Count)
		r.Minute = r.Minute.UTC()
		return r, err
	})
}

// UnscopedRejectionTotals sums the refusal counts of many tenants, each over its own
// window [PeriodStart, PeriodEnd): tenant → limit type → count. The usage export's.
func (s *Store) UnscopedRejectionTotals(ctx context.Context, windows []UsageWindow) (map[string]map[string]int64, error) {
	out := map[string]map[string]int64{}
	if len(windows) == 0 {
		return out, nil
	}
	ids, starts, ends := make([]string, len(windows)), make([]time.Time, len(windows)), make([]time.Time, len(windows))
	for i, w := range windows {
		ids[i], starts[i], ends[i] = w.TenantID, w.PeriodStart, w.PeriodEnd
	}
	rows, err := s.db.Query(ctx, `
		SELECT r.tenant_id, r.limit_type, sum(r.count)::bigint
		FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[]) AS w(tenant_id, since, until)
		JOIN limit_rejections r ON r.tenant_id = w.tenant_id AND r.minute >= w.since AND r.minute < w.until
		GROUP BY r.tenant_id, r.limit_type`, ids, starts, ends)
	type total struct {
		tenant, limit string
		n             int64
	}
	ts, err := collect(rows, err, func(row pgx.Row) (total, error) {
		var t total
		err := row.Scan(&t.tenant, &t.limit, &t.n)
		return t, err
	})
	if err != nil {
		return nil, err
	}
	for _, t := range ts {
		if out[t.tenant] == nil {
			out[t.tenant] = map[string]int64{}
		}
		out[t.tenant][t.limit] = t.n
	}
	return out, nil
}
