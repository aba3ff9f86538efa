package agentq_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/store"
)

// An app with the relay role (one of the defaults) delivers a usage event to an
// endpoint made through the admin client within seconds, signed so that an HMAC of
// the receiver's own verifies it, and lists the attempt; a deleted endpoint is gone.
func TestWebhookArrivesSigned(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.start(t)
	admin := h.adminClient()
	ctx := context.Background()
	h.tenantClient("acme", "pro", nil)

	type got struct {
		header http.Header
		body   []byte
	}
	var mu sync.Mutex
	var hooks []got
	arrived := make(chan struct{}, 16)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		hooks = append(hooks, got{r.Header.Clone(), body})
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
		arrived <- struct{}{}
	}))
	defer rcv.Close()

	wh, err := admin.CreateWebhook(ctx, client.CreateWebhookRequest{
		URL: rcv.URL + "/hook", Types: []string{client.EventLimitHit, client.EventApproachingLimit},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(wh.Secret, "whsec_") {
		t.Fatalf("secret %q", wh.Secret)
	}
	var ae *client.Error
	if _, err := admin.CreateWebhook(ctx, client.CreateWebhookRequest{URL: "ftp://x/", Types: []string{client.EventLimitHit}}); !errors.As(err, &ae) || ae.StatusCode != 400 || ae.Code != "INVALID_REQUEST" {
		t.Errorf("bad url: %v", err)
	}

	w := eventWriter{st: store.New(e.pool), evs: outbox.Events{UpgradeURL: "https://agentq.example/upgrade"}}
	ev := w.limitHit("acme", "wh", 1)
	if err := w.write(ctx, ev); err != nil {
		t.Fatal(err)
	}
	select {
	case <-arrived:
	case <-time.After(20 * time.Second):
		t.Fatal("no webhook within 20 s")
	}
	mu.Lock()
	hk := hooks[0]
	mu.Unlock()
	if string(hk.body) != string(ev.Payload) || hk.header.Get("webhook-id") != ev.ID {
		t.Errorf("got %s as %q, want the stored event %s", hk.body, hk.header.Get("webhook-id"), ev.ID)
	}
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(wh.Secret, "whsec_"))
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(hk.header.Get("webhook-id") + "." + hk.header.Get("webhook-timestamp") + "." + string(hk.body)))
	if want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)); hk.header.Get("webhook-signature") != want {
		t.Errorf("webhook-signature %q, want %q", hk.header.Get("webhook-signature"), want)
	}

	// The attempt is listed, and the endpoint shows without its secret.
	deadline := time.Now().Add(10 * time.Second)
	for {
		page, err := admin.ListWebhookAttempts(ctx, wh.ID, client.WebhookAttemptsQuery{})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Attempts) == 1 {
			a := page.Attempts[0]
			if a.EventID != ev.ID || a.StatusCode == nil || *a.StatusCode != 204 || a.Result != "succeeded" || page.NextCursor != nil {
				t.Errorf("attempt %+v", a)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("attempts %+v", page.Attempts)
		}
		time.Sleep(50 * time.Millisecond)
	}
	list, err := admin.ListWebhooks(ctx)
	if err != nil || len(list) != 1 || list[0].ID != wh.ID || list[0].DisabledAt != nil {
		t.Fatalf("list %+v %v", list, err)
	}
	rot, err := admin.RotateWebhookSecret(ctx, wh.ID)
	if err != nil || rot.Secret == wh.Secret || rot.PreviousSecretExpiresAt == nil {
		t.Fatalf("rotate %+v %v", rot, err)
	}
	if err := admin.DeleteWebhook(ctx, wh.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.GetWebhook(ctx, wh.ID); !errors.As(err, &ae) || ae.StatusCode != 404 {
		t.Errorf("get after delete: %v", err)
	}
}

// With AGENTQ_WEBHOOK_ALLOW_NETS=127.0.0.0/8, the admin API refuses literal addresses
// in other private, link-local and loopback networks with a 400 and the usual body,
// and accepts and delivers to 127.0.0.1.
func TestWebhookDestinationsAreChecked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.start(t, func(o *agentq.Options) {
		o.Config.WebhookAllowNets = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	})
	admin := h.adminClient()
	ctx := context.Background()
	h.tenantClient("acme", "pro", nil)
	for _, u := range []string{"http://169.254.169.254/latest/meta-data/", "http://10.0.0.5:5432/", "http://[::1]:6379/"} {
		var body struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		st, _ := h.do("POST", "/v1/admin/webhooks", h.admin, map[string]any{"url": u, "types": []string{"usage.limit_hit"}}, &body)
		if st != 400 || body.Error.Code != "INVALID_REQUEST" || !strings.Contains(body.Error.Message, "refused") {
			t.Errorf("%s: %d %+v, want 400 INVALID_REQUEST saying it is refused", u, st, body)
		}
	}
	arrived := make(chan string, 4)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- r.Header.Get("webhook-id")
		w.WriteHeader(http.StatusNoContent)
	}))
	defer rcv.Close()
	if _, err := admin.CreateWebhook(ctx, client.CreateWebhookRequest{URL: rcv.URL + "/hook", Types: []string{client.EventLimitHit}}); err != nil {
		t.Fatal(err)
	}
	w := eventWriter{st: store.New(e.pool), evs: outbox.Events{}}
	ev := w.limitHit("acme", "dest", 1)
	if err := w.write(ctx, ev); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-arrived:
		if id != ev.ID {
			t.Errorf("webhook-id %q, want %q", id, ev.ID)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("nothing delivered to 127.0.0.1 within 20 s")
	}
}
