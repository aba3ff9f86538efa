package store

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The tenant-scoped reads of the usage report (GET /v1/usage) and the tenant panel:
// a tenant's latest events, its daily rollups over a range, and its live tasks.

// MaxRecentEvents bounds the events RecentEventsAndDailyRollups reads.
const MaxRecentEvents = 100

// RecentEventsParams select a tenant's latest events of Type (any when empty), at
// most Limit (MaxRecentEvents when 0 or above it).
type RecentEventsParams struct {
	TenantID string
	Type     string
	Limit    int
}

func (p RecentEventsParams) bounded() RecentEventsParams {
	if p.Limit <= 0 || p.Limit > MaxRecentEvents {
		p.Limit = MaxRecentEvents
	}
	return p
}

const recentEventsSQL = `
		SELECT seq, id, tenant_id, type, dedupe_key, payload, created_at FROM events
		WHERE tenant_id = $1 AND ($2 = '' OR type = $2)
		ORDER BY seq DESC LIMIT $3`

func scanRecentEvent(row pgx.Row) (Event, error) {
	var e Event
	err := row.Scan(&e.Cursor.Seq, &e.ID, &e.TenantID, &e.Type, &e.DedupeKey, &e.Payload, &e.CreatedAt)
	return e, err
}

// DailyRollupsParams select a tenant's daily rollups for the days of its zone from
// From to To, both included ("2026-11-15").
type DailyRollupsParams struct {
	TenantID string
	From, To string
}

const dailyRollupsSQL = `
		SELECT to_char(day, 'YYYY-MM-DD'), steps, tokens, cost_micro_usd FROM usage_rollup_daily
		WHERE tenant_id = $1 AND day >= $2::date AND day <= $3::date ORDER BY day`

func scanDayRollup(tenantID string) func(pgx.Row) (DayRollup, error) {
	return func(row pgx.Row) (DayRollup, error) {
		r := DayRollup{TenantID: tenantID}
		err := row.Scan(&r.Day, &r.Steps, &r.Tokens, &r.CostMicro)
		return r, err
	}
}

// RecentEventsAndDailyRollups returns the tenant's latest events, newest first (by
// write order), and its daily rollups in the range, in day order (a day without use
// has no row): the usage report's reads, in one round trip (a pipeline of both
// statements). Unlike the feeds it also shows events whose transaction committed
// after an older one still running: it is a view of the moment, not a cursor to
// resume from.
func (s *Store) RecentEventsAndDailyRollups(ctx context.Context, ev RecentEventsParams, days DailyRollupsParams) ([]Event, []DayRollup, error) {
	if ev.TenantID == "" || days.TenantID == "" {
		return nil, nil, ErrNoTenant
	}
	ev = ev.bounded()
	b := &pgx.Batch{}
	b.Queue(recentEventsSQL, ev.TenantID, ev.Type, ev.Limit)
	b.Queue(dailyRollupsSQL, days.TenantID, days.From, days.To)
	br := s.db.SendBatch(ctx, b)
	defer func() { _ = br.Close() }() // early returns; the success path checks it
	rows, err := br.Query()
	evs, err := collect(rows, err, scanRecentEvent)
	if err != nil {
		return nil, nil, interpretError(err)
	}
	rows, err = br.Query()
	rollups, err := collect(rows, err, scanDayRollup(days.TenantID))
	if err != nil {
		return nil, nil, interpretError(err)
	}
	return evs, rollups, interpretError(br.Close())
}

// LiveTasksParams select a tenant's running and queued tasks, at most Limit of them.
type LiveTasksParams struct {
	TenantID string
	Limit    int
}

// PanelTask is a live task as the usage report shows it.
type PanelTask struct {
	ID        uuid.UUID
	TenantID  string
	Agent     string
	User      string
	State     TaskState
	CreatedAt time.Time
	StartedAt *time.Time
	// WaitReason and WaitUntil: a queued task parked for token capacity.
	WaitReason *string
	WaitUntil  *time.Time
	// ParentID is its parent (nil for a root), Children the tasks it spawned.
	ParentID *uuid.UUID
	Children int
}

// LiveTasks is a tenant's running and queued tasks: how many of each, and the first
// Limit of them, running before queued, oldest first (by id: a UUIDv7 orders by the
// submission's time) within each.
type LiveTasks struct {
	Running, Queued int64
	Tasks           []PanelTask
}

// ListLiveTasks returns the tenant's live tasks. Panels poll it, so it is one
// statement (one round trip, and counts and list from one snapshot) reading only the
// columns the report shows: the counts walk the tenant's live entries of its state
// index, and each branch of the list reads Limit of them, however deep the queue is.
func (s *Store) ListLiveTasks(ctx context.Context, p LiveTasksParams) (LiveTasks, error) {
	var out LiveTasks
	if p.TenantID == "" {
		return out, ErrNoTenant
	}
	if p.Limit <= 0 {
		return out, fmt.Errorf("store: live tasks limit %d, want > 0", p.Limit)
	}
	// Running before queued, oldest first within each: the order of the report.
	rows, err := s.db.Query(ctx, `
		WITH n AS (
			SELECT count(*) FILTER (WHERE state = 'running') AS running, count(*) FILTER (WHERE state = 'queued') AS queued
			FROM tasks WHERE tenant_id = $1 AND state IN ('running', 'queued')
		), listed AS (
			(SELECT id, agent, user_id, state, created_at, started_at, wait_reason, wait_until, parent_id, children FROM tasks
			 WHERE tenant_id = $1 AND state = 'running' ORDER BY id LIMIT $2)
			UNION ALL
			(SELECT id, agent, user_id, state, created_at, started_at, wait_reason, wait_until, parent_id, children FROM tasks
			 WHERE tenant_id = $1 AND state = 'queued' ORDER BY id LIMIT $2)
		)
		SELECT n.running, n.queued, listed.id, listed.agent, listed.user_id, listed.state, listed.created_at, listed.started_at,
			listed.wait_reason, listed.wait_until, listed.parent_id, listed.children
		FROM n LEFT JOIN listed ON true
		ORDER BY listed.state <> 'running', listed.id LIMIT $2`, p.TenantID, p.Limit)
	// Every row carries the counts; without a live task the one row is the counts'
	// alone, its task columns null.
	got, err := collect(rows, err, func(row pgx.Row) (*PanelTask, error) {
		var id, parent *uuid.UUID
		var agent, user, state, waitReason *string
		var created, started, waitUntil *time.Time
		var children *int
		if err := row.Scan(&out.Running, &out.Queued, &id, &agent, &user, &state, &created, &started, &waitReason, &waitUntil,
			&parent, &children); err != nil || id == nil {
			return nil, err
		}
		return &PanelTask{ID: *id, TenantID: p.TenantID, Agent: *agent, User: *user, State: TaskState(*state),
			CreatedAt: *created, StartedAt: started, WaitReason: waitReason, WaitUntil: waitUntil, ParentID: parent, Children: *children}, nil
	})
	if err != nil {
		return out, err
	}
	for _, t := range got {
		if t != nil {
			out.Tasks = append(out.Tasks, *t)
		}
	}
	return out, nil
}
