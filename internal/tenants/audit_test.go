package tenants_test

import (
	"context"
	"errors"
	"testing"

	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/internal/testenv"
)

// failing is an Announcer whose event cannot be written.
type failing struct{ err error }

func (f failing) LimitsChanged(context.Context, *store.Store, tenants.Tenant, tenants.Tenant, int64, string) error {
	return f.err
}

// A tenant's change, its audit row and its event are one transaction: when the event
// cannot be written, neither the change nor its row is.
func TestChangeRowAndEventCommitTogether(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	st := store.New(pool)
	boom := errors.New("the outbox is full")
	svc := tenants.New(st, catalogue(t), tenants.Options{Announcer: failing{boom}})
	if _, err := svc.Create(ctx, tenants.CreateParams{ID: "acme", Plan: ptr("pro")}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Update(ctx, tenants.UpdateParams{ID: "acme", Plan: ptr("enterprise")}); !errors.Is(err, boom) {
		t.Fatalf("update: %v, want the announcer's failure", err)
	}
	got, err := svc.Get(ctx, "acme")
	if err != nil || got.Plan != "pro" {
		t.Fatalf("tenant after the failed change: %+v %v", got, err)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM audit_log WHERE action = 'tenant.update'`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("audit rows of the failed change: %d %v", rows, err)
	}
}
