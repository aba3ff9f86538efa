package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/agentq/agentq/agentqtype"
)

// TaskState is a task's state as stored; the states and which of them are terminal
// are agentqtype's.
type TaskState = agentqtype.TaskState

// TaskStates lists every state, for validating filters.
var TaskStates = agentqtype.TaskStates()

// Usage is what a task has consumed so far. Money is kept in micro-dollars.
type Usage struct {
	Steps        int
	Tokens       int64
	CostMicroUSD int64
}

// Task is a task row: every column, the bookkeeping the API never shows among them
// (the key it came with, the request hash of its idempotency key, the agent's state
// between steps), money in micro-dollars and the budget as stored JSON. The task
// service adds why a queued task waits (tasks.Task); the API and the library show
// their own shapes of it.
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
	State          TaskState
	AgentState     json.RawMessage
	Output         json.RawMessage
	Error          *string
	Usage          Usage
	Attempt        int
	CreatedAt      time.Time
	StartedAt      *time.Time
	FinishedAt     *time.Time
	// Wait is set while a queued task waits for token capacity (see Park).
	Wait TaskWait
	// WaitedMs is the time the task has spent waiting for capacity or paused: its
	// wall-clock budget does not count it. A wait after a throttled answer is not in
	// it: the wall clock counts that.
	WaitedMs int64
	// Pause is set while the task is paused; Pause.Count counts its pauses so far.
	Pause TaskPause
	// StartDeadline is when the task expires if no worker has started it by then
	// (nil: it waits as long as it takes).
	StartDeadline *time.Time
	// ParentID is the task that spawned this one (nil: a root, or a task outside any
	// tree); RootID its tree's root (nil: the task is a root itself, see Root), Depth
	// its distance from the root; Children counts the tasks it spawned.
	ParentID, RootID *uuid.UUID
	Depth            int
	Children         int
	// Spawned is what the task's latest spawning step asked for and got (a
	// SpawnRecord as JSON; nil: it never spawned), carried to its next step.
	Spawned json.RawMessage
	// Resumed is, on a task a start just took out of a wait (UnscopedStartTask), what
	// it waited for and how long that wait was; nil otherwise.
	Resumed *ResumedWait
}

// Root is the id of the task's tree's root: its own for a root.
func (t Task) Root() uuid.UUID {
	if t.RootID != nil {
		return *t.RootID
	}
	return t.ID
}

// TaskPause is why a paused task is paused: the limit_type that paused it (Reason,
// nil when it is not paused), since when, the limit's value and the use that met it;
// Count is how many times the task has been paused, this pause included.
type TaskPause struct {
	Reason      *string
	At          *time.Time
	Limit, Used *int64
	Count       int
}

// ResumedWait is a wait a start ended: its reason (an agentqtype.WaitReason: the
// tenant's tokens a minute, a model pool, a throttled upstream) and its length, from
// the park to the start.
// Until is when its capacity was expected (its wait_until: the dispatcher queued the
// task again then), and ToUnparkMs its length from the park to Until, or to the start
// if that came first; the rest of WaitedMs the task waited on its queue.
type ResumedWait struct {
	Reason     string
	WaitedMs   int64
	Until      *time.Time
	ToUnparkMs int64
}

// TaskWait is what a task waits for while it is parked: the capacity (Reason, nil when
// it is not parked), when it is expected, and what its next step asks for: tokens
// (StepEstimate) and cost in micro-dollars (StepCostEstimate). The estimates are kept
// by a park and by a pause, for the delivery that resumes the task.
type TaskWait struct {
	Reason           *string
	Until            *time.Time
	StepEstimate     *int64
	StepCostEstimate *int64
	// ParkStep is the step count the task had when it last parked (nil: never), and
	// StepParks how many times it parked with that count: the parks of its next step
	// while ParkStep is its step count.
	ParkStep  *int
	StepParks int
}

const taskCols = `id, tenant_id, kid, agent, user_id, input, budget, priority, idempotency_key, request_hash,
	state, agent_state, output, error, steps, tokens, cost_micro_usd, attempt, created_at, started_at, finished_at,
	wait_reason, wait_until, waited_ms, step_estimate, paused_reason, paused_at, pause_limit, pause_used, pauses,
	start_deadline, park_step, step_parks, step_cost_estimate, parent_id, root_id, depth, children, spawned`

func scanTask(row pgx.Row) (Task, error) { return scanTaskWith(row) }

// scanTaskWith scans taskCols and then the columns after them into extra.
func scanTaskWith(row pgx.Row, extra ...any) (Task, error) {
	var t Task
	var input, budget, agentState, output, spawned []byte
	err := row.Scan(append([]any{&t.ID, &t.TenantID, &t.Kid, &t.Agent, &t.User, &input, &budget, &t.Priority, &t.IdempotencyKey,
		&t.RequestHash, &t.State, &agentState, &output, &t.Error, &t.Usage.Steps, &t.Usage.Tokens,
		&t.Usage.CostMicroUSD, &t.Attempt, &t.CreatedAt, &t.StartedAt, &t.FinishedAt,
		&t.Wait.Reason, &t.Wait.Until, &t.WaitedMs, &t.Wait.StepEstimate,
		&t.Pause.Reason, &t.Pause.At, &t.Pause.Limit, &t.Pause.Used, &t.Pause.Count, &t.StartDeadline,
		&t.Wait.ParkStep, &t.Wait.StepParks, &t.Wait.StepCostEstimate, &t.ParentID, &t.RootID, &t.Depth, &t.Children,
		&spawned}, extra...)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, agentqtype.ErrNotFound
	}
	t.Input, t.Budget, t.AgentState, t.Output, t.Spawned = input, budget, agentState, output, spawned
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
	// StartWithin, when above 0, gives the task a start deadline: its creation time
	// plus StartWithin.
	StartWithin time.Duration
}

// InsertTask writes a queued task. With an idempotency key already used by the tenant,
// it writes nothing and returns the existing task with created=false.
func (s *Store) InsertTask(ctx context.Context, p InsertTaskParams) (t Task, created bool, err error) {
	if p.TenantID == "" {
		return t, false, ErrNoTenant
	}
	var idem *string
	if p.IdempotencyKey != "" {
		idem = &p.IdempotencyKey
	}
	t, err = scanTask(s.db.QueryRow(ctx, `
		INSERT INTO tasks (id, tenant_id, kid, agent, user_id, input, budget, priority, idempotency_key, request_hash, start_deadline)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, `+startDeadlineOf("$11")+`)
		ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
		RETURNING `+taskCols,
		p.ID, p.TenantID, p.Kid, p.Agent, p.User, []byte(p.Input), []byte(p.Budget), p.Priority, idem, p.RequestHash,
		p.StartWithin.Milliseconds()))
	if err == nil {
		return t, true, nil
	}
	if !errors.Is(err, agentqtype.ErrNotFound) || idem == nil {
		return t, false, err
	}
	t, err = s.GetTaskByIdempotencyKey(ctx, GetTaskByIdempotencyKeyParams{TenantID: p.TenantID, Key: *idem})
	return t, false, err
}

// InsertTasks is InsertTask for many tasks in one statement: it writes them all as
// queued and returns those it wrote, in no particular order. A task whose idempotency
// key the tenant already used (or one given twice in ps) is not written and not
// returned: InsertTask answers it.
func (s *Store) InsertTasks(ctx context.Context, ps []InsertTaskParams) ([]Task, error) {
	n := len(ps)
	ids := make([]uuid.UUID, n)
	tenantIDs, kids, agents, users := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	inputs, budgets, idems := make([]string, n), make([]string, n), make([]*string, n)
	priorities := make([]int32, n)
	hashes := make([][]byte, n)
	within := make([]int64, n)
	for i, p := range ps {
		if p.TenantID == "" {
			return nil, fmt.Errorf("task %d of %d: %w", i+1, n, ErrNoTenant)
		}
		ids[i], tenantIDs[i], kids[i], agents[i], users[i] = p.ID, p.TenantID, p.Kid, p.Agent, p.User
		inputs[i], budgets[i], priorities[i], hashes[i] = string(p.Input), string(p.Budget), int32(p.Priority), p.RequestHash
		within[i] = p.StartWithin.Milliseconds()
		if p.IdempotencyKey != "" {
			idems[i] = &ps[i].IdempotencyKey
		}
	}
	// Two inserts: only the tasks with an idempotency key go through ON CONFLICT, which
	// makes every row it inserts a speculative insertion (a pre-check of the key's
	// index, and a second WAL record to confirm the row); the others are plain inserts.
	rows, err := s.db.Query(ctx, `
		WITH i AS (
			SELECT id, tenant_id, kid, agent, user_id, input::jsonb, budget::jsonb, priority, idempotency_key, request_hash,
				`+startDeadlineOf("within_ms")+` AS start_deadline
			FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::smallint[], $9::text[], $10::bytea[],
				$11::bigint[])
				AS i(id, tenant_id, kid, agent, user_id, input, budget, priority, idempotency_key, request_hash, within_ms)
		), plain AS (
			INSERT INTO tasks (`+insertCols+`)
			SELECT * FROM i WHERE idempotency_key IS NULL
			RETURNING `+taskCols+`
		), keyed AS (
			INSERT INTO tasks (`+insertCols+`)
			SELECT * FROM i WHERE idempotency_key IS NOT NULL
			ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
			RETURNING `+taskCols+`
		)
		SELECT * FROM plain UNION ALL SELECT * FROM keyed`,
		ids, tenantIDs, kids, agents, users, inputs, budgets, priorities, idems, hashes, within)
	return collect(rows, err, scanTask)
}

// insertCols are the columns a new task is inserted with.
const insertCols = `id, tenant_id, kid, agent, user_id, input, budget, priority, idempotency_key, request_hash, start_deadline`

// startDeadlineOf is the start deadline of a task inserted now with ms, an SQL
// expression of milliseconds, to start within (0: none). now() is the statement's
// transaction time, which created_at defaults to: the deadline is created_at + ms.
func startDeadlineOf(ms string) string {
	return `CASE WHEN ` + ms + `::bigint > 0 THEN now() + ` + ms + `::bigint * interval '1 millisecond' END`
}

// BulkInsertQueued writes many queued tasks at once with COPY (benchmarks and
// imports); ErrNoTenant, writing none, if one of them has no tenant. Idempotency keys
// are not supported here.
func (s *Store) BulkInsertQueued(ctx context.Context, ps []InsertTaskParams) (int64, error) {
	rows := make([][]any, len(ps))
	for i, p := range ps {
		if p.TenantID == "" {
			return 0, fmt.Errorf("task %d of %d: %w", i+1, len(ps), ErrNoTenant)
		}
		rows[i] = []any{p.ID, p.TenantID, p.Kid, p.Agent, p.User, []byte(p.Input), []byte(p.Budget), p.Priority, p.RequestHash}
	}
	return s.db.CopyFrom(ctx, pgx.Identifier{"tasks"},
		[]string{"id", "tenant_id", "kid", "agent", "user_id", "input", "budget", "priority", "request_hash"},
		pgx.CopyFromRows(rows))
}

// GetTaskParams name one of a tenant's tasks.
type GetTaskParams struct {
	TenantID string
	ID       uuid.UUID
}

// GetTask returns one of the tenant's tasks; agentqtype.ErrNotFound for another tenant's.
func (s *Store) GetTask(ctx context.Context, p GetTaskParams) (Task, error) {
	if p.TenantID == "" {
		return Task{}, ErrNoTenant
	}
	return scanTask(s.db.QueryRow(ctx, `SELECT `+taskCols+` FROM tasks WHERE id = $1 AND tenant_id = $2`, p.ID, p.TenantID))
}

// GetTaskByIdempotencyKeyParams name a tenant's task by the idempotency key it was
// submitted with.
type GetTaskByIdempotencyKeyParams struct {
	TenantID string
	Key      string
}

// GetTaskByIdempotencyKey returns the tenant's task submitted with p.Key.
func (s *Store) GetTaskByIdempotencyKey(ctx context.Context, p GetTaskByIdempotencyKeyParams) (Task, error) {
	if p.TenantID == "" {
		return Task{}, ErrNoTenant
	}
	return scanTask(s.db.QueryRow(ctx,
		`SELECT `+taskCols+` FROM tasks WHERE tenant_id = $1 AND idempotency_key = $2`, p.TenantID, p.Key))
}

// ListTasksParams select a page of a tenant's tasks, newest first.
type ListTasksParams struct {
	TenantID string
	State    TaskState // "" for any
	Before   uuid.UUID // cursor: only ids below this one; uuid.Nil for the first page
	Limit    int
	// Agents and Principals, when not empty, keep only the tasks of those agents and
	// users (an API key's scopes).
	Agents, Principals []string
	// RootID, when set, keeps only the tasks of the tree rooted there, its root
	// included.
	RootID uuid.UUID
}

// ListTasks returns up to Limit tasks. It reads the tenant's state index
// (tasks_tenant_state_idx) from the cursor on: in the state asked for, or in every
// state at once, one scan of each merged in id order, so a page costs about Limit
// rows whatever the tenant's history holds before it.
func (s *Store) ListTasks(ctx context.Context, p ListTasksParams) ([]Task, error) {
	if p.TenantID == "" {
		return nil, ErrNoTenant
	}
	before := p.Before
	if before == uuid.Nil {
		before = uuid.Max // above every id: the cursor is always an index condition
	}
	if p.RootID != uuid.Nil {
		rows, err := s.db.Query(ctx, listTree, p.TenantID, before, p.Limit, orEmpty(p.Agents), orEmpty(p.Principals),
			p.RootID, string(p.State))
		return collect(rows, err, scanTask)
	}
	q := listAllStates
	if p.State != "" {
		var ok bool
		if q, ok = listInState[p.State]; !ok {
			return nil, fmt.Errorf("store: no task state %q", p.State)
		}
	}
	rows, err := s.db.Query(ctx, q, p.TenantID, before, p.Limit, orEmpty(p.Agents), orEmpty(p.Principals))
	return collect(rows, err, scanTask)
}

// listOfState is the page of a tenant's tasks in state (an SQL expression) that
// ListTasks reads: $1 the tenant, $2 the cursor, $3 the limit, $4 and $5 the scopes.
func listOfState(state string) string {
	return `SELECT ` + taskCols + ` FROM tasks
		WHERE tenant_id = $1 AND state = ` + state + ` AND id < $2
			AND (cardinality($4::text[]) = 0 OR agent = ANY($4)) AND (cardinality($5::text[]) = 0 OR user_id = ANY($5))
		ORDER BY id DESC LIMIT $3`
}

// listTree is ListTasks of one tree ($6 its root; $7 a state, or ""), read through
// the tree index.
const listTree = `SELECT ` + taskCols + ` FROM tasks
	WHERE tenant_id = $1 AND (id = $6 OR root_id = $6) AND id < $2 AND ($7 = '' OR state = $7)
		AND (cardinality($4::text[]) = 0 OR agent = ANY($4)) AND (cardinality($5::text[]) = 0 OR user_id = ANY($5))
	ORDER BY id DESC LIMIT $3`

// listInState is ListTasks in each state, the state written in the statement (the
// generic plan of a state given as a parameter does not know that a state is rare,
// and may walk the primary key through every tenant's tasks to find a page of it);
// listAllStates in any state, the pages of every state merged.
var (
	listInState = func() map[TaskState]string {
		m := make(map[TaskState]string, len(TaskStates))
		for _, st := range TaskStates {
			m[st] = listOfState("'" + string(st) + "'")
		}
		return m
	}()
	listAllStates = func() string {
		parts := make([]string, len(TaskStates))
		for i, st := range TaskStates {
			parts[i] = "(" + listOfState("'"+string(st)+"'") + ")"
		}
		return `SELECT * FROM (` + strings.Join(parts, " UNION ALL ") + `) t ORDER BY id DESC LIMIT $3`
	}()
)

// orEmpty is l, or an empty list for nil (a text[] of no elements, never NULL).
func orEmpty(l []string) []string {
	if l == nil {
		return []string{}
	}
	return l
}

// CountTasksParams name the tenant whose tasks to count, and optionally a state.
type CountTasksParams struct {
	TenantID string
	State    TaskState // "": every state
}

// CountTasks counts a tenant's tasks (in State, when set): tests use it to prove
// refused requests wrote nothing; a late start's commitment check counts the
// tenant's started tasks.
func (s *Store) CountTasks(ctx context.Context, p CountTasksParams) (int, error) {
	if p.TenantID == "" {
		return 0, ErrNoTenant
	}
	var n int
	err := s.db.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE tenant_id = $1 AND ($2 = '' OR state = $2)`,
		p.TenantID, string(p.State)).Scan(&n)
	return n, err
}

// FinishTaskParams end one of a tenant's tasks (a cancel): a move to the terminal
// state To from one of the states in From, whatever attempt runs it.
type FinishTaskParams struct {
	TenantID string
	ID       uuid.UUID
	From     []TaskState
	To       TaskState
	Output   json.RawMessage
	Error    string
}

// FinishTask performs the terminal transition. Exactly one caller wins it (ok=true);
// that caller owns the side effects of the end (lease release, events). A task not in
// one of From gives ok=false.
func (s *Store) FinishTask(ctx context.Context, p FinishTaskParams) (t Task, ok bool, err error) {
	if p.TenantID == "" {
		return t, false, ErrNoTenant
	}
	return s.finishTask(ctx, finishParams{tenantID: p.TenantID, id: p.ID, from: p.From, to: p.To, output: p.Output, errText: p.Error})
}

// finishParams are FinishTaskParams and UnscopedFinishTaskParams: "" tenantID for
// any tenant, 0 attempt for any attempt.
type finishParams struct {
	tenantID string
	id       uuid.UUID
	attempt  int
	from     []TaskState
	to       TaskState
	output   json.RawMessage
	errText  string
}

func (s *Store) finishTask(ctx context.Context, p finishParams) (t Task, ok bool, err error) {
	if !p.to.Terminal() {
		return t, false, fmt.Errorf("store: %q is not a terminal state", p.to)
	}
	var errText *string
	if p.errText != "" {
		errText = &p.errText
	}
	var output []byte
	if len(p.output) > 0 {
		output = p.output
	}
	t, err = scanTask(s.db.QueryRow(ctx, `
		UPDATE tasks SET state = $3, output = COALESCE($4, output), error = COALESCE($5, error), finished_at = clock_timestamp()
		WHERE id = $1 AND ($2 = '' OR tenant_id = $2) AND state = ANY($6) AND ($7 = 0 OR attempt = $7) RETURNING `+taskCols,
		p.id, p.tenantID, string(p.to), output, errText, statesText(p.from), p.attempt))
	if errors.Is(err, agentqtype.ErrNotFound) {
		if p.attempt != 0 {
			if err := s.whyUnclaimed(ctx, Claim{ID: p.id, Attempt: p.attempt}); !errors.Is(err, ErrTaskEnded) {
				return t, false, err
			}
		}
		return t, false, nil
	}
	return t, err == nil, err
}

// statesText is states as the text array a query compares state with.
func statesText(states []TaskState) []string {
	out := make([]string, len(states))
	for i, st := range states {
		out[i] = string(st)
	}
	return out
}

// ResumeTaskParams resume one of a tenant's paused tasks.
type ResumeTaskParams struct {
	TenantID string
	ID       uuid.UUID
	// Pause, when above 0, is the pause the resume was made for (an approval link's):
	// a task paused again since is left as it is.
	Pause int
	// Budget, when set, replaces the task's budget (a raise the resume carries).
	Budget json.RawMessage
}

// ResumeTask moves a paused task back to queued, where it waits to run its next step:
// the time it was paused is added to waited_ms (its wall-clock budget does not count
// it) and the pause's fields are cleared; Pause.Count stays. ok=false when the task is
// not paused (or not under p.Pause); agentqtype.ErrNotFound when it is not the tenant's.
func (s *Store) ResumeTask(ctx context.Context, p ResumeTaskParams) (t Task, ok bool, err error) {
	if p.TenantID == "" {
		return t, false, ErrNoTenant
	}
	var budget []byte
	if len(p.Budget) > 0 {
		budget = p.Budget
	}
	t, err = scanTask(s.db.QueryRow(ctx, `
		UPDATE tasks SET state = 'queued', budget = COALESCE($4::jsonb, budget),
			waited_ms = waited_ms + GREATEST(0, (EXTRACT(EPOCH FROM now() - paused_at) * 1000)::bigint),
			paused_reason = NULL, paused_at = NULL, pause_limit = NULL, pause_used = NULL
		WHERE id = $1 AND tenant_id = $2 AND state = 'paused' AND ($3 = 0 OR pauses = $3) RETURNING `+taskCols,
		p.ID, p.TenantID, p.Pause, budget))
	if errors.Is(err, agentqtype.ErrNotFound) {
		if _, gerr := s.GetTask(ctx, GetTaskParams{TenantID: p.TenantID, ID: p.ID}); gerr != nil {
			return Task{}, false, gerr
		}
		return Task{}, false, nil
	}
	return t, err == nil, err
}
