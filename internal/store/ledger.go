package store

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/agentq/agentq/quotas"
)

// LedgerRow is one (task, step, meter) usage row.
type LedgerRow struct {
	TaskID   uuid.UUID
	Step     int
	Meter    string
	TenantID string
	Quantity int64
}

// TaskLedgerParams name one of a tenant's tasks.
type TaskLedgerParams struct {
	TenantID string
	TaskID   uuid.UUID
}

// TaskLedger returns the ledger rows of one of the tenant's tasks in step order (none
// for another tenant's task).
func (s *Store) TaskLedger(ctx context.Context, p TaskLedgerParams) ([]LedgerRow, error) {
	if p.TenantID == "" {
		return nil, ErrNoTenant
	}
	rows, err := s.db.Query(ctx, `
		SELECT task_id, step, meter, tenant_id, quantity FROM usage_ledger
		WHERE task_id = $1 AND tenant_id = $2 ORDER BY step, meter`, p.TaskID, p.TenantID)
	return collect(rows, err, func(row pgx.Row) (LedgerRow, error) {
		var r LedgerRow
		err := row.Scan(&r.TaskID, &r.Step, &r.Meter, &r.TenantID, &r.Quantity)
		return r, err
	})
}

// LedgerUsage is use summed from the ledger.
type LedgerUsage struct {
	StepsByHour map[int64]int64 // hours since the Unix epoch → steps recorded in that hour
	Tokens      int64
	CostMicro   int64
}

// LedgerUsageParams select a tenant's use: its steps recorded since StepsSince, by the
// hour, and its tokens and cost recorded in [PeriodStart, PeriodEnd).
type LedgerUsageParams struct {
	TenantID    string
	StepsSince  time.Time
	PeriodStart time.Time
	PeriodEnd   time.Time
}

// LedgerUsage sums one tenant's ledger rows: what its quota counters are rebuilt from.
func (s *Store) LedgerUsage(ctx context.Context, p LedgerUsageParams) (LedgerUsage, error) {
	if p.TenantID == "" {
		return LedgerUsage{}, ErrNoTenant
	}
	m, err := s.ledgerUsage(ctx, []UsageWindow{{TenantID: p.TenantID, PeriodStart: p.PeriodStart, PeriodEnd: p.PeriodEnd}}, p.StepsSince)
	return m[p.TenantID], err
}

// UsageWindow is one tenant's billing period, for UnscopedLedgerUsageOf.
type UsageWindow struct {
	TenantID    string
	PeriodStart time.Time
	PeriodEnd   time.Time
}

// UnscopedLedgerUsageOf sums the ledger rows of a page of tenants in one query, as
// LedgerUsage does for one: the quota recount's reading.
func (s *Store) UnscopedLedgerUsageOf(ctx context.Context, windows []UsageWindow, stepsSince time.Time) (map[string]LedgerUsage, error) {
	return s.ledgerUsage(ctx, windows, stepsSince)
}

func (s *Store) ledgerUsage(ctx context.Context, windows []UsageWindow, stepsSince time.Time) (map[string]LedgerUsage, error) {
	ids := make([]string, len(windows))
	starts := make([]time.Time, len(windows))
	ends := make([]time.Time, len(windows))
	for i, w := range windows {
		ids[i], starts[i], ends[i] = w.TenantID, w.PeriodStart, w.PeriodEnd
	}
	// One range scan of (tenant_id, recorded_at) per tenant, from the earlier of the
	// period's start and the steps window's.
	rows, err := s.db.Query(ctx, `
		SELECT l.tenant_id, l.meter,
			CASE WHEN l.meter = 'steps' THEN floor(extract(epoch FROM l.recorded_at) / 3600)::bigint ELSE 0 END,
			sum(l.quantity)::bigint
		FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[]) AS w(tenant_id, start_at, end_at)
		JOIN usage_ledger l ON l.tenant_id = w.tenant_id AND l.recorded_at >= LEAST(w.start_at, $4::timestamptz)
		WHERE (l.meter = 'steps' AND l.recorded_at >= $4::timestamptz)
		   OR (l.meter <> 'steps' AND l.recorded_at >= w.start_at AND l.recorded_at < w.end_at)
		GROUP BY 1, 2, 3`, ids, starts, ends, stepsSince)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string]LedgerUsage, len(windows))
	for _, id := range ids {
		out[id] = LedgerUsage{StepsByHour: map[int64]int64{}}
	}
	for rows.Next() {
		var tenant, meter string
		var hour, n int64
		if err := rows.Scan(&tenant, &meter, &hour, &n); err != nil {
			return nil, err
		}
		u := out[tenant]
		switch meter {
		case "steps":
			u.StepsByHour[hour] += n
		case "tokens":
			u.Tokens += n
		case "cost_micro_usd":
			u.CostMicro += n
		}
		out[tenant] = u
	}
	return out, rows.Err()
}

// RunningSteps is what a tenant's running tasks may hold reserved in its quota counters
// and not yet recorded here, with the tenant's billing anchor.
type RunningSteps struct {
	Anchor  quotas.Anchor // the tenant's billing anchor
	Running int64         // its tasks running now
	// Tokens and CostMicro sum, over the running tasks, what the worker reserves for
	// each one's next step: what its last recorded step used. A task that has recorded
	// no step yet reserves from what its tenant's steps used before (the worker's
	// running average), so it counts the largest of its running siblings' last steps
	// and the tenant's latest recorded step.
	Tokens    int64
	CostMicro int64
}

// UnscopedRunningStepsOf returns RunningSteps of a page of tenants in one query; a tenant
// that does not exist is absent.
func (s *Store) UnscopedRunningStepsOf(ctx context.Context, tenants []string) (map[string]RunningSteps, error) {
	rows, err := s.db.Query(ctx, `
		SELECT t.id, t.created_at, t.billing_day, t.time_zone, count(k.id), count(k.id) FILTER (WHERE k.steps = 0),
			COALESCE(sum(tok.quantity), 0)::bigint, COALESCE(sum(c.quantity), 0)::bigint,
			GREATEST(COALESCE(max(tok.quantity), 0), COALESCE(max(latest.tokens), 0))::bigint,
			GREATEST(COALESCE(max(c.quantity), 0), COALESCE(max(latest.cost), 0))::bigint
		FROM tenants t
		LEFT JOIN LATERAL ( -- the tenant's latest recorded step, once per tenant
			SELECT sum(l.quantity) FILTER (WHERE l.meter = 'tokens') AS tokens,
				sum(l.quantity) FILTER (WHERE l.meter = 'cost_micro_usd') AS cost
			FROM usage_ledger l
			JOIN (SELECT task_id, step FROM usage_ledger WHERE tenant_id = t.id ORDER BY recorded_at DESC LIMIT 1) last
				ON l.task_id = last.task_id AND l.step = last.step
		) latest ON true
		LEFT JOIN tasks k ON k.tenant_id = t.id AND k.state = 'running'
		LEFT JOIN usage_ledger tok ON tok.task_id = k.id AND tok.step = k.steps AND tok.meter = 'tokens'
		LEFT JOIN usage_ledger c ON c.task_id = k.id AND c.step = k.steps AND c.meter = 'cost_micro_usd'
		WHERE t.id = ANY($1)
		GROUP BY t.id`, tenants)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string]RunningSteps, len(tenants))
	for rows.Next() {
		var id string
		var r RunningSteps
		var created time.Time
		var day *int16
		var zone *string
		var fresh, freshTokens, freshCost int64
		if err := rows.Scan(&id, &created, &day, &zone, &r.Running, &fresh, &r.Tokens, &r.CostMicro, &freshTokens, &freshCost); err != nil {
			return nil, err
		}
		r.Tokens += fresh * freshTokens
		r.CostMicro += fresh * freshCost
		var d *int
		if day != nil {
			v := int(*day)
			d = &v
		}
		r.Anchor = anchorOf(created, d, zone)
		out[id] = r
	}
	return out, rows.Err()
}
