package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Errors callers match with errors.Is.
var (
	ErrConflict = errors.New("store: already exists")
	// ErrNoTenant: a tenant-scoped call was given no tenant. Nothing was read or
	// written.
	ErrNoTenant = errors.New("store: no tenant given")
	// ErrLostClaim: a worker's write named an attempt the task has moved past (another
	// worker took it over, or the janitor re-queued it). Nothing was written; the task,
	// its lease and its dispatch slots belong to the new owner.
	ErrLostClaim = errors.New("store: the task's claim passed to another attempt")
	// ErrTaskEnded: the task reached a terminal state (cancelled, abandoned) while the
	// worker held its claim. Nothing was written.
	ErrTaskEnded = errors.New("store: the task is no longer running")
	// ErrBusy: a lock was not had within the time the call allows. Nothing was
	// written.
	ErrBusy = errors.New("store: busy")
)

// Store runs the calls on a pool, or on one transaction (InTx). Its errors say what
// the database meant (errors.go), so that no caller needs to know the driver's.
type Store struct {
	db   interpreting
	tx   pgx.Tx // the transaction db runs on; nil on the pool
	pool *pgxpool.Pool
}

// dbtx is what a Store's calls run on: *pgxpool.Pool or pgx.Tx.
type dbtx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
	Begin(ctx context.Context) (pgx.Tx, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// New returns a Store on pool.
func New(pool *pgxpool.Pool) *Store { return &Store{db: interpreting{pool}, pool: pool} }

// Pool exposes the pool for migrations and health checks.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Ping checks that Postgres answers.
func (s *Store) Ping(ctx context.Context) error { return interpretError(s.pool.Ping(ctx)) }

// InTx runs fn with a Store whose calls all run in one transaction: it commits when
// fn returns nil and rolls back when fn returns an error (or panics). Inside a
// transaction, InTx and the calls that need one of their own take a savepoint.
func (s *Store) InTx(ctx context.Context, fn func(tx *Store) error) error {
	return s.beginFunc(ctx, func(tx pgx.Tx) error {
		return fn(&Store{db: interpreting{tx}, tx: tx, pool: s.pool})
	})
}

// beginFunc is pgx.BeginFunc on s (a savepoint inside a transaction), its error
// interpreted: the calls inside run on the driver's transaction.
func (s *Store) beginFunc(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return interpretError(pgx.BeginFunc(ctx, s.db, fn))
}

// inTransaction runs fn in s's transaction when s is one, else in a transaction of
// its own. Unlike InTx it takes no savepoint inside a transaction: for calls whose
// every caller rolls back on their failure.
func (s *Store) inTransaction(ctx context.Context, fn func(tx pgx.Tx) error) error {
	if s.tx != nil {
		return interpretError(fn(s.tx))
	}
	return s.beginFunc(ctx, fn)
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
