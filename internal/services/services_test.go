package services_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/credentials"
	"github.com/agentq/agentq/internal/keys"
	"github.com/agentq/agentq/internal/services"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
)

// A change made through services with Redis reaches a process listening on the
// change channel, as a message ParseChange reads back.
func TestChangesArePublished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, rk := testenv.Redis(t, 1)
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	svc := services.New(services.Deps{Pool: testenv.Postgres(t), Plans: plans, Redis: rdb, Keys: rk})
	if svc.Tasks != nil {
		t.Error("Tasks without Admission and Agents")
	}
	sub := rdb.Subscribe(ctx, rk.KeysChangedChannel())
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	plan, weight := "pro", 3
	if _, err := svc.Tenants.Create(ctx, tenants.CreateParams{ID: "acme", Plan: &plan}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Tenants.Update(ctx, tenants.UpdateParams{ID: "acme", Weight: &weight}); err != nil {
		t.Fatal(err)
	}
	k, err := svc.Keys.Create(ctx, keys.CreateParams{TenantID: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Keys.Revoke(ctx, k.Kid); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Credentials.Create(ctx, credentials.CreateParams{Name: "ops", Role: agentqtype.RoleOperator}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Credentials.Revoke(ctx, credentials.RevokeParams{Name: "ops"}); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		what services.Change
		id   string
	}{{services.TenantChanged, "acme"}, {services.KeyChanged, k.Kid}, {services.CredentialChanged, "ops"}, {services.CredentialChanged, "ops"}}
	ch := sub.Channel()
	for _, w := range want {
		select {
		case m := <-ch:
			if what, id := services.ParseChange(m.Payload); what != w.what || id != w.id {
				t.Errorf("message %q reads as %v %q, want %v %q", m.Payload, what, id, w.what, w.id)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no message for %v %q", w.what, w.id)
		}
	}
	if what, _ := services.ParseChange("x:1"); what != services.NoChange {
		t.Errorf("an unknown message reads as %v", what)
	}
}
