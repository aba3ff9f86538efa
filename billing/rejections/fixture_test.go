package rejections_test

import (
	"context"
	"encoding/json"
	"testing"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/billing/usage"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv"
)

// fixture is a test's own Postgres schema and Redis prefix, with the ledger the
// quota counters are rebuilt from.
type fixture struct {
	t      *testing.T
	ctx    context.Context
	st     *store.Store
	rdb    *redis.Client
	keys   rkeys.Keys
	ledger *usage.Ledger
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	t.Parallel()
	rdb, keys := testenv.Redis(t, 1)
	st := store.New(testenv.Postgres(t))
	return &fixture{t: t, ctx: context.Background(), st: st, rdb: rdb, keys: keys, ledger: usage.NewLedger(st)}
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.st.Pool().Exec(f.ctx, sql, args...); err != nil {
		f.t.Fatal(err)
	}
}

// decoded is an event read back with the CloudEvents SDK.
func decoded(t *testing.T, ev outbox.Event) (cloudevents.Event, outbox.LimitData) {
	t.Helper()
	var ce cloudevents.Event
	if err := json.Unmarshal(ev.Payload, &ce); err != nil {
		t.Fatalf("%s: %v", ev.Payload, err)
	}
	if err := ce.Validate(); err != nil {
		t.Fatal(err)
	}
	var d outbox.LimitData
	if err := ce.DataAs(&d); err != nil {
		t.Fatal(err)
	}
	return ce, d
}
