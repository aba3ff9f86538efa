package store

import (
	"context"
	"fmt"
	"time"
)

// AddStepToRollupsAt adds a step recorded at at to the tenant's rollups, on s's
// transaction, as recording a step does: tests place steps at the times they need
// (the ledger's recorded_at is the transaction's start, which they cannot choose).
func AddStepToRollupsAt(ctx context.Context, s *Store, tenantID string, at time.Time, tokens, costMicro int64) (RecordedStep, error) {
	tx := s.tx
	if tx == nil {
		return RecordedStep{}, fmt.Errorf("store: AddStepToRollupsAt needs a transaction")
	}
	ten, u, err := addStepToRollups(ctx, tx, tenantID, at, tokens, costMicro)
	return RecordedStep{Tenant: ten, Usage: u}, err
}

// BackendPID is the Postgres backend of s's connection (its transaction's).
func BackendPID(ctx context.Context, s *Store) (int, error) {
	var pid int
	err := s.db.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid)
	return pid, err
}

// QueryOne scans the one row of sql on s into dest, as the store's calls do.
func QueryOne(ctx context.Context, s *Store, sql string, dest any, args ...any) error {
	return s.db.QueryRow(ctx, sql, args...).Scan(dest)
}
