package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
)

// scopedCall is one tenant-scoped call made without a tenant.
type scopedCall struct {
	name string // the method's name
	call func(ctx context.Context, st *store.Store) error
}

// scopedCalls lists every tenant-scoped call of the store, each given an empty tenant
// but otherwise naming data that exists (fx).
func scopedCalls(fx fixture) []scopedCall {
	name := "renamed"
	task := func(tenant string) store.InsertTaskParams {
		return store.InsertTaskParams{ID: uuid.Must(uuid.NewV7()), TenantID: tenant, Kid: fx.kid, Agent: "sim",
			Input: json.RawMessage(`{}`), Budget: json.RawMessage(`{}`), RequestHash: []byte{1}}
	}
	return []scopedCall{
		{"CreateTenant", func(ctx context.Context, st *store.Store) error {
			_, err := st.CreateTenant(ctx, store.CreateTenantParams{Name: "x", Plan: "pro"})
			return err
		}},
		{"GetTenant", func(ctx context.Context, st *store.Store) error {
			_, err := st.GetTenant(ctx, "")
			return err
		}},
		{"UpdateTenant", func(ctx context.Context, st *store.Store) error {
			_, err := st.UpdateTenant(ctx, store.UpdateTenantParams{Name: &name})
			return err
		}},
		{"LockTenant", func(ctx context.Context, st *store.Store) error {
			_, err := st.LockTenant(ctx, "")
			return err
		}},
		{"ReplaceTenant", func(ctx context.Context, st *store.Store) error {
			_, err := st.ReplaceTenant(ctx, store.ReplaceTenantParams{Name: "x", Plan: "pro", Status: "active"})
			return err
		}},
		{"ListTenantAudit", func(ctx context.Context, st *store.Store) error {
			_, err := st.ListTenantAudit(ctx, store.ListTenantAuditParams{Actions: []string{"tenant.update"}})
			return err
		}},
		{"RevokePanelLinks", func(ctx context.Context, st *store.Store) error {
			_, err := st.RevokePanelLinks(ctx, store.RevokePanelLinksParams{At: time.Now()})
			return err
		}},
		{"CreateKey", func(ctx context.Context, st *store.Store) error {
			_, err := st.CreateKey(ctx, store.CreateKeyParams{Kid: "new-00000000", SecretHash: []byte{1}})
			return err
		}},
		{"ListKeys", func(ctx context.Context, st *store.Store) error {
			_, err := st.ListKeys(ctx, store.ListKeysParams{})
			return err
		}},
		{"RotateKey", func(ctx context.Context, st *store.Store) error {
			_, err := st.RotateKey(ctx, store.RotateKeyParams{Kid: fx.kid, SecretHash: []byte{2}})
			return err
		}},
		{"RevokeKey", func(ctx context.Context, st *store.Store) error {
			return st.RevokeKey(ctx, store.RevokeKeyParams{Kid: fx.kid})
		}},
		{"InsertTask", func(ctx context.Context, st *store.Store) error {
			_, _, err := st.InsertTask(ctx, task(""))
			return err
		}},
		{"InsertTasks", func(ctx context.Context, st *store.Store) error {
			// One good row first: a refused batch writes none of its rows.
			_, err := st.InsertTasks(ctx, []store.InsertTaskParams{task("acme"), task("")})
			return err
		}},
		{"BulkInsertQueued", func(ctx context.Context, st *store.Store) error {
			// One good row first: a refused batch writes none of its rows.
			_, err := st.BulkInsertQueued(ctx, []store.InsertTaskParams{task("acme"), task("")})
			return err
		}},
		{"TreeTotals", func(ctx context.Context, st *store.Store) error {
			_, err := st.TreeTotals(ctx, store.TreeTotalsParams{Roots: []uuid.UUID{fx.task}})
			return err
		}},
		{"TaskTree", func(ctx context.Context, st *store.Store) error {
			_, err := st.TaskTree(ctx, store.TaskTreeParams{Root: fx.task, Limit: 10})
			return err
		}},
		{"GetTask", func(ctx context.Context, st *store.Store) error {
			_, err := st.GetTask(ctx, store.GetTaskParams{ID: fx.task})
			return err
		}},
		{"GetTaskByIdempotencyKey", func(ctx context.Context, st *store.Store) error {
			_, err := st.GetTaskByIdempotencyKey(ctx, store.GetTaskByIdempotencyKeyParams{Key: fx.idem})
			return err
		}},
		{"ListTasks", func(ctx context.Context, st *store.Store) error {
			_, err := st.ListTasks(ctx, store.ListTasksParams{Limit: 10})
			return err
		}},
		{"CountTasks", func(ctx context.Context, st *store.Store) error {
			_, err := st.CountTasks(ctx, store.CountTasksParams{})
			return err
		}},
		{"FinishTask", func(ctx context.Context, st *store.Store) error {
			_, _, err := st.FinishTask(ctx, store.FinishTaskParams{ID: fx.task, From: []store.TaskState{agentqtype.TaskStateQueued},
				To: agentqtype.TaskStateKilled, Error: "cancelled"})
			return err
		}},
		{"ResumeTask", func(ctx context.Context, st *store.Store) error {
			_, _, err := st.ResumeTask(ctx, store.ResumeTaskParams{ID: fx.task})
			return err
		}},
		{"TaskLedger", func(ctx context.Context, st *store.Store) error {
			_, err := st.TaskLedger(ctx, store.TaskLedgerParams{TaskID: fx.task})
			return err
		}},
		{"LedgerUsage", func(ctx context.Context, st *store.Store) error {
			_, err := st.LedgerUsage(ctx, store.LedgerUsageParams{StepsSince: time.Now().Add(-time.Hour),
				PeriodStart: time.Now().Add(-time.Hour), PeriodEnd: time.Now().Add(time.Hour)})
			return err
		}},
		{"InsertEvent", func(ctx context.Context, st *store.Store) error {
			_, err := st.InsertEvent(ctx, store.InsertEventParams{ID: "new", Type: "usage.limit_hit", DedupeKey: "new", Payload: []byte("{}")})
			return err
		}},
		{"SLABreaches", func(ctx context.Context, st *store.Store) error {
			_, err := st.SLABreaches(ctx, "", time.Time{})
			return err
		}},
		{"RecentEventsAndDailyRollups", func(ctx context.Context, st *store.Store) error {
			// Either read without a tenant refuses the call.
			for _, ev := range []string{"", "acme"} {
				for _, days := range []string{"", "acme"} {
					if ev != "" && days != "" {
						continue
					}
					_, _, err := st.RecentEventsAndDailyRollups(ctx, store.RecentEventsParams{TenantID: ev, Limit: 10},
						store.DailyRollupsParams{TenantID: days, From: "2026-01-01", To: "2026-01-31"})
					if !errors.Is(err, store.ErrNoTenant) {
						return fmt.Errorf("events tenant %q, rollups tenant %q: %w", ev, days, err)
					}
				}
			}
			return store.ErrNoTenant
		}},
		{"ListLiveTasks", func(ctx context.Context, st *store.Store) error {
			_, err := st.ListLiveTasks(ctx, store.LiveTasksParams{Limit: 10})
			return err
		}},
		{"RejectionCounts", func(ctx context.Context, st *store.Store) error {
			_, err := st.RejectionCounts(ctx, store.RejectionCountsParams{Until: time.Now()})
			return err
		}},
		{"CreateTenantWebhook", func(ctx context.Context, st *store.Store) error {
			_, _, err := st.CreateTenantWebhook(ctx, store.CreateTenantWebhookParams{ID: uuid.New(), URL: "https://x.example/",
				Types: []string{"usage.limit_hit"}, Secret: "whsec_x", Max: -1})
			return err
		}},
		{"ListTenantWebhooks", func(ctx context.Context, st *store.Store) error {
			_, err := st.ListTenantWebhooks(ctx, store.ListTenantWebhooksParams{})
			return err
		}},
		{"GetTenantWebhook", func(ctx context.Context, st *store.Store) error {
			_, err := st.GetTenantWebhook(ctx, store.TenantWebhookParams{ID: fx.webhook})
			return err
		}},
		{"DeleteTenantWebhook", func(ctx context.Context, st *store.Store) error {
			return st.DeleteTenantWebhook(ctx, store.TenantWebhookParams{ID: fx.webhook})
		}},
		{"RotateTenantWebhookSecret", func(ctx context.Context, st *store.Store) error {
			_, err := st.RotateTenantWebhookSecret(ctx, store.RotateTenantWebhookParams{
				RotateWebhookParams: store.RotateWebhookParams{ID: fx.webhook, Secret: "whsec_y", PreviousExpiresAt: time.Now()}})
			return err
		}},
		{"ListEvents", func(ctx context.Context, st *store.Store) error {
			_, err := st.ListEvents(ctx, store.ListEventsParams{})
			return err
		}},
	}
}

// unprefixedGlobal are the exported calls that hold no tenant's data: the
// connection, the deployment's HTTP agents, its model pools and their bindings, the
// addresses its API processes advertise, and its admin credentials.
var unprefixedGlobal = []string{"Pool", "Ping", "InTx", "PutAgent", "RotateAgentSecret", "GetAgent", "ListAgents", "DeleteAgent",
	"PutPool", "GetPool", "ListPools", "DeletePool", "PutAgentPool", "GetAgentPool", "ListAgentPools", "ListPoolAgents",
	"GetAgentBinding", "DeleteAgentPool", "AdvertiseAPIAddress", "NewestAPIAddress",
	"LockAgent", "SetAgentSettings", "LockPool", "LockAgentPool",
	"CreateCredential", "GetCredential", "CredentialByHash", "ListCredentials", "AnyLiveCredential", "RotateCredential",
	"RevokeCredential"}

// fixture is data of tenant acme the scoped calls name.
type fixture struct {
	kid     string
	task    uuid.UUID
	idem    string
	webhook uuid.UUID // acme's own endpoint
}

func newFixture(t *testing.T, ctx context.Context, st *store.Store) fixture {
	t.Helper()
	fx := fixture{kid: "acme-0badc0de", idem: "once"}
	if _, err := st.CreateKey(ctx, store.CreateKeyParams{Kid: fx.kid, TenantID: "acme", SecretHash: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	fx.task = uuid.Must(uuid.NewV7())
	if _, _, err := st.InsertTask(ctx, store.InsertTaskParams{ID: fx.task, TenantID: "acme", Kid: fx.kid, Agent: "sim",
		Input: json.RawMessage(`{}`), Budget: json.RawMessage(`{}`), IdempotencyKey: fx.idem, RequestHash: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	task, _, err := st.UnscopedStartTask(ctx, fx.task)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.UnscopedRecordStep(ctx, store.RecordStepParams{ID: fx.task, Attempt: task.Attempt, Step: 1, Tokens: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.UnscopedRequeueTask(ctx, store.Claim{ID: fx.task, Attempt: task.Attempt}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.InsertEvent(ctx, store.InsertEventParams{ID: "ev-acme", TenantID: "acme", Type: "usage.limit_hit",
		DedupeKey: "acme|x", Payload: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	fx.webhook = uuid.New()
	if _, _, err := st.CreateTenantWebhook(ctx, store.CreateTenantWebhookParams{TenantID: "acme", ID: fx.webhook,
		URL: "https://acme.example/hook", Types: []string{"usage.limit_hit"}, Secret: "whsec_x", Max: -1}); err != nil {
		t.Fatal(err)
	}
	return fx
}

// snapshot is every row of every table the store writes, as text.
func snapshot(t *testing.T, ctx context.Context, pool *pgxpool.Pool) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, table := range []string{"tenants", "api_keys", "tasks", "usage_ledger", "agents", "events", "webhook_endpoints"} {
		var rows string
		if err := pool.QueryRow(ctx, `SELECT COALESCE(string_agg(x::text, E'\n' ORDER BY x::text), '') FROM `+table+` x`).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		out[table] = rows
	}
	return out
}

// Every tenant-scoped call refuses an empty tenant with ErrNoTenant and reads or
// writes nothing, though the data it names exists.
func TestScopedCallsRefuseNoTenant(t *testing.T) {
	t.Parallel()
	ctx, st, pool := setup(t)
	fx := newFixture(t, ctx, st)
	before := snapshot(t, ctx, pool)
	for _, c := range scopedCalls(fx) {
		err := c.call(ctx, st)
		if !errors.Is(err, store.ErrNoTenant) {
			t.Errorf("%s without a tenant: %v, want ErrNoTenant", c.name, err)
		}
		if after := snapshot(t, ctx, pool); !reflect.DeepEqual(after, before) {
			t.Fatalf("%s without a tenant changed the database:\nbefore %v\nafter  %v", c.name, before, after)
		}
	}
}

// Each exported call of the store is tenant-scoped (and in the refusal table),
// named Unscoped…, or holds no tenant's data: a new call cannot slip in unclassified.
func TestEveryCallIsClassified(t *testing.T) {
	scoped := map[string]bool{}
	for _, c := range scopedCalls(fixture{}) {
		scoped[c.name] = true
	}
	typ := reflect.TypeFor[*store.Store]()
	for i := range typ.NumMethod() {
		m := typ.Method(i).Name
		switch {
		case scoped[m]:
			delete(scoped, m)
		case strings.HasPrefix(m, "Unscoped"), slices.Contains(unprefixedGlobal, m):
		default:
			t.Errorf("(*Store).%s is neither in the tenant-scoped refusal table, nor named Unscoped…, nor a call without tenant data", m)
		}
	}
	for m := range scoped {
		t.Errorf("the refusal table names %s, which the store does not have", m)
	}
}

// A tenant's scoped calls do not see or change another tenant's data.
func TestScopedCallsKeepToTheirTenant(t *testing.T) {
	t.Parallel()
	ctx, st, pool := setup(t)
	fx := newFixture(t, ctx, st)
	if _, err := st.CreateTenant(ctx, store.CreateTenantParams{ID: "globex", Name: "Globex", Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, ctx, pool)
	const other = "globex"
	if _, err := st.GetTask(ctx, store.GetTaskParams{TenantID: other, ID: fx.task}); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Errorf("GetTask of another tenant's task: %v, want agentqtype.ErrNotFound", err)
	}
	if _, err := st.GetTaskByIdempotencyKey(ctx, store.GetTaskByIdempotencyKeyParams{TenantID: other, Key: fx.idem}); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Errorf("GetTaskByIdempotencyKey with another tenant's key: %v, want agentqtype.ErrNotFound", err)
	}
	if l, err := st.ListTasks(ctx, store.ListTasksParams{TenantID: other, Limit: 10}); err != nil || len(l) != 0 {
		t.Errorf("ListTasks of the other tenant: %d tasks, %v", len(l), err)
	}
	if n, err := st.CountTasks(ctx, store.CountTasksParams{TenantID: other}); err != nil || n != 0 {
		t.Errorf("CountTasks of the other tenant: %d, %v", n, err)
	}
	if rows, err := st.TaskLedger(ctx, store.TaskLedgerParams{TenantID: other, TaskID: fx.task}); err != nil || len(rows) != 0 {
		t.Errorf("TaskLedger of another tenant's task: %d rows, %v", len(rows), err)
	}
	window := store.LedgerUsageParams{StepsSince: time.Now().Add(-time.Hour), PeriodStart: time.Now().Add(-time.Hour), PeriodEnd: time.Now().Add(time.Hour)}
	theirs, mine := window, window
	theirs.TenantID, mine.TenantID = other, "acme"
	if u, err := st.LedgerUsage(ctx, theirs); err != nil || len(u.StepsByHour) != 0 || u.Tokens != 0 || u.CostMicro != 0 {
		t.Errorf("LedgerUsage of the other tenant: %+v, %v", u, err)
	}
	if u, err := st.LedgerUsage(ctx, mine); err != nil || len(u.StepsByHour) != 1 || u.Tokens != 3 {
		t.Errorf("LedgerUsage of acme: %+v, %v", u, err)
	}
	if _, ok, err := st.FinishTask(ctx, store.FinishTaskParams{TenantID: other, ID: fx.task,
		From: []store.TaskState{agentqtype.TaskStateQueued}, To: agentqtype.TaskStateKilled}); ok || err != nil {
		t.Errorf("FinishTask of another tenant's task: ok %v, %v", ok, err)
	}
	if evs, err := st.ListEvents(ctx, store.ListEventsParams{TenantID: other}); err != nil || len(evs) != 0 {
		t.Errorf("ListEvents of the other tenant: %d events, %v", len(evs), err)
	}
	if ks, err := st.ListKeys(ctx, store.ListKeysParams{TenantID: other}); err != nil || len(ks) != 0 {
		t.Errorf("ListKeys of the other tenant: %d keys, %v", len(ks), err)
	}
	if _, err := st.RotateKey(ctx, store.RotateKeyParams{TenantID: other, Kid: fx.kid, SecretHash: []byte{9}}); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Errorf("RotateKey of another tenant's key: %v, want agentqtype.ErrNotFound", err)
	}
	if err := st.RevokeKey(ctx, store.RevokeKeyParams{TenantID: other, Kid: fx.kid}); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Errorf("RevokeKey of another tenant's key: %v, want agentqtype.ErrNotFound", err)
	}
	if after := snapshot(t, ctx, pool); !reflect.DeepEqual(after, before) {
		t.Fatalf("another tenant's calls changed acme's data:\nbefore %v\nafter  %v", before, after)
	}
	// Acme's own calls see it.
	if got, err := st.GetTask(ctx, store.GetTaskParams{TenantID: "acme", ID: fx.task}); err != nil || got.ID != fx.task {
		t.Fatalf("GetTask by its tenant: %v", err)
	}
	if rows, err := st.TaskLedger(ctx, store.TaskLedgerParams{TenantID: "acme", TaskID: fx.task}); err != nil || len(rows) != 3 {
		t.Fatalf("TaskLedger by its tenant: %d rows, %v", len(rows), err)
	}
	// The feed shows an event once every older transaction of the server has ended;
	// another test's may still be open, so wait for it.
	var evs []store.Event
	var err error
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		evs, err = st.ListEvents(ctx, store.ListEventsParams{TenantID: "acme"})
		if err != nil || len(evs) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || len(evs) != 1 || evs[0].ID != "ev-acme" {
		t.Fatalf("ListEvents by its tenant: %+v, %v", evs, err)
	}
}
