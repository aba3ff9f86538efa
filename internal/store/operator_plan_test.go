package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/agentq/agentq/internal/pg"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv"
)

// sqlRecorder keeps the statements a pool sends, with their arguments.
type sqlRecorder struct {
	mu   sync.Mutex
	sent []recordedSQL
}

type recordedSQL struct {
	sql  string
	args []any
}

func (r *sqlRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	r.sent = append(r.sent, recordedSQL{d.SQL, d.Args})
	r.mu.Unlock()
	return ctx
}

func (r *sqlRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *sqlRecorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (r *sqlRecorder) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.mu.Lock()
	r.sent = append(r.sent, recordedSQL{d.SQL, d.Args})
	r.mu.Unlock()
}

func (r *sqlRecorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// recordedSchema is a test schema of its own, with a pool on it whose statements a
// recorder keeps (seed is the schema's plain pool).
func recordedSchema(t *testing.T) (seed, pool *pgxpool.Pool, rec *sqlRecorder) {
	t.Helper()
	schema, seed := testenv.Schema(t)
	rec = &sqlRecorder{}
	pool, err := pg.Connect(context.Background(), testenv.DatabaseURL(), schema, func(c *pgxpool.Config) { c.ConnConfig.Tracer = rec })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return seed, pool, rec
}

// last is the statement sent last, forgetting every one.
func (r *sqlRecorder) last(t *testing.T) recordedSQL {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.sent) == 0 {
		t.Fatal("no statement was sent")
	}
	s := r.sent[len(r.sent)-1]
	r.sent = nil
	return s
}

// find is the last statement sent that contains part, forgetting every one.
func (r *sqlRecorder) find(t *testing.T, part string) recordedSQL {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.sent) - 1; i >= 0; i-- {
		if strings.Contains(r.sent[i].sql, part) {
			s := r.sent[i]
			r.sent = nil
			return s
		}
	}
	t.Fatalf("no statement containing %q was sent", part)
	return recordedSQL{}
}

// literal writes an argument as SQL text, for EXECUTE.
func literal(t *testing.T, v any) string {
	t.Helper()
	quote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	switch v := v.(type) {
	case string:
		return quote(v)
	case []string:
		return quote("{"+strings.Join(v, ",")+"}") + "::text[]"
	case time.Time:
		return quote(v.Format(time.RFC3339Nano)) + "::timestamptz"
	case int:
		return fmt.Sprint(v)
	case uuid.UUID:
		return quote(v.String()) + "::uuid"
	case []uuid.UUID:
		l := make([]string, len(v))
		for i, id := range v {
			l[i] = id.String()
		}
		return quote("{"+strings.Join(l, ",")+"}") + "::uuid[]"
	case []int32:
		return quote("{"+strings.Join(strings.Fields(strings.Trim(fmt.Sprint(v), "[]")), ",")+"}") + "::int[]"
	case []int64:
		return quote("{"+strings.Join(strings.Fields(strings.Trim(fmt.Sprint(v), "[]")), ",")+"}") + "::bigint[]"
	case []*string:
		l := make([]string, len(v))
		for i, e := range v {
			l[i] = "NULL"
			if e != nil {
				l[i] = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(*e) + `"`
			}
		}
		return quote("{"+strings.Join(l, ",")+"}") + "::text[]"
	}
	t.Fatalf("no literal for %T", v)
	return ""
}

// planNode is a node of EXPLAIN (FORMAT JSON).
type planNode struct {
	NodeType    string     `json:"Node Type"`
	Relation    string     `json:"Relation Name"`
	Index       string     `json:"Index Name"`
	IndexCond   string     `json:"Index Cond"`
	RecheckCond string     `json:"Recheck Cond"`
	Filter      string     `json:"Filter"`
	ActualRows  float64    `json:"Actual Rows"`
	ActualLoops float64    `json:"Actual Loops"`
	RowsRemoved float64    `json:"Rows Removed by Filter"`
	Plans       []planNode `json:"Plans"`
}

func (n planNode) walk(f func(planNode)) {
	f(n)
	for _, c := range n.Plans {
		c.walk(f)
	}
}

// explainAsRun runs a recorded statement under EXPLAIN ANALYZE with the plan the
// application gets: the generic plan its connections ask for
// (plan_cache_mode=force_generic_plan), or a custom one for a statement sent inline
// or as an unnamed statement (a QueryExecMode other than the cached statement).
func explainAsRun(t *testing.T, ctx context.Context, pool *pgxpool.Pool, s recordedSQL) planNode {
	t.Helper()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	explain, args, done := prepareAsRun(t, ctx, conn, s)
	defer done()
	return explain(args)
}

func firstArg(s recordedSQL) any {
	if len(s.args) == 0 {
		return nil
	}
	return s.args[0]
}

// prepareAsRun prepares a recorded statement on conn as the application sends it (see
// explainAsRun) and returns what runs it under EXPLAIN ANALYZE, with the recorded
// arguments or others: with force_generic_plan, the plan its first run made. done
// undoes the preparation; call it before conn goes back to the pool.
func prepareAsRun(t *testing.T, ctx context.Context, conn *pgxpool.Conn, s recordedSQL) (explain func(args []any) planNode, args []any, done func()) {
	t.Helper()
	var undo []string
	done = func() {
		for _, q := range undo {
			_, _ = conn.Exec(context.Background(), q)
		}
	}
	if mode, ok := firstArg(s).(pgx.QueryExecMode); ok && mode != pgx.QueryExecModeCacheStatement {
		// sent inline or as an unnamed statement: planned for its arguments, a custom plan
		s.args = s.args[1:]
		if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_custom_plan"); err != nil {
			t.Fatal(err)
		}
		undo = append(undo, "RESET plan_cache_mode")
	}
	if _, err := conn.Exec(ctx, "PREPARE op_read AS "+s.sql); err != nil {
		done()
		t.Fatal(err)
	}
	undo = append(undo, "DEALLOCATE op_read")
	explain = func(args []any) planNode {
		t.Helper()
		lits := make([]string, len(args))
		for i, a := range args {
			lits[i] = literal(t, a)
		}
		call := "EXECUTE op_read"
		if len(lits) > 0 {
			call += "(" + strings.Join(lits, ", ") + ")"
		}
		var raw []byte
		if err := conn.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+call).Scan(&raw); err != nil {
			t.Fatal(err)
		}
		var out []struct {
			Plan planNode `json:"Plan"`
		}
		if err := json.Unmarshal(raw, &out); err != nil || len(out) != 1 {
			t.Fatalf("plan %s: %v", raw, err)
		}
		return out[0].Plan
	}
	return explain, s.args, done
}

// The operator view's counts read the rows they count, not a tenant's whole event
// history nor every endpoint's pending deliveries, with the generic plans the
// application runs them with.
func TestOperatorReadsUseTheirIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	seedPool, pool, rec := recordedSchema(t)
	for _, q := range []string{
		`INSERT INTO tenants (id, name, plan) VALUES ('acme', 'Acme', 'pro'), ('other', 'Other', 'pro')`,
		// acme: 20,000 limit hits over the past months, 30 in the last day.
		`INSERT INTO events (id, tenant_id, type, dedupe_key, payload, created_at)
		 SELECT 'ev' || g, 'acme', 'usage.limit_hit', 'd' || g, '\x7b7d',
		   CASE WHEN g <= 30 THEN now() - g * interval '1 minute' ELSE now() - interval '2 days' - g * interval '5 minutes' END
		 FROM generate_series(1, 20000) g`,
		`INSERT INTO events (id, tenant_id, type, dedupe_key, payload) SELECT 'o' || g, 'other', 'usage.limit_hit', 'o' || g, '\x7b7d' FROM generate_series(1, 20) g`,
		`INSERT INTO webhook_endpoints (id, url, types, secret, created_at) VALUES
		 ('00000000-0000-0000-0000-00000000000a', 'https://a.example/', '{usage.limit_hit}', 's', now() - interval '2 minutes'),
		 ('00000000-0000-0000-0000-00000000000b', 'https://b.example/', '{usage.limit_hit}', 's', now() - interval '1 minute')`,
		// Endpoint a has a backlog of 3,000 pending deliveries; b has 5.
		`INSERT INTO webhook_deliveries (endpoint_id, event_seq, event_id, state, attempts, next_attempt_at, finished_at)
		 SELECT CASE WHEN seq <= 3000 OR seq > 3005 THEN '00000000-0000-0000-0000-00000000000a'::uuid ELSE '00000000-0000-0000-0000-00000000000b'::uuid END,
		   seq, id, CASE WHEN seq <= 3005 THEN 'pending' ELSE 'succeeded' END, 1, now(),
		   CASE WHEN seq <= 3005 THEN NULL ELSE now() END
		 FROM events WHERE tenant_id = 'acme' AND seq <= 8000`,
		// Endpoint b made 3 attempts, then a made 20,000: b's last failure is looked for
		// among b's own attempts, not behind all of a's.
		`INSERT INTO webhook_attempts (delivery_id, endpoint_id, event_id, attempt, attempted_at, duration_ms, result)
		 SELECT d.id, d.endpoint_id, d.event_id, 1, now(), 1, 'retrying' FROM webhook_deliveries d
		 WHERE d.endpoint_id = '00000000-0000-0000-0000-00000000000b' AND d.event_seq <= 3003`,
		`INSERT INTO webhook_attempts (delivery_id, endpoint_id, event_id, attempt, attempted_at, duration_ms, result)
		 SELECT d.id, d.endpoint_id, d.event_id, g, now(), 1, 'retrying' FROM webhook_deliveries d, generate_series(1, 4) g
		 WHERE d.endpoint_id = '00000000-0000-0000-0000-00000000000a' AND d.event_seq > 3005`,
		// Vacuumed, as autovacuum keeps these insert-mostly tables: the last-failure
		// look is an index-only scan of the endpoint's attempts once their pages are
		// all-visible (with no visibility map at all Postgres may still walk the
		// primary key backwards).
		`VACUUM ANALYZE`,
	} {
		if _, err := seedPool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	st := store.New(pool)

	hits, err := st.UnscopedLimitHits(ctx, []string{"acme", "other"}, "usage.limit_hit", time.Now().Add(-24*time.Hour))
	if err != nil || hits["acme"].Events != 30 || hits["other"].Events != 20 {
		t.Fatalf("limit hits %v %v", hits, err)
	}
	plan := explainAsRun(t, ctx, pool, rec.last(t))
	var read float64
	plan.walk(func(n planNode) {
		if n.Relation == "events" || strings.HasPrefix(n.Index, "events_") {
			read = max(read, (n.ActualRows+n.RowsRemoved)*max(n.ActualLoops, 1))
		}
	})
	if read > 100 {
		t.Errorf("counting 50 limit hits of the last day read %v rows of events (want about 50)", read)
	}

	health, err := st.UnscopedWebhookHealth(ctx)
	if err != nil || len(health) != 2 || health[0].Pending != 3000 || health[1].Pending != 5 {
		t.Fatalf("webhook health %+v %v", health, err)
	}
	plan = explainAsRun(t, ctx, pool, rec.last(t))
	plan.walk(func(n planNode) {
		if n.Relation != "webhook_deliveries" && !strings.HasPrefix(n.Index, "webhook_deliveries") &&
			n.Relation != "webhook_attempts" && !strings.HasPrefix(n.Index, "webhook_attempts") {
			return
		}
		// A scan that finds an endpoint's rows by filtering reads the other endpoints'.
		if n.NodeType == "Seq Scan" || strings.Contains(n.Filter, "endpoint_id") {
			t.Errorf("%s on %s (%s) reads other endpoints' rows (filter %q, %v rows removed)", n.NodeType, n.Relation, n.Index, n.Filter, n.RowsRemoved*n.ActualLoops)
		}
	})
}
