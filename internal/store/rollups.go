package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/quotas"
)

// The usage rollups: the ledger summed per tenant per UTC hour, per day of the
// tenant's zone and per billing period. The transaction that records a step adds the
// step to them (only when its ledger rows were inserted), and UnscopedRebuildRollups
// recomputes them from the ledger.
//
// Serialising with a rebuild. A step's transaction holds a shared advisory lock on its
// tenant's rollups, a rebuild an exclusive one: a rebuild never reads the ledger
// while a step it would miss is adding to rows it replaces. Steps of one tenant
// serialise among themselves on their period row, which each updates first.

// rollupLock is the advisory lock key of a tenant's rollups; the schema is part of it,
// so deployments (and tests) in other schemas of one database never wait on each other.
const rollupLock = `hashtextextended(current_schema() || '|rollups|' || $1, 0)`

// rollupLockOf is rollupLock of the tenant id the SQL expression tenant gives.
func rollupLockOf(tenant string) string {
	return strings.Replace(rollupLock, "$1", tenant, 1)
}

// StepUsage is what a recorded step added, and the rollups it leaves.
type StepUsage struct {
	RecordedAt time.Time // the ledger rows' recorded_at: the transaction's start
	Tokens     int64     // the step's own (steps: 1)
	CostMicro  int64
	// Period is the billing period the step was booked in.
	Period quotas.Period
	// PeriodSteps, PeriodTokens and PeriodCostMicro are the period's totals with
	// the step.
	PeriodSteps     int64
	PeriodTokens    int64
	PeriodCostMicro int64
	// DaySteps is the steps of the sliding day with the step: the 24 UTC hours ending
	// with the step's hour, as the daily steps quota counts them.
	DaySteps int64
}

// RecordedStep is what UnscopedRecordStep wrote.
type RecordedStep struct {
	Task   Task   // the task as the step left it
	Tenant Tenant // its tenant, read in the step's transaction
	Usage  StepUsage
}

// addStepToRollups adds a step just inserted into the ledger to the tenant's rollups,
// on tx, and returns the tenant and the rollups with the step.
func addStepToRollups(ctx context.Context, tx pgx.Tx, tenantID string, at time.Time, tokens, costMicro int64) (Tenant, StepUsage, error) {
	got, err := addStepsToRollups(ctx, tx, at, []rollupAdd{{TenantID: tenantID, Steps: 1, Tokens: tokens, CostMicro: costMicro}})
	if err != nil {
		return Tenant{}, StepUsage{}, err
	}
	return got[0].Tenant, got[0].Usage, nil
}

// rollupAdd is what steps of one tenant recorded together add to its rollups.
type rollupAdd struct {
	TenantID                 string
	Steps, Tokens, CostMicro int64
}

// rollupAdded is a rollupAdd's tenant, read in the transaction, and its rollups with
// the steps (Usage's Tokens and CostMicro are the added sums).
type rollupAdded struct {
	Tenant Tenant
	Usage  StepUsage
}

// addStepsToRollups adds steps just inserted into the ledger, all recorded at at, to
// their tenants' rollups, on tx, in four statements whatever the number of tenants,
// two round trips: one takes each tenant's shared rollup lock, one reads the tenants
// (their billing anchors place the steps in a period), one upserts the period, day and
// hour rows of all of them, one sums their sliding days.
// The result is in the order of adds; a tenant must appear once.
func addStepsToRollups(ctx context.Context, tx pgx.Tx, at time.Time, adds []rollupAdd) ([]rollupAdded, error) {
	ids := make([]string, len(adds))
	for i, a := range adds {
		ids[i] = a.TenantID
	}
	byID, err := lockRollupTenants(ctx, tx, ids)
	if err != nil {
		return nil, err
	}
	out := make([]rollupAdded, len(adds))
	n := len(adds)
	c := rollupCols{ids: ids, starts: make([]time.Time, n), ends: make([]time.Time, n), hours: make([]time.Time, n),
		periodIDs: make([]string, n), days: make([]string, n), plans: make([]string, n),
		steps: make([]int64, n), tokens: make([]int64, n), costs: make([]int64, n)}
	hour := at.UTC().Truncate(time.Hour)
	for i, a := range adds {
		t, ok := byID[a.TenantID]
		if !ok {
			return nil, fmt.Errorf("store: the tenant of a step: %s: %w", a.TenantID, agentqtype.ErrNotFound)
		}
		anchor := t.Anchor()
		u := StepUsage{RecordedAt: at, Tokens: a.Tokens, CostMicro: a.CostMicro, Period: anchor.PeriodAt(at)}
		out[i] = rollupAdded{Tenant: t, Usage: u}
		c.starts[i], c.ends[i], c.periodIDs[i] = u.Period.Start, u.Period.End, u.Period.ID
		c.days[i], c.hours[i], c.plans[i] = at.In(zoneOf(anchor)).Format(time.DateOnly), hour, t.Plan
		c.steps[i], c.tokens[i], c.costs[i] = a.Steps, a.Tokens, a.CostMicro
	}
	// The sliding day, in a statement of its own: one begun before this one got its
	// period rows holds the hours as they were then, without the steps of the
	// transactions it waited for (one of an earlier hour, across an hour boundary),
	// and a threshold they and this step reached together would be crossed by none.
	// Both statements go in one round trip (a pipeline): the second begins once the
	// first is done.
	b := &pgx.Batch{}
	queueUpsertRollups(b, c)
	b.Queue(`
		SELECT i.tenant_id, 0::bigint, 0::bigint, 0::bigint, COALESCE(sum(o.steps), 0)::bigint
		FROM unnest($1::text[], $2::timestamptz[]) AS i(tenant_id, hour)
		LEFT JOIN usage_rollup_hourly o ON o.tenant_id = i.tenant_id
			AND o.hour > i.hour - interval '24 hours' AND o.hour <= i.hour
		GROUP BY 1`, ids, c.hours)
	br := tx.SendBatch(ctx, b)
	defer func() { _ = br.Close() }() // early returns; the success path checks it
	byTenant, err := collectTotals(br.Query())
	if err != nil {
		return nil, err
	}
	daySteps, err := collectTotals(br.Query())
	if err != nil {
		return nil, err
	}
	if err := br.Close(); err != nil {
		return nil, err
	}
	for i := range out {
		tt, ok := byTenant[adds[i].TenantID]
		if !ok {
			return nil, fmt.Errorf("store: no rollup row came back for tenant %s", adds[i].TenantID)
		}
		u := &out[i].Usage
		u.PeriodSteps, u.PeriodTokens, u.PeriodCostMicro, u.DaySteps = tt.steps, tt.tokens, tt.cost, daySteps[adds[i].TenantID].day
	}
	return out, nil
}

// lockRollupTenants takes the shared rollup lock of each tenant, then reads them.
// The locks come first, in a statement of their own: a statement reads the rows as
// they were when it began, so a tenant read in the statement that waited for a rebuild
// (an anchor change) would be the tenant before the change, and its steps would be
// booked by the old anchor into rows the rebuild just rewrote by the new one. The two
// statements go in one round trip (a pipeline): the read still begins only once the
// locks are held.
func lockRollupTenants(ctx context.Context, tx pgx.Tx, ids []string) (map[string]Tenant, error) {
	b := &pgx.Batch{}
	b.Queue(`
		SELECT pg_advisory_xact_lock_shared(`+rollupLockOf("t.id")+`)
		FROM (SELECT DISTINCT unnest($1::text[]) AS id ORDER BY 1) t`, ids)
	b.Queue(`SELECT `+tenantCols+` FROM tenants WHERE id = ANY($1)`, ids)
	br := tx.SendBatch(ctx, b)
	defer func() { _ = br.Close() }() // early returns; the success path checks it
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("store: the rollup locks of steps: %w", err)
	}
	rows, err := br.Query()
	tenants, err := collect(rows, err, scanTenant)
	if err != nil {
		return nil, fmt.Errorf("store: the tenants of steps: %w", err)
	}
	byID := make(map[string]Tenant, len(tenants))
	for _, t := range tenants {
		byID[t.ID] = t
	}
	return byID, br.Close()
}

// rollupCols are the rollup rows steps add to, one per tenant, by column.
type rollupCols struct {
	ids                  []string
	starts, ends, hours  []time.Time
	periodIDs, days      []string
	plans                []string // the tenant's plan, read with its lock: the period's plan
	steps, tokens, costs []int64
}

// queueUpsertRollups queues on b the statement that adds c to the period, day and hour
// rows and returns each tenant's period totals with them (rows read by collectTotals).
func queueUpsertRollups(b *pgx.Batch, c rollupCols) {
	// Rows are locked in tenant order, as every writer of them does, so that two
	// transactions adding to the same tenants cannot deadlock.
	b.Queue(`
		WITH i AS (
			SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[], $4::text[], $5::date[],
				$6::timestamptz[], $7::bigint[], $8::bigint[], $9::bigint[], $10::text[])
				AS i(tenant_id, period_start, period_end, period_id, day, hour, steps, tokens, cost, plan)
		), p AS (
			INSERT INTO usage_rollup_period AS r (tenant_id, period_start, period_end, period_id, steps, tokens, cost_micro_usd, plan)
			SELECT tenant_id, period_start, period_end, period_id, steps, tokens, cost, plan FROM i ORDER BY tenant_id
			ON CONFLICT (tenant_id, period_start) DO UPDATE SET steps = r.steps + EXCLUDED.steps,
				tokens = r.tokens + EXCLUDED.tokens, cost_micro_usd = r.cost_micro_usd + EXCLUDED.cost_micro_usd,
				plan = EXCLUDED.plan
			RETURNING r.tenant_id, r.steps, r.tokens, r.cost_micro_usd
		), d AS (
			INSERT INTO usage_rollup_daily AS r (tenant_id, day, steps, tokens, cost_micro_usd)
			SELECT tenant_id, day, steps, tokens, cost FROM i ORDER BY tenant_id
			ON CONFLICT (tenant_id, day) DO UPDATE SET steps = r.steps + EXCLUDED.steps,
				tokens = r.tokens + EXCLUDED.tokens, cost_micro_usd = r.cost_micro_usd + EXCLUDED.cost_micro_usd
			RETURNING 1
		), h AS (
			INSERT INTO usage_rollup_hourly AS r (tenant_id, hour, steps, tokens, cost_micro_usd)
			SELECT tenant_id, hour, steps, tokens, cost FROM i ORDER BY tenant_id
			ON CONFLICT (tenant_id, hour) DO UPDATE SET steps = r.steps + EXCLUDED.steps,
				tokens = r.tokens + EXCLUDED.tokens, cost_micro_usd = r.cost_micro_usd + EXCLUDED.cost_micro_usd
			RETURNING 1
		)
		SELECT p.tenant_id, p.steps, p.tokens, p.cost_micro_usd, 0::bigint
		FROM p, (SELECT count(*) FROM d) AS dd, (SELECT count(*) FROM h) AS hh`,
		c.ids, c.starts, c.ends, c.periodIDs, c.days, c.hours, c.steps, c.tokens, c.costs, c.plans)
}

// rollupTotals are a tenant's rollups with its steps: its period's, and its sliding
// day's steps.
type rollupTotals struct{ steps, tokens, cost, day int64 }

// collectTotals reads rows of (tenant, period steps, tokens, cost, day steps).
func collectTotals(rows pgx.Rows, err error) (map[string]rollupTotals, error) {
	type row struct {
		id string
		rollupTotals
	}
	got, err := collect(rows, err, func(r pgx.Row) (row, error) {
		var v row
		err := r.Scan(&v.id, &v.steps, &v.tokens, &v.cost, &v.day)
		return v, err
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string]rollupTotals, len(got))
	for _, v := range got {
		out[v.id] = v.rollupTotals
	}
	return out, nil
}

func zoneOf(a quotas.Anchor) *time.Location {
	if a.Zone == nil {
		return time.UTC
	}
	return a.Zone
}

// Rollup is one rollup row's totals.
type Rollup struct {
	Steps     int64
	Tokens    int64
	CostMicro int64
}

func (r *Rollup) add(meter string, n int64) {
	switch meter {
	case "steps":
		r.Steps += n
	case "tokens":
		r.Tokens += n
	case "cost_micro_usd":
		r.CostMicro += n
	}
}

// PeriodRollup is a tenant's rollup of one billing period.
type PeriodRollup struct {
	TenantID string
	Period   quotas.Period
	// Plan is the plan in force in the period: the tenant's at the period's last
	// recorded step or plan change.
	Plan string
	Rollup
}

// DayRollup is a tenant's rollup of one day of its zone ("2026-11-15").
type DayRollup struct {
	TenantID string
	Day      string
	Rollup
}

// HourRollup is a tenant's rollup of one UTC hour.
type HourRollup struct {
	TenantID string
	Hour     time.Time
	Rollup
}

// RebuildRollupsParams select what UnscopedRebuildRollups recomputes: the tenant's
// rollups over [From, To), widened to whole billing periods (and whole UTC hours); all
// of them when both are zero.
type RebuildRollupsParams struct {
	TenantID string
	From, To time.Time
}

// rebuildBucket is the width of the ledger sums a rebuild reads: a quarter hour, so
// every zone in use today has its midnights (and so its days' and periods' bounds) on
// a bucket's edge.
const rebuildBucket = 15 * time.Minute

// The open ends of a rebuild's range: before any ledger row, after every one.
var (
	farPast   = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	farFuture = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
)

// UnscopedRebuildRollups recomputes a tenant's rollups from its ledger: the rows in the
// range are deleted and written again from the ledger's sums, in one transaction that
// holds the tenant's rollups exclusively (steps being recorded for it wait).
//
// With no range every rollup row of the tenant is rewritten: what a change of its
// billing anchor needs, since the old anchor's periods and days no longer match the
// new one's. That is done in bounded pieces, newest first, a transaction each: the
// current period (and anything after it), then each earlier period that holds ledger
// rows or rollup rows, the oldest piece taking whatever lies before it. A transaction
// over a tenant's whole history would hold back every tenant's feed and webhooks
// (their readers wait for the transactions older than what they read) for as long as
// it ran. Each piece reads the tenant's anchor afresh. Until the last piece commits the
// earlier periods may still be cut by an older anchor. Called on a transaction, the
// pieces are savepoints of it.
func (s *Store) UnscopedRebuildRollups(ctx context.Context, p RebuildRollupsParams) error {
	if p.TenantID == "" {
		return ErrNoTenant
	}
	if p.From.IsZero() && p.To.IsZero() {
		return s.rebuildInPieces(ctx, p.TenantID)
	}
	if !p.From.Before(p.To) {
		return fmt.Errorf("store: rebuild range [%s, %s) is empty", p.From, p.To)
	}
	return s.beginFunc(ctx, func(tx pgx.Tx) error {
		tenant, err := lockForRebuild(ctx, tx, p.TenantID)
		if err != nil {
			return err
		}
		a := tenant.Anchor()
		return rebuildRange(ctx, tx, tenant, a.PeriodAt(p.From).Start, a.PeriodAt(p.To.Add(-time.Nanosecond)).End)
	})
}

// lockForRebuild takes the tenant's rollups exclusively, then reads the tenant.
func lockForRebuild(ctx context.Context, tx pgx.Tx, tenantID string) (Tenant, error) {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(`+rollupLock+`)`, tenantID); err != nil {
		return Tenant{}, err
	}
	return scanTenant(tx.QueryRow(ctx, `SELECT `+tenantCols+` FROM tenants WHERE id = $1`, tenantID))
}

// rebuildInPieces is UnscopedRebuildRollups of everything (see there).
func (s *Store) rebuildInPieces(ctx context.Context, tenantID string) error {
	to := farFuture
	var at *time.Time // in the next piece's period: nil, now
	for to.After(farPast) {
		err := s.beginFunc(ctx, func(tx pgx.Tx) error {
			tenant, err := lockForRebuild(ctx, tx, tenantID)
			if err != nil {
				return err
			}
			if at == nil {
				var now time.Time
				if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
					return err
				}
				at = &now
			}
			from := tenant.Anchor().PeriodAt(*at).Start
			// The latest thing before this piece, which the next one holds.
			if err := tx.QueryRow(ctx, `
				SELECT GREATEST(
					(SELECT max(recorded_at) FROM usage_ledger WHERE tenant_id = $1 AND recorded_at < $2),
					(SELECT max(period_start) FROM usage_rollup_period WHERE tenant_id = $1 AND period_start < $2),
					(SELECT max(hour) FROM usage_rollup_hourly WHERE tenant_id = $1 AND hour < $3))`,
				tenantID, from, from.Truncate(time.Hour)).Scan(&at); err != nil {
				return err
			}
			if at == nil {
				from = farPast // the oldest piece: whatever lies before it goes
			}
			if err := rebuildRange(ctx, tx, tenant, from, to); err != nil {
				return err
			}
			to = from
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// rebuildRange rewrites the tenant's rollups over [from, to) (whole periods, or the
// open ends) from its ledger, on tx, which holds the tenant's rollups.
func rebuildRange(ctx context.Context, tx pgx.Tx, tenant Tenant, from, to time.Time) error {
	a := tenant.Anchor()
	loc := zoneOf(a)
	plans, err := periodPlans(ctx, tx, tenant.ID)
	if err != nil {
		return err
	}
	hFrom, hTo := from.Truncate(time.Hour), to.Add(time.Hour-time.Nanosecond).Truncate(time.Hour)
	if _, err := tx.Exec(ctx, `DELETE FROM usage_rollup_hourly WHERE tenant_id = $1 AND hour >= $2 AND hour < $3`,
		tenant.ID, hFrom, hTo); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM usage_rollup_daily WHERE tenant_id = $1 AND day >= $2::date AND day < $3::date`,
		tenant.ID, from.In(loc).Format(time.DateOnly), to.In(loc).Format(time.DateOnly)); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM usage_rollup_period WHERE tenant_id = $1 AND period_start >= $2 AND period_start < $3`,
		tenant.ID, from, to); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, `
		SELECT floor(extract(epoch FROM recorded_at) / $4)::bigint, meter, sum(quantity)::bigint
		FROM usage_ledger WHERE tenant_id = $1 AND recorded_at >= $2 AND recorded_at < $3
		GROUP BY 1, 2`, tenant.ID, hFrom, hTo, int64(rebuildBucket/time.Second))
	if err != nil {
		return err
	}
	hours := map[time.Time]*Rollup{}
	days := map[string]*Rollup{}
	periods := map[string]*PeriodRollup{}
	get := func(m map[string]*Rollup, k string) *Rollup {
		if m[k] == nil {
			m[k] = &Rollup{}
		}
		return m[k]
	}
	for rows.Next() {
		var b, n int64
		var meter string
		if err := rows.Scan(&b, &meter, &n); err != nil {
			rows.Close()
			return err
		}
		at := time.Unix(b*int64(rebuildBucket/time.Second), 0).UTC()
		h := at.Truncate(time.Hour)
		if hours[h] == nil {
			hours[h] = &Rollup{}
		}
		hours[h].add(meter, n)
		if at.Before(from) || !at.Before(to) {
			continue // in a boundary hour, outside the periods rebuilt
		}
		get(days, at.In(loc).Format(time.DateOnly)).add(meter, n)
		per := a.PeriodAt(at)
		if periods[per.ID] == nil {
			periods[per.ID] = &PeriodRollup{TenantID: tenant.ID, Period: per}
		}
		periods[per.ID].add(meter, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	keepPlans(plans, periods, a, tenant, from, to)
	return insertRollups(ctx, tx, tenant.ID, hours, days, periods)
}

// planRow is a period rollup row's start and plan, as a rebuild found it.
type planRow struct {
	Start time.Time
	Plan  string
}

// periodPlans reads the plans of a tenant's period rows, in time order.
func periodPlans(ctx context.Context, tx pgx.Tx, tenantID string) ([]planRow, error) {
	rows, err := tx.Query(ctx, `SELECT period_start, plan FROM usage_rollup_period WHERE tenant_id = $1 ORDER BY period_start`, tenantID)
	return collect(rows, err, func(row pgx.Row) (planRow, error) {
		var r planRow
		err := row.Scan(&r.Start, &r.Plan)
		return r, err
	})
}

// keepPlans carries the plans of the period rows a rebuild replaces (old, in time
// order) over to the rows it writes: each period rebuilt gets the plan of the latest
// old row that began before its end (the plan in force at its end), or the tenant's
// plan when none did; and a period that holds the start of a replaced row keeps a row,
// without use if need be, so the plan that row recorded stays known to the periods
// after it. The rows replaced are those starting in [from, to).
func keepPlans(old []planRow, periods map[string]*PeriodRollup, a quotas.Anchor, t Tenant, from, to time.Time) {
	for _, o := range old {
		if o.Start.Before(from) || !o.Start.Before(to) {
			continue
		}
		if per := a.PeriodAt(o.Start); periods[per.ID] == nil {
			periods[per.ID] = &PeriodRollup{TenantID: t.ID, Period: per}
		}
	}
	for _, r := range periods {
		r.Plan = t.Plan
		for _, o := range old {
			if !o.Start.Before(r.Period.End) {
				break
			}
			if o.Plan != "" {
				r.Plan = o.Plan
			}
		}
	}
}

func insertRollups(ctx context.Context, tx pgx.Tx, tenant string, hours map[time.Time]*Rollup, days map[string]*Rollup, periods map[string]*PeriodRollup) error {
	var hs []time.Time
	var hSteps, hTok, hCost []int64
	for h, r := range hours {
		hs, hSteps, hTok, hCost = append(hs, h), append(hSteps, r.Steps), append(hTok, r.Tokens), append(hCost, r.CostMicro)
	}
	if _, err := tx.Exec(ctx, `
		INSERT INTO usage_rollup_hourly (tenant_id, hour, steps, tokens, cost_micro_usd)
		SELECT $1, * FROM unnest($2::timestamptz[], $3::bigint[], $4::bigint[], $5::bigint[])`,
		tenant, hs, hSteps, hTok, hCost); err != nil {
		return err
	}
	var ds []string
	var dSteps, dTok, dCost []int64
	for d, r := range days {
		ds, dSteps, dTok, dCost = append(ds, d), append(dSteps, r.Steps), append(dTok, r.Tokens), append(dCost, r.CostMicro)
	}
	if _, err := tx.Exec(ctx, `
		INSERT INTO usage_rollup_daily (tenant_id, day, steps, tokens, cost_micro_usd)
		SELECT $1, d::date, s, t, c FROM unnest($2::text[], $3::bigint[], $4::bigint[], $5::bigint[]) AS u(d, s, t, c)`,
		tenant, ds, dSteps, dTok, dCost); err != nil {
		return err
	}
	var ps, pe []time.Time
	var pid, plan []string
	var pSteps, pTok, pCost []int64
	for _, r := range periods {
		ps, pe, pid, plan = append(ps, r.Period.Start), append(pe, r.Period.End), append(pid, r.Period.ID), append(plan, r.Plan)
		pSteps, pTok, pCost = append(pSteps, r.Steps), append(pTok, r.Tokens), append(pCost, r.CostMicro)
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO usage_rollup_period (tenant_id, period_start, period_end, period_id, steps, tokens, cost_micro_usd, plan)
		SELECT $1, * FROM unnest($2::timestamptz[], $3::timestamptz[], $4::text[], $5::bigint[], $6::bigint[], $7::bigint[], $8::text[])`,
		tenant, ps, pe, pid, pSteps, pTok, pCost, plan)
	return err
}

// TenantRollups is every rollup row of one tenant: what rebuilds are checked against.
type TenantRollups struct {
	Hours   []HourRollup
	Days    []DayRollup
	Periods []PeriodRollup
}

// UnscopedTenantRollups reads every rollup row of a tenant, in time order.
func (s *Store) UnscopedTenantRollups(ctx context.Context, tenantID string) (TenantRollups, error) {
	var out TenantRollups
	var err error
	rows, err := s.db.Query(ctx, `SELECT hour, steps, tokens, cost_micro_usd FROM usage_rollup_hourly WHERE tenant_id = $1 ORDER BY hour`, tenantID)
	if out.Hours, err = collect(rows, err, func(row pgx.Row) (HourRollup, error) {
		r := HourRollup{TenantID: tenantID}
		err := row.Scan(&r.Hour, &r.Steps, &r.Tokens, &r.CostMicro)
		r.Hour = r.Hour.UTC()
		return r, err
	}); err != nil {
		return out, err
	}
	rows, err = s.db.Query(ctx, `SELECT to_char(day, 'YYYY-MM-DD'), steps, tokens, cost_micro_usd FROM usage_rollup_daily WHERE tenant_id = $1 ORDER BY day`, tenantID)
	if out.Days, err = collect(rows, err, func(row pgx.Row) (DayRollup, error) {
		r := DayRollup{TenantID: tenantID}
		err := row.Scan(&r.Day, &r.Steps, &r.Tokens, &r.CostMicro)
		return r, err
	}); err != nil {
		return out, err
	}
	rows, err = s.db.Query(ctx, `SELECT period_start, period_end, period_id, plan, steps, tokens, cost_micro_usd FROM usage_rollup_period WHERE tenant_id = $1 ORDER BY period_start`, tenantID)
	out.Periods, err = collect(rows, err, scanPeriodRollup(tenantID))
	return out, err
}

func scanPeriodRollup(tenantID string) func(pgx.Row) (PeriodRollup, error) {
	return func(row pgx.Row) (PeriodRollup, error) {
		r := PeriodRollup{TenantID: tenantID}
		err := row.Scan(&r.Period.Start, &r.Period.End, &r.Period.ID, &r.Plan, &r.Steps, &r.Tokens, &r.CostMicro)
		r.Period.Start, r.Period.End = r.Period.Start.UTC(), r.Period.End.UTC()
		return r, err
	}
}

// PeriodOf names one tenant's billing period by its start.
type PeriodOf struct {
	TenantID string
	Start    time.Time
}

// UnscopedPeriodRollups returns the period rollups of the named (tenant, period start)
// pairs, in one query, keyed by tenant. A pair without a row has zero use and the plan
// of the tenant's latest row before it (the plan in force then: every plan change
// writes a row of its period); it is absent when the tenant has no such row either.
// The usage export reads it.
func (s *Store) UnscopedPeriodRollups(ctx context.Context, periods []PeriodOf) (map[string]PeriodRollup, error) {
	ids := make([]string, len(periods))
	starts := make([]time.Time, len(periods))
	for i, p := range periods {
		ids[i], starts[i] = p.TenantID, p.Start
	}
	rows, err := s.db.Query(ctx, `
		SELECT w.tenant_id, r.period_start, r.period_end, r.period_id, COALESCE(r.plan, b.plan),
			COALESCE(r.steps, 0), COALESCE(r.tokens, 0), COALESCE(r.cost_micro_usd, 0)
		FROM unnest($1::text[], $2::timestamptz[]) AS w(tenant_id, start_at)
		LEFT JOIN usage_rollup_period r ON r.tenant_id = w.tenant_id AND r.period_start = w.start_at
		LEFT JOIN LATERAL (SELECT e.plan FROM usage_rollup_period e
			WHERE e.tenant_id = w.tenant_id AND e.period_start < w.start_at AND e.plan <> ''
			ORDER BY e.period_start DESC LIMIT 1) b ON r.tenant_id IS NULL
		WHERE r.tenant_id IS NOT NULL OR b.plan IS NOT NULL`, ids, starts)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string]PeriodRollup, len(periods))
	for rows.Next() {
		var tenant string
		var r PeriodRollup
		var start, end *time.Time
		var id *string
		if err := rows.Scan(&tenant, &start, &end, &id, &r.Plan, &r.Steps, &r.Tokens, &r.CostMicro); err != nil {
			return nil, err
		}
		if start != nil {
			r.Period.Start, r.Period.End, r.Period.ID = *start, *end, *id
		}
		r.TenantID = tenant
		r.Period.Start, r.Period.End = r.Period.Start.UTC(), r.Period.End.UTC()
		out[tenant] = r
	}
	return out, rows.Err()
}

// UnscopedLedgerTotals sums a tenant's ledger rows recorded in [from, to): the truth a
// rollup or an export is checked against.
func (s *Store) UnscopedLedgerTotals(ctx context.Context, tenantID string, from, to time.Time) (Rollup, error) {
	rows, err := s.db.Query(ctx, `
		SELECT meter, sum(quantity)::bigint FROM usage_ledger
		WHERE tenant_id = $1 AND recorded_at >= $2 AND recorded_at < $3 GROUP BY meter`, tenantID, from, to)
	if err != nil {
		return Rollup{}, err
	}
	defer rows.Close()
	var r Rollup
	for rows.Next() {
		var meter string
		var n int64
		if err := rows.Scan(&meter, &n); err != nil {
			return Rollup{}, err
		}
		r.add(meter, n)
	}
	return r, rows.Err()
}

// PlanChangeParams name a tenant whose plan just changed, as it is now (its UpdatedAt
// the time of the change), and the plan it had before.
type PlanChangeParams struct {
	Tenant  Tenant
	OldPlan string
}

// UnscopedRecordPlanChange records a change of a tenant's plan in its period rollups,
// on the transaction that changes it: the period the change falls in takes the new
// plan (a row without use if it has none yet), and the tenant's first period gets a row
// with the old plan unless it has one: only the first change of all finds none, and
// the plan it replaces was in force from the tenant's creation. So every period keeps
// the plan in force in it (see UnscopedPeriodRollups). It holds the tenant's
// rollups exclusively, as a rebuild does: a step recorded meanwhile waits, then reads
// the tenant with its new plan.
func (s *Store) UnscopedRecordPlanChange(ctx context.Context, p PlanChangeParams) error {
	t := p.Tenant
	if t.ID == "" {
		return ErrNoTenant
	}
	a := t.Anchor()
	cur, first := a.PeriodAt(t.UpdatedAt), a.PeriodAt(t.CreatedAt)
	return s.inTransaction(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(`+rollupLock+`)`, t.ID); err != nil {
			return err
		}
		if first.Start.Before(cur.Start) {
			if _, err := tx.Exec(ctx, `
				INSERT INTO usage_rollup_period (tenant_id, period_start, period_end, period_id, plan)
				VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant_id, period_start) DO NOTHING`,
				t.ID, first.Start, first.End, first.ID, p.OldPlan); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `
			INSERT INTO usage_rollup_period (tenant_id, period_start, period_end, period_id, plan)
			VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (tenant_id, period_start) DO UPDATE SET plan = EXCLUDED.plan`,
			t.ID, cur.Start, cur.End, cur.ID, t.Plan)
		return err
	})
}

// UnscopedHoldRollups takes the exclusive rollup lock of each of a page of tenants, in
// id order, on s's transaction (as a rebuild does; see the top of this file): until
// it ends no step of theirs is recorded, so their ledger holds still. A step being
// recorded is waited for, at most wait; longer fails with ErrBusy.
func (s *Store) UnscopedHoldRollups(ctx context.Context, tenants []string, wait time.Duration) error {
	return s.inTransaction(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, fmt.Sprintf("%dms", max(wait.Milliseconds(), 1))); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `
			SELECT pg_advisory_xact_lock(`+rollupLockOf("t.id")+`)
			FROM (SELECT DISTINCT unnest($1::text[]) AS id ORDER BY 1) t`, tenants)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "55P03" { // lock_not_available
			return fmt.Errorf("store: the rollups of a page of tenants: %w", ErrBusy)
		}
		return err
	})
}
