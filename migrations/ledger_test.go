package migrations_test

import (
	"context"
	"testing"

	"github.com/agentq/agentq/internal/testenv"
)

// Ledger rows outlive their task: deleting a finished task leaves the rows billing
// reads, and writing them costs no lookup of the task.
func TestLedgerRowsOutliveTheirTask(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := context.Background()
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_constraint
		WHERE conrelid = 'usage_ledger'::regclass AND contype = 'f'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("usage_ledger has %d foreign keys, want none", n)
	}
}
