package agentq_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/store"
)

// A tenant manages endpoints of its own with its API key: created with a secret
// shown once, within its plan's webhook_endpoints (402 past it), refused for a
// private address literal, listed and read without another tenant's or the
// operator's, rotated and deleted; each receives its tenant's events only.
func TestTenantWebhooksOverHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.start(t)
	ctx := context.Background()
	acme, _ := h.tenantClient("acme", "pro", nil)
	globex, _ := h.tenantClient("globex", "enterprise", nil)
	free, _ := h.tenantClient("tiny", "free", nil)
	admin := h.adminClient()

	theirs, err := globex.CreateWebhook(ctx, client.CreateTenantWebhookRequest{URL: "https://globex.example/secret-path",
		Types: []string{client.EventLimitHit}})
	if err != nil {
		t.Fatal(err)
	}
	operators, err := admin.CreateWebhook(ctx, client.CreateWebhookRequest{URL: "https://ops.example/every-tenant",
		Types: []string{client.EventLimitHit}})
	if err != nil {
		t.Fatal(err)
	}
	made, err := acme.CreateWebhook(ctx, client.CreateTenantWebhookRequest{URL: "https://ops.example.com/agentq",
		Types: []string{client.EventLimitHit}})
	if err != nil || !strings.HasPrefix(made.Secret, "whsec_") || made.Owner != "tenant" || made.Tenant == nil || *made.Tenant != "acme" {
		t.Fatalf("create %+v %v", made, err)
	}
	var ae *client.Error
	if _, err := acme.CreateWebhook(ctx, client.CreateTenantWebhookRequest{URL: "http://10.0.0.5/hook",
		Types: []string{client.EventLimitHit}}); !errors.As(err, &ae) || ae.StatusCode != 400 || ae.Code != "INVALID_REQUEST" {
		t.Errorf("private address: %v, want 400", err)
	}
	arrived := make(chan string, 8)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- r.Header.Get("webhook-id")
		w.WriteHeader(http.StatusNoContent)
	}))
	defer rcv.Close()
	// Pro allows 2: one more is made, then 402 with the quota body.
	local, err := acme.CreateWebhook(ctx, client.CreateTenantWebhookRequest{URL: rcv.URL + "/acme", Types: []string{client.EventLimitHit}})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		_, err := acme.CreateWebhook(ctx, client.CreateTenantWebhookRequest{URL: "https://ops.example.com/more", Types: []string{client.EventLimitHit}})
		var body struct {
			LimitType    string  `json:"limit_type"`
			LimitValue   float64 `json:"limit_value"`
			CurrentUsage float64 `json:"current_usage"`
			UpgradeURL   string  `json:"upgrade_url"`
		}
		if !errors.As(err, &ae) || ae.StatusCode != 402 || ae.Code != "QUOTA_EXCEEDED" || ae.LimitType != "webhook_endpoints" ||
			json.Unmarshal(ae.Body, &body) != nil || body.LimitValue != 2 || body.CurrentUsage != 2 || body.UpgradeURL == "" {
			t.Fatalf("third endpoint: %v (%s), want 402 QUOTA_EXCEEDED of webhook_endpoints at 2 of 2", err, ae.Body)
		}
	}
	// An override lifts it, as for any limit.
	if st, _ := h.do("PATCH", "/v1/admin/tenants/acme", h.admin, map[string]any{"overrides": map[string]any{"webhook_endpoints": "unlimited"}}, nil); st != 200 {
		t.Fatalf("override: %d", st)
	}
	lifted, err := acme.CreateWebhook(ctx, client.CreateTenantWebhookRequest{URL: "https://ops.example.com/third", Types: []string{client.EventLimitHit}})
	if err != nil {
		t.Fatalf("third endpoint with webhook_endpoints unlimited: %v", err)
	}
	if err := acme.DeleteWebhook(ctx, lifted.ID); err != nil {
		t.Fatal(err)
	}
	if st, _ := h.do("PATCH", "/v1/admin/tenants/acme", h.admin, map[string]any{"overrides": map[string]any{"webhook_endpoints": 2}}, nil); st != 200 {
		t.Fatalf("override: %d", st)
	}
	if _, err := free.CreateWebhook(ctx, client.CreateTenantWebhookRequest{URL: "https://tiny.example/", Types: []string{client.EventLimitHit}}); !errors.As(err, &ae) || ae.StatusCode != 402 {
		t.Errorf("free plan: %v, want 402", err)
	}

	list, err := acme.ListWebhooks(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("list %+v %v", list, err)
	}
	raw, _ := json.Marshal(list)
	for _, leak := range []string{"globex.example", "every-tenant", "whsec_", `"secret"`} {
		if strings.Contains(string(raw), leak) {
			t.Errorf("acme's list shows %q: %s", leak, raw)
		}
	}
	if _, err := acme.GetWebhook(ctx, theirs.ID); !errors.As(err, &ae) || ae.StatusCode != 404 {
		t.Errorf("acme reads globex's endpoint: %v, want 404", err)
	}
	if err := acme.DeleteWebhook(ctx, theirs.ID); !errors.As(err, &ae) || ae.StatusCode != 404 {
		t.Errorf("acme deletes globex's endpoint: %v, want 404", err)
	}
	if _, err := acme.RotateWebhookSecret(ctx, theirs.ID); !errors.As(err, &ae) || ae.StatusCode != 404 {
		t.Errorf("acme rotates globex's endpoint: %v, want 404", err)
	}
	if _, err := globex.GetWebhook(ctx, theirs.ID); err != nil {
		t.Errorf("globex's own endpoint after acme's attempts: %v", err)
	}

	// acme's local endpoint gets acme's event, not globex's.
	w := eventWriter{st: store.New(e.pool), evs: outbox.Events{}}
	gev, aev := w.limitHit("globex", "own", 1), w.limitHit("acme", "own", 1)
	if err := w.write(ctx, gev); err != nil {
		t.Fatal(err)
	}
	if err := w.write(ctx, aev); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-arrived:
		if id != aev.ID {
			t.Errorf("acme's endpoint got %q, want acme's event %q", id, aev.ID)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("acme's endpoint got nothing within 20 s")
	}
	// acme sees its endpoint's attempts, and no other endpoint's.
	var page *client.WebhookAttemptPage
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if page, err = acme.ListWebhookAttempts(ctx, local.ID, client.WebhookAttemptsQuery{}); err != nil {
			t.Fatal(err)
		}
		if len(page.Attempts) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(page.Attempts) != 1 || page.Attempts[0].EventID != aev.ID || page.Attempts[0].StatusCode == nil ||
		*page.Attempts[0].StatusCode != 204 || page.Attempts[0].Result != "succeeded" {
		t.Fatalf("acme's attempts %+v, want the one delivery of its event, answered 204", page.Attempts)
	}
	for _, other := range []string{theirs.ID, operators.ID} {
		if _, err := acme.ListWebhookAttempts(ctx, other, client.WebhookAttemptsQuery{}); !errors.As(err, &ae) || ae.StatusCode != 404 {
			t.Errorf("acme lists the attempts of endpoint %s, not its own: %v, want 404", other, err)
		}
	}

	rot, err := acme.RotateWebhookSecret(ctx, local.ID)
	if err != nil || rot.Secret == local.Secret || rot.PreviousSecretExpiresAt == nil {
		t.Fatalf("rotate %+v %v", rot, err)
	}
	if err := acme.DeleteWebhook(ctx, local.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := acme.GetWebhook(ctx, local.ID); !errors.As(err, &ae) || ae.StatusCode != 404 {
		t.Errorf("get after delete: %v", err)
	}
	if _, err := acme.CreateWebhook(ctx, client.CreateTenantWebhookRequest{URL: "https://ops.example.com/again", Types: []string{client.EventLimitHit}}); err != nil {
		t.Errorf("create after a delete: %v", err)
	}
	select {
	case id := <-arrived:
		if id == gev.ID {
			t.Errorf("acme's endpoint got globex's event")
		}
	case <-time.After(300 * time.Millisecond):
	}
}
