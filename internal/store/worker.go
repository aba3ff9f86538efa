package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/agentq/agentq/agentqtype"
)

// The worker's calls: they reach a running task by its id (from a queue message) and
// fence every write by the worker's Claim. They are unscoped; the task lifecycle
// service calls them (for the worker and the janitor), nothing serving a tenant does.

// UnscopedStartTask moves a queued task to running and counts the attempt. ok=false
// when the task is not queued (already running elsewhere, or terminal), or when it
// never started and its start deadline has passed: then the same statement ended it
// expired, and t is the expired task (the caller owns the end's side effects).
func (s *Store) UnscopedStartTask(ctx context.Context, id uuid.UUID) (t Task, ok bool, err error) {
	ts, err := s.UnscopedStartTasks(ctx, []uuid.UUID{id})
	if err != nil || len(ts) == 0 {
		return t, false, err
	}
	return ts[0], ts[0].State == agentqtype.TaskStateRunning, nil
}

// UnscopedStartTasks is UnscopedStartTask for many tasks in one round trip: it starts
// those of ids that are queued and returns them, in no particular order, each with the
// wait its start ended (Task.Resumed), with those it ended expired instead (State
// tells which); the others (running elsewhere, terminal, gone) are left as they are.
//
// Each task's start is one statement on one snapshot, and its two conditions exclude
// each other: a task is started or expired, never both, and a concurrent expiry pass
// (UnscopedExpireOverdue) that won the row leaves it to neither. The statements go in
// one batch, one implicit transaction.
//
// One statement per task, not one for the batch: a statement that reads its task by
// id equality alone reads it by primary key under any generic plan. A batch's statement
// (ids from an array) has a join the plan orders by the table's size when the
// connection made it, at the statement's first run: on a young deployment's nearly
// empty table, that plan reads every queued task once per batch until the next
// analyze replaces it.
func (s *Store) UnscopedStartTasks(ctx context.Context, ids []uuid.UUID) ([]Task, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	b := &pgx.Batch{}
	reason := agentqtype.NotStartedByDeadline()
	for _, id := range ids {
		b.Queue(startTaskSQL, id, reason)
	}
	br := s.db.SendBatch(ctx, b)
	out := make([]Task, 0, len(ids))
	for range ids {
		rows, err := br.Query()
		ts, err := collect(rows, err, scanStarted)
		if err != nil {
			_ = br.Close()
			return nil, interpretError(err)
		}
		out = append(out, ts...)
	}
	return out, interpretError(br.Close())
}

// startTaskSQL starts the queued task $1, or ends it expired ($2 its error) when it
// never started and its start deadline has passed.
var startTaskSQL = `
		WITH expired AS (
			UPDATE tasks SET state = 'expired', error = $2, finished_at = clock_timestamp()
			WHERE id = $1 AND state IS NOT DISTINCT FROM 'queued' AND ` + startOverdue + `
			RETURNING ` + taskCols + `, NULL::text, 0::bigint, NULL::timestamptz, 0::bigint
		), started AS (` + startSQL + `NOT ` + startOverdueOf("tasks") + startReturning + `
		)
		SELECT * FROM started UNION ALL SELECT * FROM expired`

// startOverdue holds for a task that never started and whose start deadline has
// passed. A task that started once (and was parked or re-queued since) is past its
// deadline's reach: the deadline is about the first start only.
var startOverdue = startOverdueOf("")

// startOverdueOf is startOverdue on the columns of table ("": unqualified).
func startOverdueOf(table string) string {
	if table != "" {
		table += "."
	}
	return "(" + table + "started_at IS NULL AND " + table + "start_deadline IS NOT NULL AND " + table + "start_deadline <= now())"
}

// UnscopedExpireOverdue ends as expired up to limit queued tasks, of any tenant, that
// never started and whose start deadline has passed, oldest deadline first, and
// returns them. It reads the partial index on such tasks, and skips a row another
// transaction holds (a start under way decides it; the next run sees what it left).
// Each task is ended by one conditional update: of several callers at once, one
// ends it and gets it back, and owns the end's side effects.
func (s *Store) UnscopedExpireOverdue(ctx context.Context, limit int) ([]Task, error) {
	rows, err := s.db.Query(ctx, `
		UPDATE tasks SET state = 'expired', error = $2, finished_at = clock_timestamp()
		WHERE id IN (
			SELECT id FROM tasks
			WHERE state = 'queued' AND start_deadline IS NOT NULL AND started_at IS NULL AND start_deadline <= now()
			ORDER BY start_deadline LIMIT $1 FOR UPDATE SKIP LOCKED
		) AND state = 'queued' AND `+startOverdue+`
		RETURNING `+taskCols, limit, agentqtype.NotStartedByDeadline())
	return collect(rows, err, scanTask)
}

// startSQL starts the queued task $1, read by primary key (a further condition
// follows; its state test is IS NOT DISTINCT FROM, which no index on state serves, so
// a plan made on a nearly empty table cannot prefer the queued tasks' index), ending a parked task's wait: the wait is added to
// waited_ms (unless it followed a throttled answer, 'throttled' or 'throttled:<pool>':
// that wait counts toward the wall clock) and the wait's fields are cleared
// (step_estimate stays for the delivery to read). It joins the row as it was (w) to
// return, with the started task, the wait the start ended (Task.Resumed): after the
// update the wait's fields are cleared.
var startSQL = `
		UPDATE tasks SET state = 'running', attempt = tasks.attempt + 1, started_at = COALESCE(tasks.started_at, now()),
			heartbeat_at = now(),
			waited_ms = tasks.waited_ms + CASE WHEN tasks.parked_at IS NULL OR tasks.wait_reason = 'throttled'
				OR tasks.wait_reason LIKE 'throttled:%' THEN 0 ELSE GREATEST(0, (EXTRACT(EPOCH FROM now() - tasks.parked_at) * 1000)::bigint) END,
			parked_at = NULL, wait_reason = NULL, wait_until = NULL
		FROM tasks w
		WHERE tasks.id = $1 AND w.id = $1 AND tasks.state IS NOT DISTINCT FROM 'queued' AND `

// startReturning returns the started task and the wait its start ended: its reason,
// its length to the start, when its capacity was expected (the unpark) and its length
// to the unpark (or to the start, if that came first).
var startReturning = ` RETURNING ` + qualified("tasks", taskCols) + `, w.wait_reason,
		CASE WHEN w.parked_at IS NULL THEN 0 ELSE GREATEST(0, (EXTRACT(EPOCH FROM now() - w.parked_at) * 1000)::bigint) END,
		w.wait_until,
		CASE WHEN w.parked_at IS NULL THEN 0 ELSE GREATEST(0,
			(EXTRACT(EPOCH FROM LEAST(now(), COALESCE(w.wait_until, now())) - w.parked_at) * 1000)::bigint) END`

// scanStarted scans a started task and the wait its start ended.
func scanStarted(row pgx.Row) (Task, error) {
	var reason *string
	var waited, toUnpark int64
	var until *time.Time
	t, err := scanTaskWith(row, &reason, &waited, &until, &toUnpark)
	if err == nil && reason != nil {
		t.Resumed = &ResumedWait{Reason: *reason, WaitedMs: waited, Until: until, ToUnparkMs: toUnpark}
	}
	return t, err
}

// qualified prefixes each column of cols with table.
func qualified(table, cols string) string {
	parts := strings.Split(cols, ",")
	for i, c := range parts {
		parts[i] = table + "." + strings.TrimSpace(c)
	}
	return strings.Join(parts, ", ")
}

// UnscopedTakeOverTask claims a running task whose worker stopped heartbeating for
// staleAfter (its process died; asynq redelivered it) and counts a new attempt.
// ok=false when the task is not running or its worker is alive.
func (s *Store) UnscopedTakeOverTask(ctx context.Context, id uuid.UUID, staleAfter time.Duration) (t Task, ok bool, err error) {
	t, err = scanTask(s.db.QueryRow(ctx, `
		UPDATE tasks SET attempt = attempt + 1, heartbeat_at = now()
		WHERE id = $1 AND state = 'running' AND heartbeat_at < now() - $2::interval RETURNING `+taskCols,
		id, interval(staleAfter)))
	if errors.Is(err, agentqtype.ErrNotFound) {
		return t, false, nil
	}
	return t, err == nil, err
}

// Claim names the attempt of a running task that a worker holds: UnscopedStartTask or
// UnscopedTakeOverTask returned it. Every worker write carries it, so a worker that
// stalled past its lease cannot write over the attempt that replaced it.
type Claim struct {
	ID      uuid.UUID
	Attempt int
}

// claimLost says why a claimed write matched nothing: ErrTaskEnded when the task ended
// under this same attempt, ErrLostClaim otherwise.
func claimLost(state TaskState, attempt, claimed int) error {
	if state.Terminal() && attempt == claimed {
		return ErrTaskEnded
	}
	return fmt.Errorf("%w (attempt %d, task at attempt %d, %s)", ErrLostClaim, claimed, attempt, state)
}

// whyUnclaimed reads the task to tell ErrTaskEnded from ErrLostClaim after a claimed
// write matched no row.
func (s *Store) whyUnclaimed(ctx context.Context, c Claim) error {
	var state TaskState
	var attempt int
	err := s.db.QueryRow(ctx, `SELECT state, attempt FROM tasks WHERE id = $1`, c.ID).Scan(&state, &attempt)
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

// UnscopedRecordStep adds one step's usage to the task, stores the agent's state,
// writes the step's ledger rows and adds them to the tenant's rollups, in one
// transaction that first locks the task row: a cancel either commits before (the step
// is not written: ErrTaskEnded) or waits for it (the step is in the ledger, the
// rollups and the task's usage). ErrLostClaim when another attempt owns the task.
// Step is the step's number; a step already recorded (a retry whose first commit lost
// its reply) is not counted twice: recorded=false, no error, and the rollups are left
// alone. r is the task as the step left it, its tenant and the step's rollups.
func (s *Store) UnscopedRecordStep(ctx context.Context, p RecordStepParams) (r RecordedStep, recorded bool, err error) {
	err = s.beginFunc(ctx, func(tx pgx.Tx) error {
		var tenant string
		var state TaskState
		var attempt, steps int
		err := tx.QueryRow(ctx, `SELECT tenant_id, state, attempt, steps FROM tasks WHERE id = $1 FOR UPDATE`, p.ID).
			Scan(&tenant, &state, &attempt, &steps)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w (task %s is gone)", ErrLostClaim, p.ID)
		}
		if err != nil {
			return err
		}
		if state != agentqtype.TaskStateRunning || attempt != p.Attempt {
			return claimLost(state, attempt, p.Attempt)
		}
		if p.Step <= steps {
			return nil // recorded before
		}
		rows, err := tx.Query(ctx, `
			INSERT INTO usage_ledger (task_id, step, meter, tenant_id, quantity)
			SELECT $1, $2, m.meter, $3, m.q FROM
				(VALUES ('steps', 1::bigint), ('tokens', $4::bigint), ('cost_micro_usd', $5::bigint)) AS m(meter, q)
			ON CONFLICT DO NOTHING RETURNING recorded_at`, p.ID, p.Step, tenant, p.Tokens, p.CostMicro)
		at, err := collect(rows, err, func(row pgx.Row) (time.Time, error) {
			var t time.Time
			err := row.Scan(&t)
			return t, err
		})
		if err != nil {
			return err
		}
		if len(at) == 0 {
			return nil // recorded before
		}
		t, err := scanTask(tx.QueryRow(ctx, `
			UPDATE tasks SET steps = steps + 1, tokens = tokens + $2, cost_micro_usd = cost_micro_usd + $3,
				agent_state = $4, heartbeat_at = now()
			WHERE id = $1 RETURNING `+taskCols, p.ID, p.Tokens, p.CostMicro, []byte(p.AgentState)))
		if err != nil {
			return err
		}
		ten, u, err := addStepToRollups(ctx, tx, tenant, at[0], p.Tokens, p.CostMicro)
		if err != nil {
			return err
		}
		r, recorded = RecordedStep{Task: t, Tenant: ten, Usage: u}, true
		return nil
	})
	if err != nil {
		return RecordedStep{}, false, err
	}
	return r, recorded, nil
}

// LastStep is a running task's last step, with the output it completes the task with.
type LastStep struct {
	RecordStepParams
	Output json.RawMessage
}

// UnscopedCompleteLastSteps records the last step of each of many running tasks and
// ends each of them completed, on one transaction: what UnscopedRecordStep and then
// UnscopedFinishTask do for each, in one statement for all of them, plus two for the
// rollups of all their tenants. Concurrent workers' ends commit together this way
// (group commit). Inside a transaction it runs in that one, without a savepoint of
// its own (two round trips fewer per batch): a failure fails the caller's
// transaction, which the caller rolls back.
//
// A task is written only when its claim holds and ps's step is the one after its
// last recorded step, and only by its first entry in ps; the recorded steps are
// returned, in the order of ps, and the others are left untouched, for the caller to
// take through the one-task calls, which tell why (a lost claim, a cancel, a retry of
// a step recorded before). Each
// returned step's usage is what it would be had the steps been recorded one after
// another in the order of ps: the totals with the step and the tenant's earlier
// steps in ps, not its later ones.
func (s *Store) UnscopedCompleteLastSteps(ctx context.Context, ps []LastStep) (out []RecordedStep, err error) {
	// A task given twice is written once, by its first entry.
	seen := make(map[uuid.UUID]bool, len(ps))
	ps = slices.DeleteFunc(slices.Clone(ps), func(p LastStep) bool {
		dup := seen[p.ID]
		seen[p.ID] = true
		return dup
	})
	if len(ps) == 0 {
		return nil, nil
	}
	ids := make([]uuid.UUID, len(ps))
	attempts, steps := make([]int32, len(ps)), make([]int32, len(ps))
	tokens, costs := make([]int64, len(ps)), make([]int64, len(ps))
	states, outputs := make([]*string, len(ps)), make([]*string, len(ps))
	for i, p := range ps {
		ids[i], attempts[i], steps[i], tokens[i], costs[i] = p.ID, int32(p.Attempt), int32(p.Step), p.Tokens, p.CostMicro
		states[i], outputs[i] = jsonText(p.AgentState), jsonText(p.Output)
	}
	err = s.inTransaction(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			WITH i AS (
				SELECT * FROM unnest($1::uuid[], $2::int[], $3::int[], $4::bigint[], $5::bigint[], $6::text[], $7::text[])
					AS i(tid, tattempt, tstep, ttokens, tcost, tstate, toutput)
			), t AS (
				UPDATE tasks SET steps = steps + 1, tokens = tokens + i.ttokens, cost_micro_usd = cost_micro_usd + i.tcost,
					agent_state = i.tstate::jsonb, heartbeat_at = now(), state = 'completed',
					output = COALESCE(i.toutput::jsonb, output), finished_at = clock_timestamp()
				FROM i WHERE id = i.tid AND state = 'running' AND attempt = i.tattempt AND steps = i.tstep - 1
				RETURNING `+taskCols+`, i.ttokens, i.tcost
			), l AS (
				INSERT INTO usage_ledger (task_id, step, meter, tenant_id, quantity)
				SELECT t.id, t.steps, m.meter, t.tenant_id, m.q FROM t,
					LATERAL (VALUES ('steps', 1::bigint), ('tokens', t.ttokens), ('cost_micro_usd', t.tcost)) AS m(meter, q)
				RETURNING recorded_at
			)
			SELECT `+taskCols+`, (SELECT min(recorded_at) FROM l) FROM t`,
			ids, attempts, steps, tokens, costs, states, outputs)
		type written struct {
			t  Task
			at time.Time
		}
		got, err := collect(rows, err, func(row pgx.Row) (written, error) {
			var w written
			var err error
			w.t, err = scanTaskWith(row, &w.at)
			return w, err
		})
		if err != nil {
			return err
		}
		byID := make(map[uuid.UUID]written, len(got))
		for _, w := range got {
			byID[w.t.ID] = w
		}
		// The rollups: the sums of each tenant's steps, all tenants in one statement.
		index := map[string]int{} // tenant → its entry in adds
		var adds []rollupAdd
		for _, p := range ps {
			w, ok := byID[p.ID]
			if !ok {
				continue
			}
			i, ok := index[w.t.TenantID]
			if !ok {
				i = len(adds)
				index[w.t.TenantID] = i
				adds = append(adds, rollupAdd{TenantID: w.t.TenantID})
			}
			a := &adds[i]
			a.Steps, a.Tokens, a.CostMicro = a.Steps+1, a.Tokens+p.Tokens, a.CostMicro+p.CostMicro
		}
		if len(adds) == 0 {
			return nil
		}
		added, err := addStepsToRollups(ctx, tx, got[0].at, adds)
		if err != nil {
			return err
		}
		// Each step's totals: its tenant's totals before the batch, plus its steps up to
		// and including this one.
		for i, a := range adds {
			u := &added[i].Usage
			u.PeriodSteps, u.PeriodTokens, u.PeriodCostMicro, u.DaySteps =
				u.PeriodSteps-a.Steps, u.PeriodTokens-a.Tokens, u.PeriodCostMicro-a.CostMicro, u.DaySteps-a.Steps
		}
		for _, p := range ps {
			w, ok := byID[p.ID]
			if !ok {
				continue
			}
			t := &added[index[w.t.TenantID]]
			t.Usage.PeriodSteps++
			t.Usage.DaySteps++
			t.Usage.PeriodTokens += p.Tokens
			t.Usage.PeriodCostMicro += p.CostMicro
			u := t.Usage
			u.Tokens, u.CostMicro = p.Tokens, p.CostMicro
			out = append(out, RecordedStep{Task: w.t, Tenant: t.Tenant, Usage: u})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// jsonText is a JSON document as the text a query casts to jsonb; nil for SQL NULL.
func jsonText(raw json.RawMessage) *string {
	if raw == nil {
		return nil
	}
	s := string(raw)
	return &s
}

// UnscopedFinishTaskParams end a running attempt: the worker's end of its own, or a
// sweep's abandonment of one whose heartbeat it found stale. From and To as in
// FinishTaskParams; Attempt (the claim) is required.
type UnscopedFinishTaskParams struct {
	ID      uuid.UUID
	Attempt int
	From    []TaskState
	To      TaskState
	Output  json.RawMessage
	Error   string
}

// UnscopedFinishTask performs the terminal transition under a claim. Exactly one
// caller wins it (ok=true); that caller owns the side effects of the end (lease
// release, events). A task that another attempt owns gives ErrLostClaim; one that
// already ended under this attempt gives ok=false.
func (s *Store) UnscopedFinishTask(ctx context.Context, p UnscopedFinishTaskParams) (t Task, ok bool, err error) {
	if p.Attempt < 1 {
		return t, false, fmt.Errorf("store: ending task %s needs the claim's attempt", p.ID)
	}
	return s.finishTask(ctx, finishParams{id: p.ID, attempt: p.Attempt, from: p.From, to: p.To, output: p.Output, errText: p.Error})
}

// UnscopedRequeueTask puts a running task back to queued, keeping its recorded steps
// and agent state, so the next attempt resumes from there (worker shutdown before the
// step finished). ErrTaskEnded or ErrLostClaim when the claim no longer holds. t is
// the task as re-queued.
func (s *Store) UnscopedRequeueTask(ctx context.Context, c Claim) (t Task, err error) {
	t, err = scanTask(s.db.QueryRow(ctx,
		`UPDATE tasks SET state = 'queued' WHERE id = $1 AND state = 'running' AND attempt = $2 RETURNING `+taskCols,
		c.ID, c.Attempt))
	if errors.Is(err, agentqtype.ErrNotFound) {
		return Task{}, s.whyUnclaimed(ctx, c)
	}
	return t, err
}

// UnscopedParkTaskParams send a running task back to queued to wait for capacity.
type UnscopedParkTaskParams struct {
	Claim
	Reason       string    // what it waits for: "tokens_per_minute" or "pool:<name>"
	Until        time.Time // when the capacity is expected
	StepEstimate int64     // the tokens its next step asks for
	// StepCostEstimate is the cost its next step asks for, in micro-dollars.
	StepCostEstimate int64
}

// UnscopedParkTask puts a running task back to queued, like UnscopedRequeueTask, and
// records what it waits for. ErrTaskEnded or ErrLostClaim when the claim no longer
// holds.
func (s *Store) UnscopedParkTask(ctx context.Context, p UnscopedParkTaskParams) (t Task, err error) {
	t, err = scanTask(s.db.QueryRow(ctx, `
		UPDATE tasks SET state = 'queued', wait_reason = $3, wait_until = $4, parked_at = now(), step_estimate = $5,
			step_parks = CASE WHEN park_step = steps THEN step_parks + 1 ELSE 1 END, park_step = steps,
			step_cost_estimate = $6
		WHERE id = $1 AND state = 'running' AND attempt = $2 RETURNING `+taskCols,
		p.ID, p.Attempt, p.Reason, p.Until, p.StepEstimate, p.StepCostEstimate))
	if errors.Is(err, agentqtype.ErrNotFound) {
		return Task{}, s.whyUnclaimed(ctx, p.Claim)
	}
	return t, err
}

// UnscopedHeartbeat marks a running task's worker alive. ErrTaskEnded or ErrLostClaim
// when the claim no longer holds: the worker stops working on the task.
func (s *Store) UnscopedHeartbeat(ctx context.Context, c Claim) error {
	tag, err := s.db.Exec(ctx, `UPDATE tasks SET heartbeat_at = now() WHERE id = $1 AND state = 'running' AND attempt = $2`, c.ID, c.Attempt)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return s.whyUnclaimed(ctx, c)
	}
	return nil
}

// interval is d as a Postgres interval literal, to the millisecond.
func interval(d time.Duration) string { return fmt.Sprintf("%d milliseconds", d.Milliseconds()) }

// UnscopedLockPausedCount counts the tenant's paused tasks, holding until the
// transaction ends a lock that serialises the tenant's pauses (call it in one), so
// that a pause decided on the count cannot race another.
func (s *Store) UnscopedLockPausedCount(ctx context.Context, tenantID string) (int64, error) {
	if _, err := s.db.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('agentq.paused:' || $1, 0))`, tenantID); err != nil {
		return 0, err
	}
	var n int64
	err := s.db.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE tenant_id = $1 AND state = 'paused'`, tenantID).Scan(&n)
	return n, err
}

// UnscopedSetPauseExpiry dates when the paused task's pause ends it: timeout after
// its pause (its plan's pause_timeout_s).
func (s *Store) UnscopedSetPauseExpiry(ctx context.Context, id uuid.UUID, timeout time.Duration) error {
	_, err := s.db.Exec(ctx, `UPDATE tasks SET pause_expires_at = paused_at + $2::interval WHERE id = $1 AND state = 'paused'`,
		id, interval(timeout))
	return err
}

// pauseTimedOutFormat is agentqtype.PauseTimedOut as a format() of Postgres (whose
// %s is Go's), filled in with each task's limit.
var pauseTimedOutFormat = agentqtype.PauseTimedOut("%s")

// UnscopedExpirePauses ends budget_exceeded, in one statement, up to limit tasks
// paused past their pause's expiry (oldest expiry first), and returns them as they
// ended, their pause's fields still set: the limit that paused each. Tasks another
// transaction holds are skipped for the next call.
func (s *Store) UnscopedExpirePauses(ctx context.Context, limit int) ([]Task, error) {
	rows, err := s.db.Query(ctx, `
		UPDATE tasks SET state = 'budget_exceeded', finished_at = clock_timestamp(),
			error = format($2, COALESCE(paused_reason, 'a limit'))
		WHERE id IN (SELECT id FROM tasks WHERE state = 'paused' AND pause_expires_at <= now()
			ORDER BY pause_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)
		RETURNING `+taskCols, limit, pauseTimedOutFormat)
	return collect(rows, err, func(row pgx.Row) (Task, error) { return scanTask(row) })
}

// UnscopedPauseTaskParams pause a running task at a limit.
type UnscopedPauseTaskParams struct {
	Claim
	Reason      string // the limit_type that paused it
	Limit, Used int64  // the limit's value and the use that met it
	// NextTokens and NextCostMicro are what the step the limit held back is expected
	// to take: a resume is judged against them, and its delivery reserves them.
	NextTokens, NextCostMicro int64
}

// UnscopedPauseTask moves the claimed running task to paused, keeping its recorded
// steps and agent state, and counts the pause. ErrTaskEnded or ErrLostClaim when the
// claim no longer holds.
func (s *Store) UnscopedPauseTask(ctx context.Context, p UnscopedPauseTaskParams) (t Task, err error) {
	t, err = scanTask(s.db.QueryRow(ctx, `
		UPDATE tasks SET state = 'paused', paused_reason = $3, paused_at = now(), pause_limit = $4, pause_used = $5,
			pauses = pauses + 1, wait_reason = NULL, wait_until = NULL, parked_at = NULL,
			step_estimate = $6, step_cost_estimate = $7
		WHERE id = $1 AND state = 'running' AND attempt = $2 RETURNING `+taskCols,
		p.ID, p.Attempt, p.Reason, p.Limit, p.Used, p.NextTokens, p.NextCostMicro))
	if errors.Is(err, agentqtype.ErrNotFound) {
		return Task{}, s.whyUnclaimed(ctx, p.Claim)
	}
	return t, err
}
