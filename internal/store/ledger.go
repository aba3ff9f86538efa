package store

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// LedgerRow is one (task, step, meter) usage row.
type LedgerRow struct {
	TaskID   uuid.UUID
	Step     int
	Meter    string
	TenantID string
	Quantity int64
}

// TaskLedgerParams name one of a tenant's tasks.
type TaskLedgerParams struct {
	TenantID string
	TaskID   uuid.UUID
}

// TaskLedger returns the ledger rows of one of the tenant's tasks in step order (none
// for another tenant's task).
func (s *Store) TaskLedger(ctx context.Context, p TaskLedgerParams) ([]LedgerRow, error) {
	if p.TenantID == "" {
		return nil, ErrNoTenant
	}
	rows, err := s.db.Query(ctx, `
		SELECT task_id, step, meter, tenant_id, quantity FROM usage_ledger
		WHERE task_id = $1 AND tenant_id = $2 ORDER BY step, meter`, p.TaskID, p.TenantID)
	return collect(rows, err, func(row pgx.Row) (LedgerRow, error) {
		var r LedgerRow
		err := row.Scan(&r.TaskID, &r.Step, &r.Meter, &r.TenantID, &r.Quantity)
		return r, err
	})
}
