package store

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agentq/agentq/agentqtype"
)

// The audit log is the deployment's record of its changes, across tenants: its reads
// are unscoped (the operator's), except the tenant's own view of its limit changes
// (ListTenantAudit). Rows are only ever appended, in the transaction of the change
// they record; package internal/audit computes their hashes.

// AuditRow is one row of the audit log as stored. The jsonb columns are their text
// as Postgres gives it back; Before and After are nil for SQL NULL (the object did not
// exist before, or no longer does after).
type AuditRow struct {
	ID           int64
	At           time.Time
	Actor        []byte
	ClaimedActor string
	Reason       string
	Action       string
	Object       []byte
	Before       []byte
	After        []byte
	RequestID    string
	Reverts      *int64
	PrevHash     string
	Hash         string
}

const auditCols = `id, at, actor, claimed_actor, reason, action, object, before, after, request_id, reverts, prev_hash, hash`

func scanAudit(row pgx.Row) (AuditRow, error) {
	var r AuditRow
	err := row.Scan(&r.ID, &r.At, &r.Actor, &r.ClaimedActor, &r.Reason, &r.Action, &r.Object, &r.Before, &r.After,
		&r.RequestID, &r.Reverts, &r.PrevHash, &r.Hash)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, agentqtype.ErrNotFound
	}
	return r, err
}

// AuditHead is the chain's last row: its id (0 before the first) and hash.
type AuditHead struct {
	ID   int64
	Hash string
}

// AuditSlot is where the next row of the chain goes: its id, its time (the database's
// clock) and the hash before it.
type AuditSlot struct {
	ID       int64
	At       time.Time
	PrevHash string
}

// ErrNotInTransaction: a call that must run in the transaction of a change was made
// outside InTx.
var ErrNotInTransaction = errors.New("store: the call needs a transaction (InTx)")

// UnscopedTakeAuditSlot locks the chain's head for the rest of the transaction (appends of
// other transactions wait for its end) and returns the next row's place. Only in a
// transaction: the lock and the row go with the change they record.
func (s *Store) UnscopedTakeAuditSlot(ctx context.Context) (AuditSlot, error) {
	if s.tx == nil {
		return AuditSlot{}, ErrNotInTransaction
	}
	var slot AuditSlot
	err := s.db.QueryRow(ctx, `SELECT hash FROM audit_head FOR UPDATE`).Scan(&slot.PrevHash)
	if err != nil {
		return slot, err
	}
	// The id is taken under the lock, so ids grow in chain order.
	err = s.db.QueryRow(ctx, `SELECT nextval(pg_get_serial_sequence('audit_log', 'id')), date_trunc('microseconds', clock_timestamp())`).
		Scan(&slot.ID, &slot.At)
	return slot, err
}

// InsertAudit writes row r in the slot UnscopedTakeAuditSlot gave and moves the head to it.
func (s *Store) UnscopedInsertAudit(ctx context.Context, r AuditRow) error {
	if s.tx == nil {
		return ErrNotInTransaction
	}
	_, err := s.db.Exec(ctx, `
		INSERT INTO audit_log (id, at, actor, claimed_actor, reason, action, object, before, after, request_id, reverts, prev_hash, hash)
		OVERRIDING SYSTEM VALUE VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`,
		r.ID, r.At, r.Actor, r.ClaimedActor, r.Reason, r.Action, r.Object, jsonOrNull(r.Before), jsonOrNull(r.After),
		r.RequestID, r.Reverts, r.PrevHash, r.Hash)
	if err != nil {
		return err
	}
	_, err = s.db.Exec(ctx, `UPDATE audit_head SET last_id = $1, hash = $2`, r.ID, r.Hash)
	return err
}

// jsonOrNull is b for a jsonb parameter, SQL NULL when b is empty.
func jsonOrNull(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

// UnscopedAuditHead returns the chain's head as audit_head keeps it.
func (s *Store) UnscopedAuditHead(ctx context.Context) (AuditHead, error) {
	var h AuditHead
	err := s.db.QueryRow(ctx, `SELECT last_id, hash FROM audit_head`).Scan(&h.ID, &h.Hash)
	return h, err
}

// UnscopedGetAudit returns row id; agentqtype.ErrNotFound if there is none.
func (s *Store) UnscopedGetAudit(ctx context.Context, id int64) (AuditRow, error) {
	return scanAudit(s.db.QueryRow(ctx, `SELECT `+auditCols+` FROM audit_log WHERE id = $1`, id))
}

// MaxAuditPage bounds a page of the audit log.
const MaxAuditPage = 1000

// ListAuditParams select a page of the audit log, newest first: rows below the id
// Before (0: from the newest), of the filters set, at most Limit.
type ListAuditParams struct {
	Tenant     string
	ObjectKind string
	ObjectID   string // with ObjectKind
	Actor      string // the actor's name
	Since      time.Time
	Before     int64
	Limit      int
}

// UnscopedListAudit returns a page of the audit log, newest first.
func (s *Store) UnscopedListAudit(ctx context.Context, p ListAuditParams) ([]AuditRow, error) {
	if p.Limit <= 0 || p.Limit > MaxAuditPage {
		p.Limit = MaxAuditPage
	}
	q := `SELECT ` + auditCols + ` FROM audit_log WHERE true`
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		q += ` AND ` + cond + `$` + strconv.Itoa(len(args))
	}
	if p.Tenant != "" {
		add(`object ->> 'tenant' = `, p.Tenant)
	}
	if p.ObjectKind != "" {
		add(`object ->> 'kind' = `, p.ObjectKind)
	}
	if p.ObjectID != "" {
		add(`object ->> 'id' = `, p.ObjectID)
	}
	if p.Actor != "" {
		add(`actor ->> 'name' = `, p.Actor)
	}
	if !p.Since.IsZero() {
		add(`at >= `, p.Since)
	}
	if p.Before > 0 {
		add(`id < `, p.Before)
	}
	args = append(args, p.Limit)
	rows, err := s.db.Query(ctx, q+` ORDER BY id DESC LIMIT $`+strconv.Itoa(len(args)), args...)
	return collect(rows, err, scanAudit)
}

// UnscopedAuditChain returns up to limit rows after id after, in chain (id) order:
// the walk that verifies the chain.
func (s *Store) UnscopedAuditChain(ctx context.Context, after int64, limit int) ([]AuditRow, error) {
	rows, err := s.db.Query(ctx, `SELECT `+auditCols+` FROM audit_log WHERE id > $1 ORDER BY id LIMIT $2`, after, limit)
	return collect(rows, err, scanAudit)
}

// UnscopedAuditHasHash reports whether a row of the chain has hash h.
func (s *Store) UnscopedAuditHasHash(ctx context.Context, h string) (bool, error) {
	var ok bool
	err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM audit_log WHERE hash = $1)`, h).Scan(&ok)
	return ok, err
}

// ListTenantAuditParams select the newest rows about one tenant of the actions given.
type ListTenantAuditParams struct {
	TenantID string
	Actions  []string
	Limit    int
}

// ListTenantAudit returns the newest rows whose object is of the tenant, of Actions,
// at most Limit (the tenant panel's changes to its limits).
func (s *Store) ListTenantAudit(ctx context.Context, p ListTenantAuditParams) ([]AuditRow, error) {
	if p.TenantID == "" {
		return nil, ErrNoTenant
	}
	if p.Limit <= 0 || p.Limit > MaxAuditPage {
		p.Limit = MaxAuditPage
	}
	rows, err := s.db.Query(ctx, `SELECT `+auditCols+` FROM audit_log
		WHERE object ->> 'tenant' = $1 AND action = ANY ($2) ORDER BY id DESC LIMIT $3`, p.TenantID, p.Actions, p.Limit)
	return collect(rows, err, scanAudit)
}
