package store

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/agentq/agentq/agentqtype"
)

// Reads and sweeps across tenants: the maintenance passes (recovery, the janitor),
// benchmarks and tests. Every call here is unscoped.

// QueuedTask is what recovery needs to push a queued task back to its queue.
type QueuedTask struct {
	ID        uuid.UUID
	TenantID  string
	Priority  int
	CreatedAt time.Time
}

// ListQueuedParams select queued tasks older than MinAge, oldest first.
type ListQueuedParams struct {
	MinAge time.Duration
	After  uuid.UUID // cursor; uuid.Nil for the first page
	Limit  int
}

// UnscopedListQueued returns a page of queued tasks across tenants, in id (admission)
// order.
func (s *Store) UnscopedListQueued(ctx context.Context, p ListQueuedParams) ([]QueuedTask, error) {
	rows, err := s.db.Query(ctx, `
		SELECT id, tenant_id, priority, created_at FROM tasks
		WHERE state = 'queued' AND created_at < now() - $1::interval AND id > $2
		ORDER BY id LIMIT $3`, interval(p.MinAge), p.After, p.Limit)
	return collect(rows, err, func(row pgx.Row) (QueuedTask, error) {
		var q QueuedTask
		err := row.Scan(&q.ID, &q.TenantID, &q.Priority, &q.CreatedAt)
		return q, err
	})
}

// StaleTask is a running task whose worker stopped heartbeating.
type StaleTask struct {
	ID       uuid.UUID
	TenantID string
	Priority int
	Attempt  int
}

// UnscopedListStaleRunning returns running tasks, of any tenant, whose heartbeat is
// older than staleAfter.
func (s *Store) UnscopedListStaleRunning(ctx context.Context, staleAfter time.Duration, limit int) ([]StaleTask, error) {
	rows, err := s.db.Query(ctx, `
		SELECT id, tenant_id, priority, attempt FROM tasks
		WHERE state = 'running' AND heartbeat_at < now() - $1::interval ORDER BY id LIMIT $2`,
		interval(staleAfter), limit)
	return collect(rows, err, func(row pgx.Row) (StaleTask, error) {
		var t StaleTask
		err := row.Scan(&t.ID, &t.TenantID, &t.Priority, &t.Attempt)
		return t, err
	})
}

// UnscopedRequeueStale puts a running task whose heartbeat is older than staleAfter
// back to queued, keeping its recorded steps; created_at is kept, so it returns to its
// place. The task lifecycle calls it, for the janitor.
func (s *Store) UnscopedRequeueStale(ctx context.Context, id uuid.UUID, staleAfter time.Duration) (Task, bool, error) {
	t, err := scanTask(s.db.QueryRow(ctx, `
		UPDATE tasks SET state = 'queued' WHERE id = $1 AND state = 'running' AND heartbeat_at < now() - $2::interval
		RETURNING `+taskCols, id, interval(staleAfter)))
	if errors.Is(err, agentqtype.ErrNotFound) {
		return t, false, nil
	}
	return t, err == nil, err
}

// LiveTask is a queued or running task, for reconciling Redis state.
type LiveTask struct {
	ID            uuid.UUID
	State         TaskState
	Priority      int
	CreatedAt     time.Time
	MaxWallclockS float64
	// Spawned: a step spawned it (it has a parent), so it holds no session of its own.
	Spawned bool
}

// UnscopedLiveTasksOf returns the queued and running tasks of the given tenants, by tenant:
// one query for a page of tenants.
func (s *Store) UnscopedLiveTasksOf(ctx context.Context, tenants []string) (map[string][]LiveTask, error) {
	rows, err := s.db.Query(ctx, `
		SELECT tenant_id, id, state, priority, created_at, COALESCE((budget->>'max_wallclock_s')::float8, 0), parent_id IS NOT NULL FROM tasks
		WHERE tenant_id = ANY($1) AND state IN ('queued', 'running')`, tenants)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][]LiveTask{}
	for rows.Next() {
		var tenant string
		var t LiveTask
		if err := rows.Scan(&tenant, &t.ID, &t.State, &t.Priority, &t.CreatedAt, &t.MaxWallclockS, &t.Spawned); err != nil {
			return nil, err
		}
		out[tenant] = append(out[tenant], t)
	}
	return out, rows.Err()
}

// UnscopedAnyTask reports whether any task was ever admitted: Redis state missing on a
// database without tasks is a first start, not a loss.
func (s *Store) UnscopedAnyTask(ctx context.Context) (bool, error) {
	var ok bool
	err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM tasks)`).Scan(&ok)
	return ok, err
}

// UnscopedTaskStates returns the states of the given tasks, of any tenant (absent ids
// are unknown).
func (s *Store) UnscopedTaskStates(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]TaskState, error) {
	rows, err := s.db.Query(ctx, `SELECT id, state FROM tasks WHERE id = ANY($1)`, ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[uuid.UUID]TaskState{}
	for rows.Next() {
		var id uuid.UUID
		var st TaskState
		if err := rows.Scan(&id, &st); err != nil {
			return nil, err
		}
		out[id] = st
	}
	return out, rows.Err()
}

// UnscopedCountTasks counts every tenant's tasks: tests use it to prove a refused
// request wrote nothing anywhere.
func (s *Store) UnscopedCountTasks(ctx context.Context) (int, error) {
	var n int
	err := s.db.QueryRow(ctx, `SELECT count(*) FROM tasks`).Scan(&n)
	return n, err
}

// TaskTiming is when a task was admitted, started and finished.
type TaskTiming struct {
	ID         uuid.UUID
	TenantID   string
	CreatedAt  time.Time
	StartedAt  *time.Time
	FinishedAt *time.Time
}

// UnscopedTaskTimings returns the timings of every task of the given tenants (the
// fairness benchmark's measurement).
func (s *Store) UnscopedTaskTimings(ctx context.Context, tenants []string) ([]TaskTiming, error) {
	rows, err := s.db.Query(ctx, `SELECT id, tenant_id, created_at, started_at, finished_at FROM tasks WHERE tenant_id = ANY($1)`, tenants)
	return collect(rows, err, func(row pgx.Row) (TaskTiming, error) {
		var t TaskTiming
		err := row.Scan(&t.ID, &t.TenantID, &t.CreatedAt, &t.StartedAt, &t.FinishedAt)
		return t, err
	})
}

// PausedTask is a paused task as the pause watcher reads it.
type PausedTask struct {
	ID       uuid.UUID
	TenantID string
	Reason   string // the limit_type that paused it
	PausedAt time.Time
	Pauses   int
	// Limit and Used are the limit's value and the use that met it at the pause.
	Limit, Used int64
	// NextTokens and NextCostMicro are what the step the pause held back is expected
	// to take (0 when the pause kept nothing).
	NextTokens, NextCostMicro int64
}

// UnscopedQuotaPausedTenants lists the tenants with tasks paused by a period quota
// (agent_steps_daily, ai_tokens_monthly, usd_monthly), from their index.
func (s *Store) UnscopedQuotaPausedTenants(ctx context.Context) ([]string, error) {
	rows, err := s.db.Query(ctx, `SELECT DISTINCT tenant_id FROM tasks
		WHERE state = 'paused' AND paused_reason IN ('agent_steps_daily', 'ai_tokens_monthly', 'usd_monthly')`)
	return collect(rows, err, func(row pgx.Row) (string, error) {
		var id string
		err := row.Scan(&id)
		return id, err
	})
}

// UnscopedListQuotaPaused returns a tenant's tasks paused by a period quota, oldest
// pause first.
func (s *Store) UnscopedListQuotaPaused(ctx context.Context, tenantID string) ([]PausedTask, error) {
	rows, err := s.db.Query(ctx, `
		SELECT id, tenant_id, COALESCE(paused_reason, ''), COALESCE(paused_at, now()), pauses,
			COALESCE(pause_limit, 0), COALESCE(pause_used, 0),
			COALESCE(step_estimate, 0), COALESCE(step_cost_estimate, 0) FROM tasks
		WHERE tenant_id = $1 AND state = 'paused' AND paused_reason IN ('agent_steps_daily', 'ai_tokens_monthly', 'usd_monthly')
		ORDER BY paused_at`, tenantID)
	return collect(rows, err, func(row pgx.Row) (PausedTask, error) {
		var t PausedTask
		err := row.Scan(&t.ID, &t.TenantID, &t.Reason, &t.PausedAt, &t.Pauses, &t.Limit, &t.Used,
			&t.NextTokens, &t.NextCostMicro)
		return t, err
	})
}
