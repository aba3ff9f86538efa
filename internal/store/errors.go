package store

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/agentq/agentq/agentqtype"
)

// Errors the store's calls return for what Postgres said, wrapping its own error (so
// errors.As still finds the *pgconn.PgError); see interpretError.
var (
	// ErrMissingReference: a row names one that does not exist (foreign_key_violation).
	ErrMissingReference = errors.New("store: a referenced row does not exist")
	// ErrCheckViolation: a row breaks a CHECK constraint of the schema.
	ErrCheckViolation = errors.New("store: a row breaks a check of the schema")
	// ErrSerialization: the transaction lost a serialization conflict or a deadlock;
	// running it again may pass.
	ErrSerialization = errors.New("store: the transaction conflicted with another")
)

// dbError is a database error and what it means: its message is the database's, and
// it matches (errors.Is) both the meaning and the database's error.
type dbError struct {
	kind error
	err  error
}

func (e *dbError) Error() string   { return e.err.Error() }
func (e *dbError) Unwrap() []error { return []error{e.kind, e.err} }

// interpretError turns what Postgres and the driver return into the errors callers
// match without knowing the driver: a unique violation is ErrConflict, a value
// Postgres refuses as data agentqtype.ErrValueRefused, a database that cannot be
// reached agentqtype.ErrUnavailable, and so on. Other errors, pgx.ErrNoRows among
// them, are returned as they are.
func interpretError(err error) error {
	if err == nil || errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	var known *dbError
	if errors.As(err, &known) {
		return err
	}
	if kind := errorKind(err); kind != nil {
		return &dbError{kind: kind, err: err}
	}
	return err
}

func errorKind(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return sqlStateKind(pgErr.Code)
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	if errors.As(err, &connErr) || errors.As(err, &netErr) || errors.Is(err, context.DeadlineExceeded) ||
		pgconn.Timeout(err) || pgconn.SafeToRetry(err) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return agentqtype.ErrUnavailable
	}
	return nil
}

// sqlStateKind is what a SQLSTATE means to the store's callers, nil for what they
// need not tell apart from any other failure.
func sqlStateKind(code string) error {
	switch code {
	case "23505": // unique_violation
		return ErrConflict
	case "23503": // foreign_key_violation
		return ErrMissingReference
	case "23514": // check_violation
		return ErrCheckViolation
	case "40001", "40P01": // serialization_failure, deadlock_detected
		return ErrSerialization
	case "22021", // character_not_in_repertoire: invalid UTF-8, NUL in text
		"22P05", // untranslatable_character: \u0000 in jsonb
		"22P02", // invalid_text_representation: e.g. a lone surrogate in jsonb
		"22003", // numeric_value_out_of_range
		"54001": // statement_too_complex: nesting deeper than Postgres's stack
		return agentqtype.ErrValueRefused
	}
	if len(code) >= 2 && (code[:2] == "57" || code[:2] == "08") { // operator intervention, connection exception
		return agentqtype.ErrUnavailable
	}
	return nil
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

func isForeignKeyViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23503"
}

// interpreting is what a Store runs its calls on: its pool or transaction, with
// every error the calls return interpreted (interpretError).
type interpreting struct{ db dbtx }

func (d interpreting) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := d.db.Exec(ctx, sql, args...)
	return tag, interpretError(err)
}

func (d interpreting) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := d.db.Query(ctx, sql, args...)
	if err != nil {
		return rows, interpretError(err)
	}
	return interpretingRows{rows}, nil
}

// SendBatch leaves the interpretation of the results' errors to its caller.
func (d interpreting) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return d.db.SendBatch(ctx, b)
}

func (d interpreting) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return interpretingRow{d.db.QueryRow(ctx, sql, args...)}
}

func (d interpreting) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	n, err := d.db.CopyFrom(ctx, table, columns, src)
	return n, interpretError(err)
}

// Begin returns the driver's transaction: the calls that run on one return through
// beginFunc or inTransaction, which interpret what it failed with.
func (d interpreting) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.db.Begin(ctx)
	return tx, interpretError(err)
}

type interpretingRow struct{ row pgx.Row }

func (r interpretingRow) Scan(dest ...any) error { return interpretError(r.row.Scan(dest...)) }

type interpretingRows struct{ pgx.Rows }

func (r interpretingRows) Scan(dest ...any) error { return interpretError(r.Rows.Scan(dest...)) }
func (r interpretingRows) Err() error             { return interpretError(r.Rows.Err()) }
