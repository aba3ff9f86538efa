package store_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
)

// What Postgres refuses reaches the caller as the store's meaning of it, with the
// database's own error still inside.
func TestErrorsSayWhatPostgresMeant(t *testing.T) {
	t.Parallel()
	ctx, st, _ := setup(t)
	cases := []struct {
		sql  string
		arg  any
		want error
	}{
		{`SELECT $1::text`, "ok", nil},
		{`SELECT $1::text`, "bad \xff", agentqtype.ErrValueRefused},
		{`SELECT $1::int`, "not a number", agentqtype.ErrValueRefused},
		{`SELECT $1::int + 1`, 2147483647, agentqtype.ErrValueRefused},
		{`SELECT '{"a":"\u0000"}'::jsonb ->> $1`, "a", agentqtype.ErrValueRefused},
		{`SELECT $1::text`, "a\x00b", agentqtype.ErrValueRefused},
		{`SELECT $1::jsonb`, `{"a":"\u0000"}`, agentqtype.ErrValueRefused},
		{`SELECT $1::jsonb`, `{"a":"\ud800"}`, agentqtype.ErrValueRefused},
		{`SELECT $1::jsonb`, `{"n":1e1000000}`, agentqtype.ErrValueRefused},
		{`SELECT $1::jsonb`, strings.Repeat("[", 100000) + strings.Repeat("]", 100000), agentqtype.ErrValueRefused},
		{`SELECT 1/$1::int`, 0, nil}, // division_by_zero means nothing to the callers
	}
	for _, c := range cases {
		var out any
		err := store.QueryOne(ctx, st, c.sql, &out, c.arg)
		if c.want == nil && c.arg == "ok" {
			if err != nil {
				t.Errorf("%s: %v", c.sql, err)
			}
			continue
		}
		// Inside a transaction too, where the calls run on the driver's transaction.
		if txErr := st.InTx(ctx, func(tx *store.Store) error { return store.QueryOne(ctx, tx, c.sql, &out, c.arg) }); errors.Is(txErr, agentqtype.ErrValueRefused) != errors.Is(err, agentqtype.ErrValueRefused) {
			t.Errorf("%s: %v on the pool, %v in a transaction", c.sql, err, txErr)
		}
		if c.want == nil {
			if errors.Is(err, agentqtype.ErrValueRefused) || errors.Is(err, agentqtype.ErrUnavailable) {
				t.Errorf("%s: %v, want no meaning attached", c.sql, err)
			}
			continue
		}
		var pgErr *pgconn.PgError
		if !errors.Is(err, c.want) || !errors.As(err, &pgErr) {
			t.Errorf("%s: %v, want %v wrapping the database's error", c.sql, err, c.want)
		}
	}
	tenant := "t-" + t.Name()
	if _, err := st.CreateTenant(ctx, store.CreateTenantParams{ID: tenant, Name: "x", Plan: "free"}); err != nil {
		t.Fatal(err)
	}
	_, err := st.CreateTenant(ctx, store.CreateTenantParams{ID: tenant, Name: "x", Plan: "free"})
	if !errors.Is(err, store.ErrConflict) {
		t.Errorf("a second tenant %s: %v, want ErrConflict", tenant, err)
	}
}
