package webhooks_test

import (
	"context"
	"strings"
	"testing"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/billing/webhooks"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// A tenant.limits_changed goes to the operator's endpoints as the operators' copy
// (naming who and why) and to the tenant's own endpoints as the tenant's copy.
func TestLimitsChangedCopiesReachTheirEndpoints(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	operator := e.create(t, "https://ops.example/hook", "", outbox.TypeLimitsChanged)
	scoped := e.create(t, "https://ops.example/acme", "acme", outbox.TypeLimitsChanged)
	hooks := webhooks.NewWebhooks(e.st, webhooks.WebhooksOptions{
		EndpointLimit: func(context.Context, string) (quotas.Limit, error) { return quotas.Unlimited, nil },
	})
	own, err := hooks.CreateForTenant(e.ctx, webhooks.TenantWebhookParams{TenantID: "acme", URL: "https://acme.example/hook",
		Types: []string{outbox.TypeLimitsChanged}})
	if err != nil {
		t.Fatal(err)
	}
	before := outbox.LimitsState{Plan: "free", Status: "active", BillingDay: 1, TimeZone: "UTC"}
	after := before
	after.Plan = "pro"
	op, ten, err := e.evs.LimitsChanged(outbox.LimitsChange{TenantID: "acme", Before: before, After: after,
		Audit: outbox.AuditRef{ID: 7, Hash: "abc"}, Actor: outbox.ActorRef{Kind: "credential", Name: "alice"},
		Reason: "upgrade", At: relayEpoch})
	if err != nil {
		t.Fatal(err)
	}
	e.write(t, op, ten)
	e.fanOutAll(t, e.clock.Now(), 3)
	got := map[string]string{}
	for _, ep := range []webhooks.WebhookWithSecret{operator, scoped, own} {
		ds, err := e.st.UnscopedListWebhookDeliveries(e.ctx, ep.Webhook.ID)
		if err != nil || len(ds) != 1 {
			t.Fatalf("%s: %d deliveries, %v; want one", ep.Webhook.URL, len(ds), err)
		}
		got[ep.Webhook.URL] = ds[0].EventID
	}
	if got[operator.Webhook.URL] != op.ID || got[scoped.Webhook.URL] != op.ID || got[own.Webhook.URL] != ten.ID {
		t.Fatalf("deliveries %v; want the operators' copy %s to the operator's endpoints, the tenant's %s to its own", got, op.ID, ten.ID)
	}
	if strings.Contains(string(ten.Payload), "alice") || strings.Contains(string(ten.Payload), "upgrade") ||
		!strings.Contains(string(op.Payload), "alice") || !strings.Contains(string(op.Payload), `"reason":"upgrade"`) {
		t.Fatalf("copies: operators' %s, tenant's %s", op.Payload, ten.Payload)
	}
	if ten.Audience != store.AudienceTenant || op.Audience != store.AudienceOperator {
		t.Fatalf("audiences: %q %q", op.Audience, ten.Audience)
	}
}
