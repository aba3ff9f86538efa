package audit_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv"
)

func setup(t *testing.T) (context.Context, *store.Store, *pgxpool.Pool, *audit.Log) {
	t.Helper()
	pool := testenv.Postgres(t)
	st := store.New(pool)
	return context.Background(), st, pool, audit.NewLog(st)
}

// entry is a change of tenant id's plan from "free" to plan.
func entry(id, plan string) audit.Entry {
	return audit.Entry{Action: audit.ActionTenantUpdate, Object: audit.Object{Kind: audit.KindTenant, ID: id, Tenant: id},
		Before: map[string]any{"plan": "free", "weight": 1.0, "cost": 0.05}, After: map[string]any{"plan": plan, "weight": 1.0, "cost": 1e-7}}
}

// appendRows appends n rows, each in a transaction of its own.
func appendRows(t *testing.T, ctx context.Context, st *store.Store, n int) []audit.Head {
	t.Helper()
	var out []audit.Head
	for i := range n {
		h, err := audit.Record(ctx, st, entry("acme", "plan-"+string(rune('a'+i))))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h)
	}
	return out
}

func verify(t *testing.T, ctx context.Context, l *audit.Log, expect string) audit.Verification {
	t.Helper()
	v, err := l.Verify(ctx, expect)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// behind runs sql with the table's user triggers disabled, as someone with the
// table's ownership could, and enables them again.
func behind(t *testing.T, ctx context.Context, pool *pgxpool.Pool, table, sql string, args ...any) {
	t.Helper()
	for _, q := range []string{`ALTER TABLE ` + table + ` DISABLE TRIGGER USER`, sql, `ALTER TABLE ` + table + ` ENABLE TRIGGER USER`} {
		var a []any
		if q == sql {
			a = args
		}
		if _, err := pool.Exec(ctx, q, a...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// A row and the change it records commit together or not at all.
func TestAppendGoesWithItsTransaction(t *testing.T) {
	t.Parallel()
	ctx, st, pool, l := setup(t)
	boom := errors.New("the change failed after its row was written")
	err := st.InTx(ctx, func(tx *store.Store) error {
		if _, err := tx.CreateTenant(ctx, store.CreateTenantParams{ID: "acme", Name: "acme", Plan: "pro"}); err != nil {
			return err
		}
		if _, err := audit.Append(ctx, tx, entry("acme", "pro")); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTx: %v", err)
	}
	var tenants, rows int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM tenants), (SELECT count(*) FROM audit_log)`).Scan(&tenants, &rows); err != nil {
		t.Fatal(err)
	}
	if tenants != 0 || rows != 0 {
		t.Fatalf("after the rollback: %d tenants, %d audit rows; want none of either", tenants, rows)
	}
	if h, err := l.Head(ctx); err != nil || h.ID != 0 || h.Hash != audit.Genesis {
		t.Fatalf("head after the rollback: %+v %v", h, err)
	}
	if _, err := audit.Append(ctx, st, entry("acme", "pro")); !errors.Is(err, store.ErrNotInTransaction) {
		t.Fatalf("Append outside a transaction: %v, want ErrNotInTransaction", err)
	}

	ctx = agentqtype.WithActor(ctx, agentqtype.Actor{Kind: agentqtype.ActorCredential, Name: "alice", Role: agentqtype.RoleOperator,
		ClaimedActor: "bob", Reason: "ticket 7", RequestID: "req-1"})
	h, err := audit.Record(ctx, st, entry("acme", "pro"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := l.Get(ctx, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r.Actor.Kind != agentqtype.ActorCredential || r.Actor.Name != "alice" || r.Actor.Role != agentqtype.RoleOperator ||
		r.ClaimedActor != "bob" || r.Reason != "ticket 7" || r.RequestID != "req-1" || r.PrevHash != audit.Genesis || r.Hash != h.Hash {
		t.Fatalf("row: %+v", r)
	}
}

// The table refuses every UPDATE, DELETE and TRUNCATE, and the head only moves
// forward.
func TestRowsCannotChange(t *testing.T) {
	t.Parallel()
	ctx, st, pool, _ := setup(t)
	appendRows(t, ctx, st, 2)
	for _, q := range []string{
		`UPDATE audit_log SET reason = 'covered up'`,
		`DELETE FROM audit_log WHERE id = (SELECT max(id) FROM audit_log)`,
		`TRUNCATE audit_log`,
		`UPDATE audit_head SET last_id = 0, hash = repeat('0', 64)`,
		`DELETE FROM audit_head`,
		`TRUNCATE audit_head`,
	} {
		if _, err := pool.Exec(ctx, q); err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("%s: %v, want it refused", q, err)
		}
	}
}

// Verify holds on an untouched chain and names the first row that does not, whatever
// was done behind the triggers' back.
func TestVerifyCatchesTampering(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, table, sql string
		brokenAt         int // index of the row named; -1: after the last
		problem          string
	}{
		{"a row altered", "audit_log", `UPDATE audit_log SET reason = 'nothing to see' WHERE id = $1`, 2, "was altered"},
		{"a jsonb value altered", "audit_log", `UPDATE audit_log SET after = jsonb_set(after, '{plan}', '"enterprise"') WHERE id = $1`, 2, "was altered"},
		{"a row removed", "audit_log", `DELETE FROM audit_log WHERE id = $1`, 3, "removed or altered"},
		{"the last row removed", "audit_log", `DELETE FROM audit_log WHERE id = $1 + 2`, -1, "were removed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, st, pool, l := setup(t)
			heads := appendRows(t, ctx, st, 5)
			if v := verify(t, ctx, l, heads[4].Hash); !v.OK() || v.Rows != 5 || v.Last != heads[4] {
				t.Fatalf("untouched chain: %+v", v)
			}
			behind(t, ctx, pool, tc.table, tc.sql, heads[2].ID)
			v := verify(t, ctx, l, "")
			want := int64(0)
			if tc.brokenAt >= 0 {
				want = heads[tc.brokenAt].ID
			}
			if v.OK() || v.BrokenAt != want || !strings.Contains(v.Problem, tc.problem) {
				t.Fatalf("verify: %+v, want broken at %d (%q)", v, want, tc.problem)
			}
		})
	}
}

// A tail cut off with the head put back where it ends verifies on its own, and is
// caught against a head kept earlier.
func TestVerifyCatchesACutTailAgainstAKeptHead(t *testing.T) {
	t.Parallel()
	ctx, st, pool, l := setup(t)
	heads := appendRows(t, ctx, st, 4)
	kept := heads[3].Hash
	behind(t, ctx, pool, "audit_log", `DELETE FROM audit_log WHERE id > $1`, heads[1].ID)
	behind(t, ctx, pool, "audit_head", `UPDATE audit_head SET last_id = $1, hash = $2`, heads[1].ID, heads[1].Hash)
	if v := verify(t, ctx, l, ""); !v.OK() {
		t.Fatalf("without a kept head the cut chain still holds: %+v", v)
	}
	v := verify(t, ctx, l, kept)
	if v.OK() || !strings.Contains(v.Problem, "expected head") || !strings.Contains(v.Problem, "cut off") {
		t.Fatalf("verify --expect-head: %+v", v)
	}
	if v := verify(t, ctx, l, heads[1].Hash); !v.OK() {
		t.Fatalf("a kept head still in the chain: %+v", v)
	}
}

// Concurrent appends follow one another: the chain holds and its order is id order.
func TestConcurrentAppendsChain(t *testing.T) {
	t.Parallel()
	ctx, st, _, l := setup(t)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Go(func() {
			_, err := audit.Record(ctx, st, entry("acme", "p"+string(rune('a'+i))))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if v := verify(t, ctx, l, ""); !v.OK() || v.Rows != 20 {
		t.Fatalf("after concurrent appends: %+v", v)
	}
}

// The canonical encoding does not depend on key order, spacing or how a number is
// written, and tells different values apart.
func TestCanonical(t *testing.T) {
	t.Parallel()
	same := [][2]string{
		{`{"b":1,"a":[1.0,"x"]}`, `{ "a" : [1, "x"], "b": 1e0 }`},
		{`{"n":1000000000000000000000}`, `{"n":1e21}`},
		{`{"s":"<&>"}`, `{"s":"\u003c\u0026\u003e"}`},
		{`[0.25,0.1,1e-7]`, `[2.5e-1,0.10,0.0000001]`},
		{``, `null`},
	}
	for _, p := range same {
		a, err1 := audit.Canonical([]byte(p[0]))
		b, err2 := audit.Canonical([]byte(p[1]))
		if err1 != nil || err2 != nil || string(a) != string(b) {
			t.Errorf("%s and %s: %s / %s (%v %v)", p[0], p[1], a, b, err1, err2)
		}
	}
	c, err := audit.Canonical([]byte(`[0.25,-1.5e-3,12.50]`))
	if err != nil || string(c) != `[0.25,-0.0015,12.5]` || !json.Valid(c) {
		t.Errorf("decimals: %s %v", c, err)
	}
	a, _ := audit.Canonical([]byte(`{"n":9007199254740993}`))
	b, _ := audit.Canonical([]byte(`{"n":9007199254740992}`))
	if string(a) == string(b) {
		t.Errorf("two integers past float64's precision encode alike: %s", a)
	}
	if _, err := audit.Canonical([]byte(`{"n":1e99999999}`)); err == nil {
		t.Error("a number with a huge exponent was expanded")
	}
}

// Diff names the fields that moved.
func TestDiff(t *testing.T) {
	t.Parallel()
	d, err := audit.Diff(json.RawMessage(`{"plan":"free","weight":null,"x":1}`), json.RawMessage(`{"plan":"pro","weight":null,"x":1.0}`))
	if err != nil || len(d) != 1 || d[0].Field != "plan" || string(d[0].Before) != `"free"` || string(d[0].After) != `"pro"` {
		t.Fatalf("diff: %+v %v", d, err)
	}
	d, err = audit.Diff(json.RawMessage(`null`), json.RawMessage(`{"plan":"pro"}`))
	if err != nil || len(d) != 1 || string(d[0].Before) != "null" {
		t.Fatalf("diff from nothing: %+v %v", d, err)
	}
}
