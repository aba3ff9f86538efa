// Package testfactory puts tasks of the tests' own schemas into the states a test
// needs, behind the store's back: a task a dead worker left running, one whose
// heartbeat went stale, one that ended. Each function names the state it makes, so a
// change to the tasks table is one edit here rather than one in every test.
//
// An id is a uuid.UUID or its string; db is a pool, a connection or a transaction.
package testfactory

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the factories need of a pool, a connection or a transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Running describes a running task: its attempt (0 is 1), the steps it has finished,
// the agent's state after them (nil leaves it), and how long ago its worker last beat.
type Running struct {
	Attempt      int
	Steps        int
	AgentState   []byte
	HeartbeatAge time.Duration
}

// TaskRunning makes the task running under attempt 1 with a fresh heartbeat, as
// though a worker had just started it.
func TaskRunning(t testing.TB, db DB, id any) { TaskRunningAs(t, db, id, Running{}) }

// TaskRunningAs makes the task running as r says, started now.
func TaskRunningAs(t testing.TB, db DB, id any, r Running) {
	t.Helper()
	if r.Attempt == 0 {
		r.Attempt = 1
	}
	exec(t, db, `UPDATE tasks SET state = 'running', started_at = now(), attempt = $2, steps = $3,
		agent_state = COALESCE($4::jsonb, agent_state), heartbeat_at = now() - $5::interval WHERE id = $1`,
		id, r.Attempt, r.Steps, r.AgentState, r.HeartbeatAge)
}

// TaskHeartbeatAgo dates the task's last heartbeat age ago (a stale one: its worker
// looks dead).
func TaskHeartbeatAgo(t testing.TB, db DB, id any, age time.Duration) {
	t.Helper()
	exec(t, db, `UPDATE tasks SET heartbeat_at = now() - $2::interval WHERE id = $1`, id, age)
}

// TaskTakenOver is the task as another worker left it after taking it over: the next
// attempt, with a fresh heartbeat.
func TaskTakenOver(t testing.TB, db DB, id any) {
	t.Helper()
	exec(t, db, `UPDATE tasks SET attempt = attempt + 1, heartbeat_at = now() WHERE id = $1`, id)
}

// TaskChildOf makes the task the index-th child of parent, spawned by its first step, as
// a spawn does (parent is a root): the child's tree columns and the parent's count.
func TaskChildOf(t testing.TB, db DB, id, parent any, index int) {
	t.Helper()
	exec(t, db, `UPDATE tasks SET parent_id = $2, root_id = $2, depth = 1, spawn_step = 1, spawn_index = $3 WHERE id = $1`, id, parent, index)
	exec(t, db, `UPDATE tasks SET children = children + 1 WHERE id = $1`, parent)
}

// TaskEnded ends the task in state (completed, failed, killed, ...) now.
func TaskEnded(t testing.TB, db DB, id any, state string) {
	t.Helper()
	exec(t, db, `UPDATE tasks SET state = $2, finished_at = now() WHERE id = $1`, id, state)
}

// TaskInState changes the task's state and nothing else.
func TaskInState(t testing.TB, db DB, id any, state string) {
	t.Helper()
	if err := SetTaskState(context.Background(), db, id, state); err != nil {
		t.Fatal(err)
	}
}

// SetTaskState is TaskInState for a test that expects the schema to refuse state.
func SetTaskState(ctx context.Context, db DB, id any, state string) error {
	_, err := db.Exec(ctx, `UPDATE tasks SET state = $2 WHERE id = $1`, id, state)
	return err
}

// TasksCreatedAgo dates the tasks' creation age ago.
func TasksCreatedAgo(t testing.TB, db DB, age time.Duration, ids ...any) {
	t.Helper()
	exec(t, db, `UPDATE tasks SET created_at = now() - $2::interval WHERE id = ANY($1::uuid[])`, ids, age)
}

// TaskCreatedAt dates the task's creation at.
func TaskCreatedAt(t testing.TB, db DB, id any, at time.Time) {
	t.Helper()
	exec(t, db, `UPDATE tasks SET created_at = $2 WHERE id = $1`, id, at)
}

// TaskStartDeadlineAt gives the task the start deadline at.
func TaskStartDeadlineAt(t testing.TB, db DB, id any, at time.Time) {
	t.Helper()
	exec(t, db, `UPDATE tasks SET start_deadline = $2 WHERE id = $1`, id, at)
}

// TaskStartDeadlineIn gives the task a start deadline in from now on the database's
// clock: a negative in is a deadline already passed.
func TaskStartDeadlineIn(t testing.TB, db DB, id any, in time.Duration) {
	t.Helper()
	exec(t, db, `UPDATE tasks SET start_deadline = now() + $2::interval WHERE id = $1`, id, in)
}

// TaskStartOverdue makes the task's start deadline a second past.
func TaskStartOverdue(t testing.TB, db DB, id any) { TaskStartDeadlineIn(t, db, id, -time.Second) }

// TaskStartedAgo dates the task's first start age ago (a task that started once and
// has waited since, parked or queued again).
func TaskStartedAgo(t testing.TB, db DB, id any, age time.Duration) {
	t.Helper()
	exec(t, db, `UPDATE tasks SET started_at = now() - $2::interval WHERE id = $1`, id, age)
}

// TaskPausedAgo dates a paused task's pause age ago, with its pause expiring timeout
// after it began (so at now - age + timeout: a timeout shorter than age has passed).
func TaskPausedAgo(t testing.TB, db DB, id any, age, timeout time.Duration) {
	t.Helper()
	exec(t, db, `UPDATE tasks SET paused_at = now() - $2::interval, pause_expires_at = now() - $2::interval + $3::interval
		WHERE id = $1`, id, age, timeout)
}

// TaskPauseUsed sets what a paused task's limit had used when it paused.
func TaskPauseUsed(t testing.TB, db DB, id any, used int64) {
	t.Helper()
	exec(t, db, `UPDATE tasks SET pause_used = $2 WHERE id = $1`, id, used)
}

// exec runs one update and fails the test unless it changed a row: a factory that
// changed nothing was given a task that is not there.
func exec(t testing.TB, db DB, sql string, args ...any) {
	t.Helper()
	tag, err := db.Exec(context.Background(), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() == 0 {
		t.Fatalf("testfactory: no task %v", args[0])
	}
}
