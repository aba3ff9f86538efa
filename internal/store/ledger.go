package store

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

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
