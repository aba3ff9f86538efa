package store

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/agentq/agentq/internal/testenv"
)

// A Store's transactions run their statements' generic plans (the batched writes were
// planned anew on every call otherwise), and the setting ends with the transaction: the
// connection goes back to the pool as it came.
func TestTransactionsRunGenericPlansAndLeaveTheConnectionAsItWas(t *testing.T) {
	cfg := testenv.Postgres(t).Config()
	cfg.MaxConns = 1 // one connection: the statement after the transaction runs on its
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ctx := context.Background()
	mode := func(db dbtx) string {
		t.Helper()
		var m string
		if err := db.QueryRow(ctx, `SHOW plan_cache_mode`).Scan(&m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	before := mode(pool)
	if before == "force_generic_plan" {
		t.Fatalf("plan_cache_mode is %q outside a transaction already; the test cannot tell", before)
	}
	s := New(pool)
	var inside, nested string
	if err := s.InTx(ctx, func(tx *Store) error {
		inside = mode(tx.db)
		return tx.InTx(ctx, func(sp *Store) error { nested = mode(sp.db); return nil })
	}); err != nil {
		t.Fatal(err)
	}
	if inside != "force_generic_plan" || nested != "force_generic_plan" {
		t.Errorf("plan_cache_mode in a transaction = %q, in its savepoint %q; want force_generic_plan", inside, nested)
	}
	if after := mode(pool); after != before {
		t.Errorf("plan_cache_mode after the transaction = %q, want %q as before it", after, before)
	}
}
