// Package store is agentq's Postgres data access: tenants, API keys and tasks. Every
// call takes one params struct, so tenant scoping is explicit at each call site.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/agentq/agentq/quotas"
)

// Errors callers match with errors.Is.
var (
	ErrNotFound = errors.New("store: not found")
	ErrConflict = errors.New("store: already exists")
	// ErrLostClaim: a worker's write named an attempt the task has moved past (another
	// worker took it over, or the janitor re-queued it). Nothing was written; the task,
	// its lease and its dispatch slots belong to the new owner.
	ErrLostClaim = errors.New("store: the task's claim passed to another attempt")
	// ErrTaskEnded: the task reached a terminal state (cancelled, abandoned) while the
	// worker held its claim. Nothing was written.
	ErrTaskEnded = errors.New("store: the task is no longer running")
)

// Store wraps a pgx pool.
type Store struct {
	pool *pgxpool.Pool
}

// New returns a Store on pool.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// Pool exposes the pool for migrations and health checks.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Ping checks that Postgres answers.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

func isForeignKeyViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23503"
}

// --- tenants ---------------------------------------------------------------------

// Tenant is a customer of the deployment.
type Tenant struct {
	ID        string                  `json:"id"`
	Name      string                  `json:"name"`
	Plan      string                  `json:"plan"`
	Weight    *int                    `json:"weight"`
	Overrides map[string]quotas.Limit `json:"overrides"`
	Status    string                  `json:"status"`
	CreatedAt time.Time               `json:"created_at"`
	UpdatedAt time.Time               `json:"updated_at"`
}

const tenantCols = `id, name, plan, weight, overrides, status, created_at, updated_at`

func scanTenant(row pgx.Row) (Tenant, error) {
	var t Tenant
	var ov []byte
	if err := row.Scan(&t.ID, &t.Name, &t.Plan, &t.Weight, &ov, &t.Status, &t.CreatedAt, &t.UpdatedAt); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return t, ErrNotFound
		}
		return t, err
	}
	t.Overrides = map[string]quotas.Limit{}
	if err := json.Unmarshal(ov, &t.Overrides); err != nil {
		return t, fmt.Errorf("store: tenant %s overrides: %w", t.ID, err)
	}
	return t, nil
}

// CreateTenantParams are the fields of a new tenant.
type CreateTenantParams struct {
	ID        string
	Name      string
	Plan      string
	Weight    *int
	Overrides map[string]quotas.Limit
}

// CreateTenant inserts a tenant; ErrConflict if the id is taken.
func (s *Store) CreateTenant(ctx context.Context, p CreateTenantParams) (Tenant, error) {
	ov, err := json.Marshal(nonNil(p.Overrides))
	if err != nil {
		return Tenant{}, err
	}
	t, err := scanTenant(s.pool.QueryRow(ctx,
		`INSERT INTO tenants (id, name, plan, weight, overrides) VALUES ($1, $2, $3, $4, $5) RETURNING `+tenantCols,
		p.ID, p.Name, p.Plan, p.Weight, ov))
	if isUniqueViolation(err) {
		return t, fmt.Errorf("tenant %q: %w", p.ID, ErrConflict)
	}
	return t, err
}

// GetTenant returns a tenant by id.
func (s *Store) GetTenant(ctx context.Context, id string) (Tenant, error) {
	return scanTenant(s.pool.QueryRow(ctx, `SELECT `+tenantCols+` FROM tenants WHERE id = $1`, id))
}

// ListTenants returns every tenant, ordered by id.
func (s *Store) ListTenants(ctx context.Context) ([]Tenant, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+tenantCols+` FROM tenants ORDER BY id`)
	return collect(rows, err, scanTenant)
}

// UpdateTenantParams changes the non-nil fields of a tenant. Overrides, when set,
// replace the whole override map.
type UpdateTenantParams struct {
	ID        string
	Name      *string
	Plan      *string
	Weight    *int
	Overrides map[string]quotas.Limit
	Status    *string
}

// UpdateTenant applies p and returns the tenant as stored.
func (s *Store) UpdateTenant(ctx context.Context, p UpdateTenantParams) (Tenant, error) {
	var ov []byte
	if p.Overrides != nil {
		var err error
		if ov, err = json.Marshal(p.Overrides); err != nil {
			return Tenant{}, err
		}
	}
	return scanTenant(s.pool.QueryRow(ctx, `
		UPDATE tenants SET
			name = COALESCE($2, name),
			plan = COALESCE($3, plan),
			weight = COALESCE($4, weight),
			overrides = COALESCE($5::jsonb, overrides),
			status = COALESCE($6, status),
			updated_at = now()
		WHERE id = $1 RETURNING `+tenantCols,
		p.ID, p.Name, p.Plan, p.Weight, ov, p.Status))
}

// collect scans every row of a query with scan.
func collect[T any](rows pgx.Rows, err error, scan func(pgx.Row) (T, error)) ([]T, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		t, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

func nonNil[M ~map[K]V, K comparable, V any](m M) M {
	if m == nil {
		return M{}
	}
	return m
}

// --- API keys --------------------------------------------------------------------

// Scopes restrict what a key may do; empty lists mean "all".
type Scopes struct {
	Agents     []string `json:"agents,omitempty"`
	Principals []string `json:"principals,omitempty"`
}

// APIKey is a key's stored record: never the secret, only its hash.
type APIKey struct {
	Kid        string     `json:"kid"`
	TenantID   string     `json:"tenant_id"`
	SecretHash []byte     `json:"-"`
	Scopes     Scopes     `json:"scopes"`
	CreatedAt  time.Time  `json:"created_at"`
	RotatedAt  *time.Time `json:"rotated_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
}

const keyCols = `kid, tenant_id, secret_hash, scopes, created_at, rotated_at, revoked_at`

func scanKey(row pgx.Row) (APIKey, error) {
	var k APIKey
	var sc []byte
	if err := row.Scan(&k.Kid, &k.TenantID, &k.SecretHash, &sc, &k.CreatedAt, &k.RotatedAt, &k.RevokedAt); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return k, ErrNotFound
		}
		return k, err
	}
	if err := json.Unmarshal(sc, &k.Scopes); err != nil {
		return k, fmt.Errorf("store: key %s scopes: %w", k.Kid, err)
	}
	return k, nil
}

// CreateKeyParams are the fields of a new API key.
type CreateKeyParams struct {
	Kid        string
	TenantID   string
	SecretHash []byte
	Scopes     Scopes
}

// CreateKey inserts a key; ErrNotFound if the tenant does not exist.
func (s *Store) CreateKey(ctx context.Context, p CreateKeyParams) (APIKey, error) {
	sc, err := json.Marshal(p.Scopes)
	if err != nil {
		return APIKey{}, err
	}
	k, err := scanKey(s.pool.QueryRow(ctx,
		`INSERT INTO api_keys (kid, tenant_id, secret_hash, scopes) VALUES ($1, $2, $3, $4) RETURNING `+keyCols,
		p.Kid, p.TenantID, p.SecretHash, sc))
	switch {
	case isForeignKeyViolation(err):
		return k, fmt.Errorf("tenant %q: %w", p.TenantID, ErrNotFound)
	case isUniqueViolation(err):
		return k, fmt.Errorf("key %q: %w", p.Kid, ErrConflict)
	}
	return k, err
}

// GetKey returns a key by kid, revoked or not.
func (s *Store) GetKey(ctx context.Context, kid string) (APIKey, error) {
	return scanKey(s.pool.QueryRow(ctx, `SELECT `+keyCols+` FROM api_keys WHERE kid = $1`, kid))
}

// ListKeys returns a tenant's keys.
func (s *Store) ListKeys(ctx context.Context, tenantID string) ([]APIKey, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+keyCols+` FROM api_keys WHERE tenant_id = $1 ORDER BY created_at`, tenantID)
	return collect(rows, err, scanKey)
}

// RotateKeyParams replace a live key's secret.
type RotateKeyParams struct {
	Kid        string
	SecretHash []byte
}

// RotateKey stores a new secret hash for a key that is not revoked.
func (s *Store) RotateKey(ctx context.Context, p RotateKeyParams) (APIKey, error) {
	return scanKey(s.pool.QueryRow(ctx,
		`UPDATE api_keys SET secret_hash = $2, rotated_at = now() WHERE kid = $1 AND revoked_at IS NULL RETURNING `+keyCols,
		p.Kid, p.SecretHash))
}

// RevokeKey marks a live key revoked; ErrNotFound if there is no live key by that kid.
func (s *Store) RevokeKey(ctx context.Context, kid string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE kid = $1 AND revoked_at IS NULL`, kid)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// --- tasks -----------------------------------------------------------------------

// Task states.
const (
	StateQueued         = "queued"
	StateRunning        = "running"
	StateCompleted      = "completed"
	StateFailed         = "failed"
	StateKilled         = "killed"
	StateBudgetExceeded = "budget_exceeded"
	StateAbandoned      = "abandoned"
)

// TaskStates lists every state, for validating filters.
var TaskStates = []string{StateQueued, StateRunning, StateCompleted, StateFailed, StateKilled, StateBudgetExceeded, StateAbandoned}

// Terminal reports whether a state is final.
func Terminal(state string) bool {
	switch state {
	case StateCompleted, StateFailed, StateKilled, StateBudgetExceeded, StateAbandoned:
		return true
	}
	return false
}

// Usage is what a task has consumed so far. Money is kept in micro-dollars.
type Usage struct {
	Steps        int   `json:"steps"`
	Tokens       int64 `json:"tokens"`
	CostMicroUSD int64 `json:"-"`
}

// Task is a task row.
type Task struct {
	ID             uuid.UUID
	TenantID       string
	Kid            string
	Agent          string
	User           string
	Input          json.RawMessage
	Budget         json.RawMessage
	Priority       int
	IdempotencyKey *string
	RequestHash    []byte
	State          string
	AgentState     json.RawMessage
	Output         json.RawMessage
	Error          *string
	Usage          Usage
	Attempt        int
	CreatedAt      time.Time
	StartedAt      *time.Time
	FinishedAt     *time.Time
}

const taskCols = `id, tenant_id, kid, agent, user_id, input, budget, priority, idempotency_key, request_hash,
	state, agent_state, output, error, steps, tokens, cost_micro_usd, attempt, created_at, started_at, finished_at`

func scanTask(row pgx.Row) (Task, error) {
	var t Task
	var input, budget, agentState, output []byte
	err := row.Scan(&t.ID, &t.TenantID, &t.Kid, &t.Agent, &t.User, &input, &budget, &t.Priority, &t.IdempotencyKey,
		&t.RequestHash, &t.State, &agentState, &output, &t.Error, &t.Usage.Steps, &t.Usage.Tokens,
		&t.Usage.CostMicroUSD, &t.Attempt, &t.CreatedAt, &t.StartedAt, &t.FinishedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, ErrNotFound
	}
	t.Input, t.Budget, t.AgentState, t.Output = input, budget, agentState, output
	return t, err
}

// InsertTaskParams are the fields of a new task. ID must be a UUIDv7.
type InsertTaskParams struct {
	ID             uuid.UUID
	TenantID       string
	Kid            string
	Agent          string
	User           string
	Input          json.RawMessage
	Budget         json.RawMessage
	Priority       int
	IdempotencyKey string // "" for none
	RequestHash    []byte
}

// InsertTask writes a queued task. With an idempotency key already used by the tenant,
// it writes nothing and returns the existing task with created=false.
func (s *Store) InsertTask(ctx context.Context, p InsertTaskParams) (t Task, created bool, err error) {
	var idem *string
	if p.IdempotencyKey != "" {
		idem = &p.IdempotencyKey
	}
	t, err = scanTask(s.pool.QueryRow(ctx, `
		INSERT INTO tasks (id, tenant_id, kid, agent, user_id, input, budget, priority, idempotency_key, request_hash)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
		ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
		RETURNING `+taskCols,
		p.ID, p.TenantID, p.Kid, p.Agent, p.User, []byte(p.Input), []byte(p.Budget), p.Priority, idem, p.RequestHash))
	if err == nil {
		return t, true, nil
	}
	if !errors.Is(err, ErrNotFound) || idem == nil {
		return t, false, err
	}
	t, err = scanTask(s.pool.QueryRow(ctx,
		`SELECT `+taskCols+` FROM tasks WHERE tenant_id = $1 AND idempotency_key = $2`, p.TenantID, *idem))
	return t, false, err
}

// GetTaskParams name a task within a tenant. An empty TenantID reads across tenants
// (workers and operators only).
type GetTaskParams struct {
	TenantID string
	ID       uuid.UUID
}

// GetTask returns one task; ErrNotFound for another tenant's task.
func (s *Store) GetTask(ctx context.Context, p GetTaskParams) (Task, error) {
	return scanTask(s.pool.QueryRow(ctx,
		`SELECT `+taskCols+` FROM tasks WHERE id = $1 AND ($2 = '' OR tenant_id = $2)`, p.ID, p.TenantID))
}

// ListTasksParams select a page of a tenant's tasks, newest first.
type ListTasksParams struct {
	TenantID string
	State    string    // "" for any
	Before   uuid.UUID // cursor: only ids below this one; uuid.Nil for the first page
	Limit    int
}

// ListTasks returns up to Limit tasks.
func (s *Store) ListTasks(ctx context.Context, p ListTasksParams) ([]Task, error) {
	var before any
	if p.Before != uuid.Nil {
		before = p.Before
	}
	rows, err := s.pool.Query(ctx, `
		SELECT `+taskCols+` FROM tasks
		WHERE tenant_id = $1 AND ($2 = '' OR state = $2) AND ($3::uuid IS NULL OR id < $3)
		ORDER BY id DESC LIMIT $4`, p.TenantID, p.State, before, p.Limit)
	return collect(rows, err, scanTask)
}

// CountTasks counts a tenant's tasks ("" counts all tenants'): tests use it to prove
// rejected requests wrote nothing.
func (s *Store) CountTasks(ctx context.Context, tenantID string) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE $1 = '' OR tenant_id = $1`, tenantID).Scan(&n)
	return n, err
}

// StartTask moves a queued task to running and counts the attempt. ok=false when the
// task is not queued (already running elsewhere, or terminal).
func (s *Store) StartTask(ctx context.Context, id uuid.UUID) (t Task, ok bool, err error) {
	t, err = scanTask(s.pool.QueryRow(ctx, `
		UPDATE tasks SET state = 'running', attempt = attempt + 1, started_at = COALESCE(started_at, now()), heartbeat_at = now()
		WHERE id = $1 AND state = 'queued' RETURNING `+taskCols, id))
	if errors.Is(err, ErrNotFound) {
		return t, false, nil
	}
	return t, err == nil, err
}

// Claim names the attempt of a running task that a worker holds: StartTask or
// TakeOverTask returned it. Every worker write carries it, so a worker that stalled
// past its lease cannot write over the attempt that replaced it.
type Claim struct {
	ID      uuid.UUID
	Attempt int
}

// claimLost says why a claimed write matched nothing: ErrTaskEnded when the task ended
// under this same attempt, ErrLostClaim otherwise.
func claimLost(state string, attempt, claimed int) error {
	if Terminal(state) && attempt == claimed {
		return ErrTaskEnded
	}
	return fmt.Errorf("%w (attempt %d, task at attempt %d, %s)", ErrLostClaim, claimed, attempt, state)
}

// whyUnclaimed reads the task to tell ErrTaskEnded from ErrLostClaim after a claimed
// write matched no row.
func (s *Store) whyUnclaimed(ctx context.Context, c Claim) error {
	var state string
	var attempt int
	err := s.pool.QueryRow(ctx, `SELECT state, attempt FROM tasks WHERE id = $1`, c.ID).Scan(&state, &attempt)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w (task %s is gone)", ErrLostClaim, c.ID)
	}
	if err != nil {
		return err
	}
	return claimLost(state, attempt, c.Attempt)
}

// RecordStepParams record the result of one finished step on a running task.
type RecordStepParams struct {
	ID         uuid.UUID
	Attempt    int // the worker's claim
	Step       int
	AgentState json.RawMessage
	Tokens     int64
	CostMicro  int64
}

// RecordStep adds one step's usage to the task, stores the agent's state and writes
// the step's ledger rows, in one transaction that first locks the task row: a cancel
// either commits before (the step is not written: ErrTaskEnded) or waits for it (the
// step is in the ledger and in the task's usage). ErrLostClaim when another attempt
// owns the task. Step is the step's number; a step already recorded (a retry whose
// first commit lost its reply) is not counted twice and returns nil.
func (s *Store) RecordStep(ctx context.Context, p RecordStepParams) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var tenant, state string
		var attempt, steps int
		err := tx.QueryRow(ctx, `SELECT tenant_id, state, attempt, steps FROM tasks WHERE id = $1 FOR UPDATE`, p.ID).
			Scan(&tenant, &state, &attempt, &steps)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w (task %s is gone)", ErrLostClaim, p.ID)
		}
		if err != nil {
			return err
		}
		if state != StateRunning || attempt != p.Attempt {
			return claimLost(state, attempt, p.Attempt)
		}
		if p.Step <= steps {
			return nil // recorded before
		}
		tag, err := tx.Exec(ctx, `
			INSERT INTO usage_ledger (task_id, step, meter, tenant_id, quantity)
			SELECT $1, $2, m.meter, $3, m.q FROM
				(VALUES ('steps', 1::bigint), ('tokens', $4::bigint), ('cost_micro_usd', $5::bigint)) AS m(meter, q)
			ON CONFLICT DO NOTHING`, p.ID, p.Step, tenant, p.Tokens, p.CostMicro)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return nil // recorded before
		}
		_, err = tx.Exec(ctx, `
			UPDATE tasks SET steps = steps + 1, tokens = tokens + $2, cost_micro_usd = cost_micro_usd + $3,
				agent_state = $4, heartbeat_at = now()
			WHERE id = $1`, p.ID, p.Tokens, p.CostMicro, []byte(p.AgentState))
		return err
	})
}

// LedgerRow is one (task, step, meter) usage row.
type LedgerRow struct {
	TaskID   uuid.UUID `json:"task_id"`
	Step     int       `json:"step"`
	Meter    string    `json:"meter"`
	TenantID string    `json:"tenant_id"`
	Quantity int64     `json:"quantity"`
}

// TaskLedger returns a task's ledger rows in step order.
func (s *Store) TaskLedger(ctx context.Context, taskID uuid.UUID) ([]LedgerRow, error) {
	rows, err := s.pool.Query(ctx, `SELECT task_id, step, meter, tenant_id, quantity FROM usage_ledger WHERE task_id = $1 ORDER BY step, meter`, taskID)
	return collect(rows, err, func(row pgx.Row) (LedgerRow, error) {
		var r LedgerRow
		err := row.Scan(&r.TaskID, &r.Step, &r.Meter, &r.TenantID, &r.Quantity)
		return r, err
	})
}

// FinishTaskParams move a task to a terminal state, from one of the states in From.
type FinishTaskParams struct {
	ID       uuid.UUID
	TenantID string // "" when the caller is a worker
	From     []string
	To       string
	Output   json.RawMessage
	Error    string
	// Attempt is the worker's claim; 0 for callers that end a task whatever attempt
	// runs it (a tenant's cancel, the janitor).
	Attempt int
}

// FinishTask performs the terminal transition. Exactly one caller wins it (ok=true);
// that caller owns the side effects of the end (lease release, events). With an
// Attempt, a task that another attempt owns gives ErrLostClaim, and one that already
// ended gives ok=false.
func (s *Store) FinishTask(ctx context.Context, p FinishTaskParams) (t Task, ok bool, err error) {
	if !Terminal(p.To) {
		return t, false, fmt.Errorf("store: %q is not a terminal state", p.To)
	}
	var errText *string
	if p.Error != "" {
		errText = &p.Error
	}
	var output []byte
	if len(p.Output) > 0 {
		output = p.Output
	}
	t, err = scanTask(s.pool.QueryRow(ctx, `
		UPDATE tasks SET state = $3, output = COALESCE($4, output), error = COALESCE($5, error), finished_at = now()
		WHERE id = $1 AND ($2 = '' OR tenant_id = $2) AND state = ANY($6) AND ($7 = 0 OR attempt = $7) RETURNING `+taskCols,
		p.ID, p.TenantID, p.To, output, errText, p.From, p.Attempt))
	if errors.Is(err, ErrNotFound) {
		if p.Attempt != 0 {
			if err := s.whyUnclaimed(ctx, Claim{ID: p.ID, Attempt: p.Attempt}); !errors.Is(err, ErrTaskEnded) {
				return t, false, err
			}
		}
		return t, false, nil
	}
	return t, err == nil, err
}

// RequeueTask puts a running task back to queued, keeping its recorded steps and agent
// state, so the next attempt resumes from there (worker shutdown before the step
// finished). ErrTaskEnded or ErrLostClaim when the claim no longer holds.
func (s *Store) RequeueTask(ctx context.Context, c Claim) error {
	tag, err := s.pool.Exec(ctx, `UPDATE tasks SET state = 'queued' WHERE id = $1 AND state = 'running' AND attempt = $2`, c.ID, c.Attempt)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return s.whyUnclaimed(ctx, c)
	}
	return nil
}

// GetTaskByIdempotencyKey returns the tenant's task submitted with key.
func (s *Store) GetTaskByIdempotencyKey(ctx context.Context, tenantID, key string) (Task, error) {
	return scanTask(s.pool.QueryRow(ctx,
		`SELECT `+taskCols+` FROM tasks WHERE tenant_id = $1 AND idempotency_key = $2`, tenantID, key))
}

// TakeOverTask claims a running task whose worker stopped heartbeating for staleAfter
// (its process died; asynq redelivered it) and counts a new attempt. ok=false when the
// task is not running or its worker is alive.
func (s *Store) TakeOverTask(ctx context.Context, id uuid.UUID, staleAfter time.Duration) (t Task, ok bool, err error) {
	t, err = scanTask(s.pool.QueryRow(ctx, `
		UPDATE tasks SET attempt = attempt + 1, heartbeat_at = now()
		WHERE id = $1 AND state = 'running' AND heartbeat_at < now() - $2::interval RETURNING `+taskCols,
		id, fmt.Sprintf("%d milliseconds", staleAfter.Milliseconds())))
	if errors.Is(err, ErrNotFound) {
		return t, false, nil
	}
	return t, err == nil, err
}

// Heartbeat marks a running task's worker alive. ErrTaskEnded or ErrLostClaim when
// the claim no longer holds: the worker stops working on the task.
func (s *Store) Heartbeat(ctx context.Context, c Claim) error {
	tag, err := s.pool.Exec(ctx, `UPDATE tasks SET heartbeat_at = now() WHERE id = $1 AND state = 'running' AND attempt = $2`, c.ID, c.Attempt)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return s.whyUnclaimed(ctx, c)
	}
	return nil
}

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

// ListQueued returns a page of queued tasks across tenants, in id (admission) order.
func (s *Store) ListQueued(ctx context.Context, p ListQueuedParams) ([]QueuedTask, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT id, tenant_id, priority, created_at FROM tasks
		WHERE state = 'queued' AND created_at < now() - $1::interval AND id > $2
		ORDER BY id LIMIT $3`, fmt.Sprintf("%d milliseconds", p.MinAge.Milliseconds()), p.After, p.Limit)
	return collect(rows, err, func(row pgx.Row) (QueuedTask, error) {
		var q QueuedTask
		err := row.Scan(&q.ID, &q.TenantID, &q.Priority, &q.CreatedAt)
		return q, err
	})
}

// BulkInsertQueued writes many queued tasks at once with COPY (benchmarks and
// imports). Idempotency keys are not supported here.
func (s *Store) BulkInsertQueued(ctx context.Context, ps []InsertTaskParams) (int64, error) {
	rows := make([][]any, len(ps))
	for i, p := range ps {
		rows[i] = []any{p.ID, p.TenantID, p.Kid, p.Agent, p.User, []byte(p.Input), []byte(p.Budget), p.Priority, p.RequestHash}
	}
	return s.pool.CopyFrom(ctx, pgx.Identifier{"tasks"},
		[]string{"id", "tenant_id", "kid", "agent", "user_id", "input", "budget", "priority", "request_hash"},
		pgx.CopyFromRows(rows))
}

// TaskTiming is when a task was admitted, started and finished.
type TaskTiming struct {
	ID         uuid.UUID
	TenantID   string
	CreatedAt  time.Time
	StartedAt  *time.Time
	FinishedAt *time.Time
}

// TaskTimings returns the timings of every task of the given tenants.
func (s *Store) TaskTimings(ctx context.Context, tenants []string) ([]TaskTiming, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, tenant_id, created_at, started_at, finished_at FROM tasks WHERE tenant_id = ANY($1)`, tenants)
	return collect(rows, err, func(row pgx.Row) (TaskTiming, error) {
		var t TaskTiming
		err := row.Scan(&t.ID, &t.TenantID, &t.CreatedAt, &t.StartedAt, &t.FinishedAt)
		return t, err
	})
}

// --- HTTP agents -----------------------------------------------------------------

// Agent is an HTTP agent registered by the operator.
type Agent struct {
	Name         string            `json:"name"`
	URL          string            `json:"url"`
	StepTimeoutS float64           `json:"step_timeout_s"`
	Headers      map[string]string `json:"headers"`
	// SigningSecretCreatedAt is when the agent's own signing secret was made; nil
	// for an agent registered before per-agent secrets (signed with the shared one).
	SigningSecretCreatedAt *time.Time `json:"signing_secret_created_at"`
	CreatedAt              time.Time  `json:"created_at"`
	UpdatedAt              time.Time  `json:"updated_at"`
	// SigningSecret is the agent's own signing key ("" for such an agent). It is for
	// the worker only: never shown by reads, never logged.
	SigningSecret string `json:"-"`
}

const agentCols = `name, url, step_timeout_s, headers, signing_secret_created_at, created_at, updated_at, COALESCE(signing_secret, '')`

func scanAgent(row pgx.Row) (Agent, error) {
	a, _, err := scanAgentRow(row, false)
	return a, err
}

// scanAgentRow scans agentCols, and a trailing created flag when withCreated.
func scanAgentRow(row pgx.Row, withCreated bool) (a Agent, created bool, err error) {
	var h []byte
	dst := []any{&a.Name, &a.URL, &a.StepTimeoutS, &h, &a.SigningSecretCreatedAt, &a.CreatedAt, &a.UpdatedAt, &a.SigningSecret}
	if withCreated {
		dst = append(dst, &created)
	}
	if err := row.Scan(dst...); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return a, false, ErrNotFound
		}
		return a, false, err
	}
	a.Headers = map[string]string{}
	return a, created, json.Unmarshal(h, &a.Headers)
}

// PutAgentParams create or replace an HTTP agent.
type PutAgentParams struct {
	Name         string
	URL          string
	StepTimeoutS float64
	Headers      map[string]string
	// SigningSecret is stored when the agent is created; replacing an agent keeps
	// the secret it has.
	SigningSecret string
}

// PutAgent creates or replaces an agent; created reports which.
func (s *Store) PutAgent(ctx context.Context, p PutAgentParams) (a Agent, created bool, err error) {
	h, err := json.Marshal(nonNil(p.Headers))
	if err != nil {
		return a, false, err
	}
	return scanAgentRow(s.pool.QueryRow(ctx, `
		INSERT INTO agents (name, url, step_timeout_s, headers, signing_secret, signing_secret_created_at)
		VALUES ($1, $2, $3, $4, $5, now())
		ON CONFLICT (name) DO UPDATE SET url = $2, step_timeout_s = $3, headers = $4, updated_at = now()
		RETURNING `+agentCols+`, (xmax = 0)`, p.Name, p.URL, p.StepTimeoutS, h, p.SigningSecret), true)
}

// RotateAgentSecret replaces an agent's signing secret; ErrNotFound if there is no
// agent by that name.
func (s *Store) RotateAgentSecret(ctx context.Context, name, secret string) (Agent, error) {
	return scanAgent(s.pool.QueryRow(ctx, `
		UPDATE agents SET signing_secret = $2, signing_secret_created_at = now(), updated_at = now()
		WHERE name = $1 RETURNING `+agentCols, name, secret))
}

// GetAgent returns an HTTP agent by name.
func (s *Store) GetAgent(ctx context.Context, name string) (Agent, error) {
	return scanAgent(s.pool.QueryRow(ctx, `SELECT `+agentCols+` FROM agents WHERE name = $1`, name))
}

// ListAgents returns every HTTP agent, by name.
func (s *Store) ListAgents(ctx context.Context) ([]Agent, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+agentCols+` FROM agents ORDER BY name`)
	out, err := collect(rows, err, scanAgent)
	if out == nil && err == nil {
		out = []Agent{}
	}
	return out, err
}

// DeleteAgent removes an HTTP agent; ErrNotFound if there is none by that name.
func (s *Store) DeleteAgent(ctx context.Context, name string) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM agents WHERE name = $1`, name)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// --- janitor ---------------------------------------------------------------------

// StaleTask is a running task whose worker stopped heartbeating.
type StaleTask struct {
	ID       uuid.UUID
	TenantID string
	Priority int
	Attempt  int
}

// ListStaleRunning returns running tasks whose heartbeat is older than staleAfter.
func (s *Store) ListStaleRunning(ctx context.Context, staleAfter time.Duration, limit int) ([]StaleTask, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT id, tenant_id, priority, attempt FROM tasks
		WHERE state = 'running' AND heartbeat_at < now() - $1::interval ORDER BY id LIMIT $2`,
		fmt.Sprintf("%d milliseconds", staleAfter.Milliseconds()), limit)
	return collect(rows, err, func(row pgx.Row) (StaleTask, error) {
		var t StaleTask
		err := row.Scan(&t.ID, &t.TenantID, &t.Priority, &t.Attempt)
		return t, err
	})
}

// RequeueStale puts a running task whose heartbeat is older than staleAfter back to
// queued, keeping its recorded steps; created_at is kept, so it returns to its place.
func (s *Store) RequeueStale(ctx context.Context, id uuid.UUID, staleAfter time.Duration) (Task, bool, error) {
	t, err := scanTask(s.pool.QueryRow(ctx, `
		UPDATE tasks SET state = 'queued' WHERE id = $1 AND state = 'running' AND heartbeat_at < now() - $2::interval
		RETURNING `+taskCols, id, fmt.Sprintf("%d milliseconds", staleAfter.Milliseconds())))
	if errors.Is(err, ErrNotFound) {
		return t, false, nil
	}
	return t, err == nil, err
}

// LiveTask is a queued or running task, for reconciling Redis state.
type LiveTask struct {
	ID            uuid.UUID
	State         string
	Priority      int
	CreatedAt     time.Time
	MaxWallclockS float64
}

// LiveTasksOf returns the queued and running tasks of the given tenants, by tenant:
// one query for a page of tenants.
func (s *Store) LiveTasksOf(ctx context.Context, tenants []string) (map[string][]LiveTask, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT tenant_id, id, state, priority, created_at, COALESCE((budget->>'max_wallclock_s')::float8, 0) FROM tasks
		WHERE tenant_id = ANY($1) AND state IN ('queued', 'running')`, tenants)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][]LiveTask{}
	for rows.Next() {
		var tenant string
		var t LiveTask
		if err := rows.Scan(&tenant, &t.ID, &t.State, &t.Priority, &t.CreatedAt, &t.MaxWallclockS); err != nil {
			return nil, err
		}
		out[tenant] = append(out[tenant], t)
	}
	return out, rows.Err()
}

// TenantIDsAfter returns up to limit tenant ids above after, in id order: the
// janitor's cursor walk over every tenant.
func (s *Store) TenantIDsAfter(ctx context.Context, after string, limit int) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT id FROM tenants WHERE id > $1 ORDER BY id LIMIT $2`, after, limit)
	return collect(rows, err, func(row pgx.Row) (string, error) {
		var id string
		err := row.Scan(&id)
		return id, err
	})
}

// AnyTask reports whether any task was ever admitted: Redis state missing on a
// database without tasks is a first start, not a loss.
func (s *Store) AnyTask(ctx context.Context) (bool, error) {
	var ok bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM tasks)`).Scan(&ok)
	return ok, err
}

// TaskStates returns the states of the given tasks (absent ids are unknown).
func (s *Store) TaskStates(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, state FROM tasks WHERE id = ANY($1)`, ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[uuid.UUID]string{}
	for rows.Next() {
		var id uuid.UUID
		var st string
		if err := rows.Scan(&id, &st); err != nil {
			return nil, err
		}
		out[id] = st
	}
	return out, rows.Err()
}
