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
	return insertedRejections(out, err)
}

// insertedRejections reads the rows of an upsert of refusal counts RETURNING them
// with "inserted" last, and keeps those inserted.
func insertedRejections(rows pgx.Rows, err error) ([]RejectionRow, error) {
	all, err := collect(rows, err, func(row pgx.Row) (struct {
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

// AddDegradedRejectionsParams are one API replica's counts of the admissions it
// refused in process while Redis was unreachable.
type AddDegradedRejectionsParams struct {
	Replica string // the replica that counted them
	Rows    []RejectionRow
}

// UnscopedAddDegradedRejections copies a replica's in-process refusal counts, of any
// tenants: each row keeps the larger of its stored count and the one given, since a
// replica's count of a minute only grows, and other replicas' counts stay rows of
// their own. It returns the rows this replica had not stored before.
func (s *Store) UnscopedAddDegradedRejections(ctx context.Context, p AddDegradedRejectionsParams) ([]RejectionRow, error) {
	if len(p.Rows) == 0 {
		return nil, nil
	}
	tenants, limits := make([]string, len(p.Rows)), make([]string, len(p.Rows))
	minutes, counts := make([]time.Time, len(p.Rows)), make([]int64, len(p.Rows))
	for i, r := range p.Rows {
		tenants[i], limits[i], minutes[i], counts[i] = r.TenantID, r.LimitType, r.Minute, r.Count
	}
	// xmax = 0: the row was inserted, not updated.
	rows, err := s.db.Query(ctx, `
		INSERT INTO degraded_rejections (tenant_id, limit_type, minute, replica, count)
		SELECT t, l, m, $5, c FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::bigint[]) AS r(t, l, m, c)
		ON CONFLICT (tenant_id, minute, limit_type, replica)
		DO UPDATE SET count = GREATEST(degraded_rejections.count, excluded.count)
		RETURNING tenant_id, limit_type, minute, count, xmax = 0`, tenants, limits, minutes, counts, p.Replica)
	return insertedRejections(rows, err)
}

// RejectionCountsParams select a tenant's refusal counts: each minute in [Since,
// Until) on its own, and for each of TotalsFrom the sums per limit over the minutes
// from it up to Since.
type RejectionCountsParams struct {
	TenantID     string
	Since, Until time.Time
	TotalsFrom   []time.Time
}

// RejectionCounts are the counts RejectionCountsParams select.
type RejectionCounts struct {
	Minutes []RejectionRow     // one row per limit and minute, in minute order
	Totals  []map[string]int64 // limit type → count, one per TotalsFrom, in its order
}

// RejectionCounts reads a tenant's refusal counts in one statement (the usage
// report, which panels poll, reads them on every call).
func (s *Store) RejectionCounts(ctx context.Context, p RejectionCountsParams) (RejectionCounts, error) {
	out := RejectionCounts{Totals: make([]map[string]int64, len(p.TotalsFrom))}
	if p.TenantID == "" {
		return out, ErrNoTenant
	}
	for i := range out.Totals {
		out.Totals[i] = map[string]int64{}
	}
	// Window 0 is the minutes, in minute order; window i > 0 is TotalsFrom[i-1]'s sums.
	rows, err := s.db.Query(ctx, `
		SELECT 0::bigint, limit_type, minute, count::bigint FROM limit_rejections
		WHERE tenant_id = $1 AND minute >= $2 AND minute < $3
		UNION ALL
		SELECT w.i, r.limit_type, NULL, sum(r.count)::bigint
		FROM unnest($4::timestamptz[]) WITH ORDINALITY AS w(since, i)
		JOIN limit_rejections r ON r.tenant_id = $1 AND r.minute >= w.since AND r.minute < $2
		GROUP BY w.i, r.limit_type
		ORDER BY 1, 3, 2`, p.TenantID, p.Since, p.Until, p.TotalsFrom)
	type counted struct {
		window int64
		RejectionRow
	}
	got, err := collect(rows, err, func(row pgx.Row) (counted, error) {
		c := counted{RejectionRow: RejectionRow{TenantID: p.TenantID}}
		var minute *time.Time // null in a window's sums
		err := row.Scan(&c.window, &c.LimitType, &minute, &c.Count)
		if minute != nil {
			c.Minute = minute.UTC()
		}
		return c, err
	})
	if err != nil {
		return out, err
	}
	for _, c := range got {
		if c.window == 0 {
			out.Minutes = append(out.Minutes, c.RejectionRow)
		} else {
			out.Totals[c.window-1][c.LimitType] = c.Count
		}
	}
	return out, nil
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
