package webhooks_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/billing/webhooks"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/netguard"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
)

// fakeClock is the relay's and the endpoint service's clock in these tests.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// hook is one request the receiver got.
type hook struct {
	header http.Header
	body   []byte
}

// receiver is a real local webhook endpoint: it keeps every request and answers
// what answer says (204 when nil).
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	hooks  []hook
	answer func(n int, h hook) int // n: this request's number, from 1
}

func newReceiver(t *testing.T, answer func(n int, h hook) int) *receiver {
	t.Helper()
	r := &receiver{answer: answer}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		h := hook{header: req.Header.Clone(), body: body}
		r.mu.Lock()
		r.hooks = append(r.hooks, h)
		n := len(r.hooks)
		r.mu.Unlock()
		status := http.StatusNoContent
		if r.answer != nil {
			status = r.answer(n, h)
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) got() []hook {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]hook(nil), r.hooks...)
}

// relayEnv is a schema of its own with the endpoint service and a relay on a fake
// clock.
type relayEnv struct {
	ctx   context.Context
	st    *store.Store
	clock *fakeClock
	hooks *webhooks.Webhooks
	evs   outbox.Events
}

func newRelayEnv(t *testing.T) *relayEnv {
	t.Helper()
	st := store.New(testenv.Postgres(t))
	clock := &fakeClock{t: time.Now().Truncate(time.Second)}
	e := &relayEnv{ctx: context.Background(), st: st, clock: clock,
		hooks: webhooks.NewWebhooks(st, webhooks.WebhooksOptions{RotationGrace: time.Hour, Archetype: &baseservice.Archetype{Clock: clock.Now}, AllowNets: netguard.Loopback()}),
		evs:   outbox.Events{UpgradeURL: "https://agentq.example/upgrade"}}
	for _, id := range []string{"acme", "globex"} {
		if _, err := st.CreateTenant(e.ctx, store.CreateTenantParams{ID: id, Name: id, Plan: "pro"}); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// relay is a relay of the env with schedule (no jitter) and batch.
func (e *relayEnv) relay(schedule []time.Duration, batch int) *webhooks.Relay {
	return webhooks.NewRelay(e.st, webhooks.RelayConfig{
		Schedule: schedule, Jitter: func(d time.Duration) time.Duration { return d }, Archetype: &baseservice.Archetype{Clock: e.clock.Now},
		Timeout: 5 * time.Second, Batch: batch,
		AllowNets: netguard.Loopback(), // the receivers are local test servers
	})
}

var relayEpoch = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

// hit is tenant's limit_hit number i, a minute of its own.
func (e *relayEnv) hit(t *testing.T, tenant string, i int) outbox.Event {
	t.Helper()
	ev, err := e.evs.LimitHit(outbox.Refusal{TenantID: tenant, Plan: "pro", LimitType: quotas.TenantRate,
		Limit: 5, Used: 5, At: relayEpoch.Add(time.Duration(i) * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// approaching is tenant's approaching_limit at 80 % of a daily steps quota on day i.
func (e *relayEnv) approaching(t *testing.T, tenant string, i int) outbox.Event {
	t.Helper()
	day := relayEpoch.AddDate(0, 0, i)
	evs, err := e.evs.Crossings(outbox.Quota{TenantID: tenant, Plan: "pro", LimitType: quotas.AgentStepsDaily,
		Limit: 100, Period: outbox.Span{Start: day, End: day.AddDate(0, 0, 1)}}, 0, 85, day)
	if err != nil || len(evs) != 1 {
		t.Fatalf("%v %v", evs, err)
	}
	return evs[0]
}

func (e *relayEnv) write(t *testing.T, evs ...outbox.Event) {
	t.Helper()
	err := e.st.InTx(e.ctx, func(tx *store.Store) error {
		for _, ev := range evs {
			if ok, err := outbox.WriteEvent(e.ctx, tx, ev); err != nil || !ok {
				return fmt.Errorf("write %s: %v %v", ev.ID, ok, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (e *relayEnv) create(t *testing.T, url, tenant string, types ...string) webhooks.WebhookWithSecret {
	t.Helper()
	w, err := e.hooks.Create(e.ctx, webhooks.CreateWebhookParams{URL: url, Types: types, TenantID: tenant})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// runUntil runs relay rounds until cond holds: the feed shows an event only once every
// older transaction on the server ended, and other tests' may be running.
func runUntil(t *testing.T, ctx context.Context, r *webhooks.Relay, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("the relay did not get there within 20 s")
		}
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// verify checks a request's signature the way a receiver would, without the
// Standard Webhooks library: HMAC-SHA256 over "id.timestamp.body" keyed with the
// base64-decoded secret after whsec_, as "v1,<base64>" in the space-separated list.
func verify(h hook, secret string) bool {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil || !strings.HasPrefix(secret, "whsec_") {
		return false
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(h.header.Get("webhook-id") + "." + h.header.Get("webhook-timestamp") + "."))
	mac.Write(h.body)
	want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, s := range strings.Split(h.header.Get("webhook-signature"), " ") {
		if hmac.Equal([]byte(s), []byte(want)) {
			return true
		}
	}
	return false
}

// An endpoint gets the events written after it, each as the stored bytes, signed per
// Standard Webhooks with the event id as webhook-id, and every attempt is listed.
func TestRelaySignsAndDeliversTheStoredBytes(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	rcv := newReceiver(t, nil)
	before := e.hit(t, "acme", 1)
	e.write(t, before)
	// The endpoint comes after the first event: only the second is for it.
	w := e.create(t, rcv.srv.URL+"/hook", "", outbox.TypeLimitHit, outbox.TypeApproachingLimit)
	if !strings.HasPrefix(w.Secret, "whsec_") || w.Webhook.Secret != "" {
		t.Fatalf("secret %q, endpoint carries %q", w.Secret, w.Webhook.Secret)
	}
	after := e.hit(t, "acme", 2)
	e.write(t, after)
	r := e.relay(nil, 0)
	runUntil(t, e.ctx, r, func() bool { return len(rcv.got()) >= 1 })
	// More rounds send nothing more.
	for range 5 {
		if _, err := r.RunOnce(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	got := rcv.got()
	if len(got) != 1 {
		t.Fatalf("%d requests, want 1 (the event before the endpoint is not for it)", len(got))
	}
	h := got[0]
	if string(h.body) != string(after.Payload) {
		t.Errorf("body %s, want the stored bytes %s", h.body, after.Payload)
	}
	if h.header.Get("webhook-id") != after.ID {
		t.Errorf("webhook-id %q, want the event id %q", h.header.Get("webhook-id"), after.ID)
	}
	if ts := h.header.Get("webhook-timestamp"); ts != fmt.Sprint(e.clock.Now().Unix()) {
		t.Errorf("webhook-timestamp %q, want the relay's clock %d", ts, e.clock.Now().Unix())
	}
	if !verify(h, w.Secret) {
		t.Errorf("signature %q does not verify", h.header.Get("webhook-signature"))
	}
	if verify(h, "whsec_"+base64.StdEncoding.EncodeToString([]byte("another secret of 32 bytes......"))) {
		t.Error("the signature verifies with another secret: the check is broken")
	}
	if n := len(strings.Split(h.header.Get("webhook-signature"), " ")); n != 1 {
		t.Errorf("%d signatures before any rotation", n)
	}
	page, err := e.hooks.Attempts(e.ctx, w.Webhook.ID.String(), webhooks.AttemptsParams{})
	if err != nil || len(page.Attempts) != 1 {
		t.Fatalf("attempts %+v %v", page, err)
	}
	if a := page.Attempts[0]; a.Result != store.AttemptSucceeded || a.StatusCode != 204 || a.EventID != after.ID || a.Attempt != 1 {
		t.Errorf("attempt %+v", a)
	}
}

// 500s are retried on the schedule, each attempt recorded; a delivery that fails its
// last attempt is given up and not sent again.
func TestRelayRetriesOnTheSchedule(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	flaky := newReceiver(t, func(n int, _ hook) int {
		if n <= 3 {
			return 500
		}
		return 200
	})
	down := newReceiver(t, func(int, hook) int { return 503 })
	wf := e.create(t, flaky.srv.URL, "", outbox.TypeLimitHit)
	wd := e.create(t, down.srv.URL, "", outbox.TypeLimitHit)
	schedule := []time.Duration{0, time.Minute, 2 * time.Minute, 4 * time.Minute}
	r := e.relay(schedule, 0)
	e.write(t, e.hit(t, "acme", 1))
	runUntil(t, e.ctx, r, func() bool { return len(flaky.got()) == 1 && len(down.got()) == 1 })
	t0 := e.clock.Now()
	for i, wait := range schedule[1:] {
		// Not due yet: nothing is sent before its time.
		e.clock.Add(wait - time.Second)
		if _, err := r.RunOnce(e.ctx); err != nil {
			t.Fatal(err)
		}
		if n := len(flaky.got()); n != i+1 {
			t.Fatalf("attempt %d sent %v early", i+2, time.Second)
		}
		e.clock.Add(time.Second)
		runUntil(t, e.ctx, r, func() bool { return len(flaky.got()) == i+2 && len(down.got()) == i+2 })
	}
	e.clock.Add(time.Hour)
	for range 3 {
		if _, err := r.RunOnce(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(flaky.got()) != 4 || len(down.got()) != 4 {
		t.Fatalf("requests %d and %d, want 4 each", len(flaky.got()), len(down.got()))
	}
	check := func(w webhooks.WebhookWithSecret, statuses []int, results []string, final string) {
		t.Helper()
		page, err := e.hooks.Attempts(e.ctx, w.Webhook.ID.String(), webhooks.AttemptsParams{})
		if err != nil || len(page.Attempts) != 4 {
			t.Fatalf("attempts %+v %v", page, err)
		}
		at := t0
		for i := range 4 {
			a := page.Attempts[3-i] // newest first
			if a.Attempt != i+1 || a.StatusCode != statuses[i] || a.Result != results[i] {
				t.Errorf("attempt %d: %+v, want status %d result %s", i+1, a, statuses[i], results[i])
			}
			at = at.Add(schedule[i])
			if !a.AttemptedAt.Equal(at) {
				t.Errorf("attempt %d at +%v, want +%v", i+1, a.AttemptedAt.Sub(t0), at.Sub(t0))
			}
		}
		ds, err := e.st.UnscopedListWebhookDeliveries(e.ctx, w.Webhook.ID)
		if err != nil || len(ds) != 1 || ds[0].State != final || ds[0].Attempts != 4 {
			t.Fatalf("deliveries %+v %v, want one %s", ds, err, final)
		}
	}
	r1, r2 := store.AttemptRetrying, store.AttemptSucceeded
	check(wf, []int{500, 500, 500, 200}, []string{r1, r1, r1, r2}, "succeeded")
	check(wd, []int{503, 503, 503, 503}, []string{r1, r1, r1, store.AttemptFailed}, "failed")
}

// The default jitter spreads a delay over ±10 %, and the standard schedule is the
// Standard Webhooks one.
func TestStandardScheduleAndJitter(t *testing.T) {
	t.Parallel()
	want := []time.Duration{0, 5 * time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 5 * time.Hour, 10 * time.Hour, 10 * time.Hour}
	if fmt.Sprint(webhooks.StandardSchedule) != fmt.Sprint(want) {
		t.Errorf("schedule %v", webhooks.StandardSchedule)
	}
	e := newRelayEnv(t)
	rcv := newReceiver(t, func(int, hook) int { return 500 })
	w := e.create(t, rcv.srv.URL, "", outbox.TypeLimitHit)
	r := webhooks.NewRelay(e.st, webhooks.RelayConfig{Archetype: &baseservice.Archetype{Clock: e.clock.Now},
		AllowNets: netguard.Loopback()})
	for i := range 20 {
		e.write(t, e.hit(t, "acme", i))
	}
	runUntil(t, e.ctx, r, func() bool { return len(rcv.got()) == 20 })
	ds, err := e.st.UnscopedListWebhookDeliveries(e.ctx, w.Webhook.ID)
	if err != nil || len(ds) != 20 {
		t.Fatal(ds, err)
	}
	spread := map[time.Duration]bool{}
	for _, d := range ds {
		wait := d.NextAttemptAt.Sub(e.clock.Now())
		if wait < 4500*time.Millisecond || wait > 5500*time.Millisecond {
			t.Errorf("second attempt in %v, want 5 s ± 10 %%", wait)
		}
		spread[wait] = true
	}
	if len(spread) < 5 {
		t.Errorf("20 retries fell on %d times: no jitter", len(spread))
	}
}

// A 410 disables the endpoint: its pending deliveries are cancelled and it gets no
// new ones.
func TestRelayGoneDisablesTheEndpoint(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	rcv := newReceiver(t, func(int, hook) int { return http.StatusGone })
	w := e.create(t, rcv.srv.URL, "", outbox.TypeLimitHit)
	r := e.relay([]time.Duration{0, time.Second}, 1) // one at a time
	e.write(t, e.hit(t, "acme", 1), e.hit(t, "acme", 2))
	runUntil(t, e.ctx, r, func() bool { return len(rcv.got()) == 1 })
	got, err := e.hooks.Get(e.ctx, w.Webhook.ID.String())
	if err != nil || got.DisabledAt == nil || got.DisabledReason == "" {
		t.Fatalf("endpoint after a 410: %+v %v", got, err)
	}
	e.write(t, e.hit(t, "acme", 3))
	other := newReceiver(t, nil)
	e.create(t, other.srv.URL, "", outbox.TypeLimitHit) // shows when the later event was fanned out
	e.write(t, e.hit(t, "acme", 4))
	runUntil(t, e.ctx, r, func() bool { return len(other.got()) == 1 })
	e.clock.Add(time.Hour)
	for range 3 {
		if _, err := r.RunOnce(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(rcv.got()); n != 1 {
		t.Errorf("the disabled endpoint got %d requests, want 1", n)
	}
	ds, err := e.st.UnscopedListWebhookDeliveries(e.ctx, w.Webhook.ID)
	if err != nil || len(ds) != 2 || ds[0].State != "failed" || ds[0].LastStatus != 410 || ds[1].State != "cancelled" {
		t.Fatalf("deliveries %+v %v: want the sent one failed with 410, the other cancelled, none for later events", ds, err)
	}
	page, _ := e.hooks.Attempts(e.ctx, w.Webhook.ID.String(), webhooks.AttemptsParams{})
	if len(page.Attempts) != 1 || page.Attempts[0].Result != store.AttemptGone {
		t.Errorf("attempts %+v", page.Attempts)
	}
}

// After a rotation both secrets sign until the grace ends; then only the new one.
func TestRelayRotationSignsWithBothSecretsDuringTheGrace(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	rcv := newReceiver(t, nil)
	w := e.create(t, rcv.srv.URL, "", outbox.TypeLimitHit)
	rot, err := e.hooks.RotateSecret(e.ctx, w.Webhook.ID.String())
	if err != nil || rot.Secret == w.Secret || !strings.HasPrefix(rot.Secret, "whsec_") {
		t.Fatalf("rotate: %q %v", rot.Secret, err)
	}
	if rot.Webhook.PreviousSecretExpiresAt == nil || !rot.Webhook.PreviousSecretExpiresAt.Equal(e.clock.Now().Add(time.Hour)) {
		t.Errorf("grace ends %v, want an hour from now", rot.Webhook.PreviousSecretExpiresAt)
	}
	r := e.relay(nil, 0)
	e.write(t, e.hit(t, "acme", 1))
	runUntil(t, e.ctx, r, func() bool { return len(rcv.got()) == 1 })
	h := rcv.got()[0]
	if !verify(h, rot.Secret) || !verify(h, w.Secret) {
		t.Errorf("during the grace: new verifies %v, old verifies %v (%q)", verify(h, rot.Secret), verify(h, w.Secret), h.header.Get("webhook-signature"))
	}
	e.clock.Add(time.Hour)
	e.write(t, e.hit(t, "acme", 2))
	runUntil(t, e.ctx, r, func() bool { return len(rcv.got()) == 2 })
	h = rcv.got()[1]
	if !verify(h, rot.Secret) || verify(h, w.Secret) {
		t.Errorf("after the grace: new verifies %v, old verifies %v", verify(h, rot.Secret), verify(h, w.Secret))
	}
}

// An endpoint gets only its types, and only its tenant's events when it names one.
func TestRelayFiltersByTypeAndTenant(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	acmeHits := newReceiver(t, nil)
	allApproaching := newReceiver(t, nil)
	e.create(t, acmeHits.srv.URL, "acme", outbox.TypeLimitHit)
	e.create(t, allApproaching.srv.URL, "", outbox.TypeApproachingLimit)
	ah, gh, aa, ga := e.hit(t, "acme", 1), e.hit(t, "globex", 1), e.approaching(t, "acme", 1), e.approaching(t, "globex", 1)
	e.write(t, ah, gh, aa, ga)
	last := e.hit(t, "acme", 2)
	e.write(t, last)
	r := e.relay(nil, 0)
	runUntil(t, e.ctx, r, func() bool { return len(acmeHits.got()) == 2 && len(allApproaching.got()) == 2 })
	ids := func(rc *receiver) map[string]bool {
		out := map[string]bool{}
		for _, h := range rc.got() {
			out[h.header.Get("webhook-id")] = true
		}
		return out
	}
	if got := ids(acmeHits); !got[ah.ID] || !got[last.ID] {
		t.Errorf("acme's limit_hit endpoint got %v", got)
	}
	if got := ids(allApproaching); !got[aa.ID] || !got[ga.ID] {
		t.Errorf("every tenant's approaching_limit endpoint got %v", got)
	}
}

// Deleting an endpoint stops its deliveries, retries included.
func TestRelayDeletedEndpointGetsNothingMore(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	rcv := newReceiver(t, func(int, hook) int { return 500 })
	w := e.create(t, rcv.srv.URL, "", outbox.TypeLimitHit)
	r := e.relay([]time.Duration{0, time.Minute, time.Minute}, 0)
	e.write(t, e.hit(t, "acme", 1))
	runUntil(t, e.ctx, r, func() bool { return len(rcv.got()) == 1 })
	if err := e.hooks.Delete(e.ctx, w.Webhook.ID.String()); err != nil {
		t.Fatal(err)
	}
	if err := e.hooks.Delete(e.ctx, w.Webhook.ID.String()); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
	e.write(t, e.hit(t, "acme", 2))
	other := newReceiver(t, nil)
	e.create(t, other.srv.URL, "", outbox.TypeLimitHit)
	e.write(t, e.hit(t, "acme", 3))
	runUntil(t, e.ctx, r, func() bool { return len(other.got()) == 1 })
	e.clock.Add(time.Hour)
	for range 3 {
		if _, err := r.RunOnce(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(rcv.got()); n != 1 {
		t.Errorf("the deleted endpoint got %d requests, want 1", n)
	}
}

// A relay that dies after claiming a delivery leaves it to be sent again once its
// lease lapses: at least once.
func TestRelayResendsWhatADeadRelayHeld(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	rcv := newReceiver(t, nil)
	w := e.create(t, rcv.srv.URL, "", outbox.TypeLimitHit)
	r := e.relay(nil, 0)
	ev := e.hit(t, "acme", 1)
	e.write(t, ev)
	// Fan the event out without sending it: a "dead" relay claims it, leased for a
	// minute, and never records anything.
	var claims []store.DeliveryClaim
	runUntil(t, e.ctx, r, func() bool {
		var err error
		claims, err = e.st.UnscopedClaimWebhookDeliveries(e.ctx, store.ClaimDeliveriesParams{Now: e.clock.Now(), Lease: time.Minute, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		return len(claims) == 1 || len(rcv.got()) > 0
	})
	if len(rcv.got()) != 0 {
		t.Skip("the relay sent the delivery before the dead relay could claim it")
	}
	for range 3 {
		if _, err := r.RunOnce(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(rcv.got()) != 0 {
		t.Fatal("a delivery under another relay's lease was sent")
	}
	e.clock.Add(time.Minute)
	runUntil(t, e.ctx, r, func() bool { return len(rcv.got()) == 1 })
	if got := rcv.got()[0].header.Get("webhook-id"); got != ev.ID {
		t.Errorf("webhook-id %q", got)
	}
	page, _ := e.hooks.Attempts(e.ctx, w.Webhook.ID.String(), webhooks.AttemptsParams{})
	if len(page.Attempts) != 1 || page.Attempts[0].Attempt != 2 {
		t.Errorf("attempts %+v: want one, numbered 2 (the dead relay's claim counts)", page.Attempts)
	}
	// The dead relay's late outcome decides nothing.
	owned, err := e.st.UnscopedRecordWebhookAttempt(e.ctx, store.RecordAttemptParams{Claim: claims[0], At: e.clock.Now(),
		StatusCode: 500, Result: store.AttemptRetrying, NextAttemptAt: e.clock.Now()})
	if err != nil || owned {
		t.Errorf("late outcome: owned %v, %v", owned, err)
	}
	ds, _ := e.st.UnscopedListWebhookDeliveries(e.ctx, w.Webhook.ID)
	if len(ds) != 1 || ds[0].State != "succeeded" {
		t.Errorf("deliveries %+v", ds)
	}
}

// Several relays over many events send each event to each endpoint once, never two
// sends of one delivery at once; a retried one twice.
func TestRelaysShareTheWork(t *testing.T) {
	t.Parallel()
	st := store.New(testenv.Postgres(t))
	ctx := context.Background()
	evs := outbox.Events{}
	var mu sync.Mutex
	inFlight, count := map[string]int{}, map[string]int{}
	overlap := false
	answer := func(id string) int {
		mu.Lock()
		inFlight[id]++
		if inFlight[id] > 1 {
			overlap = true
		}
		count[id]++
		n := count[id]
		mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		inFlight[id]--
		mu.Unlock()
		if n == 1 && strings.HasSuffix(id, "7") { // about one in 16 fails once
			return 500
		}
		return 200
	}
	recvs := make([]*httptest.Server, 2)
	for i := range recvs {
		recvs[i] = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(answer(fmt.Sprint(i) + "/" + r.Header.Get("webhook-id")))
		}))
		t.Cleanup(recvs[i].Close)
	}
	hooks := webhooks.NewWebhooks(st, webhooks.WebhooksOptions{AllowNets: netguard.Loopback()})
	for _, s := range recvs {
		if _, err := hooks.Create(ctx, webhooks.CreateWebhookParams{URL: s.URL, Types: []string{outbox.TypeLimitHit}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		r := webhooks.NewRelay(st, webhooks.RelayConfig{
			Schedule: []time.Duration{0, 20 * time.Millisecond, 20 * time.Millisecond}, PollInterval: 10 * time.Millisecond,
			Batch: 8 + i, FanOutBatch: 7, AllowNets: netguard.Loopback(),
		})
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Stop)
	}
	const n = 150
	var ids []string
	for i := 0; i < n; i += 3 {
		var batch []outbox.Event
		for j := i; j < i+3; j++ {
			ev, err := evs.LimitHit(outbox.Refusal{TenantID: "t" + fmt.Sprint(j%4), LimitType: quotas.TenantRate,
				Limit: 1, Used: 1, At: relayEpoch.Add(time.Duration(j) * time.Minute)})
			if err != nil {
				t.Fatal(err)
			}
			batch = append(batch, ev)
			ids = append(ids, ev.ID)
		}
		if err := st.InTx(ctx, func(tx *store.Store) error {
			for _, ev := range batch {
				if _, err := outbox.WriteEvent(ctx, tx, ev); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	want := func(id string) int {
		if strings.HasSuffix(id, "7") {
			return 2
		}
		return 1
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		done := true
		for _, id := range ids {
			for i := range recvs {
				k := fmt.Sprint(i) + "/" + id
				if count[k] < want(k) {
					done = false
				}
			}
		}
		mu.Unlock()
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // a duplicate would show by now
	mu.Lock()
	defer mu.Unlock()
	if overlap {
		t.Error("one delivery was sent twice at once")
	}
	for _, id := range ids {
		for i := range recvs {
			k := fmt.Sprint(i) + "/" + id
			if count[k] != want(k) {
				t.Errorf("%s received %d times, want %d", k, count[k], want(k))
			}
		}
	}
}

// The endpoint service refuses what cannot be delivered, never shows a secret after
// create, and pages attempts.
func TestWebhookServiceRules(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	for _, tc := range []struct {
		name  string
		p     webhooks.CreateWebhookParams
		field string
	}{
		{"no url", webhooks.CreateWebhookParams{Types: []string{outbox.TypeLimitHit}}, "url"},
		{"relative url", webhooks.CreateWebhookParams{URL: "/hook", Types: []string{outbox.TypeLimitHit}}, "url"},
		{"ftp", webhooks.CreateWebhookParams{URL: "ftp://x/", Types: []string{outbox.TypeLimitHit}}, "url"},
		{"space", webhooks.CreateWebhookParams{URL: "http://x/ y", Types: []string{outbox.TypeLimitHit}}, "url"},
		{"no types", webhooks.CreateWebhookParams{URL: "http://x/"}, "types"},
		{"unknown type", webhooks.CreateWebhookParams{URL: "http://x/", Types: []string{"usage.other"}}, "types"},
		{"unknown tenant", webhooks.CreateWebhookParams{URL: "http://x/", Types: []string{outbox.TypeLimitHit}, TenantID: "nope"}, "tenant"},
	} {
		var inv *agentqtype.InvalidError
		if _, err := e.hooks.Create(e.ctx, tc.p); !errors.As(err, &inv) || inv.Field != tc.field {
			t.Errorf("%s: %v, want an *agentqtype.InvalidError of %s", tc.name, err, tc.field)
		}
	}
	w := e.create(t, "https://hooks.example/x", "acme", outbox.TypeLimitHit, outbox.TypeLimitHit)
	if len(w.Webhook.Types) != 1 {
		t.Errorf("types %v: a repeated type is kept once", w.Webhook.Types)
	}
	list, err := e.hooks.List(e.ctx)
	if err != nil || len(list) != 1 || list[0].Secret != "" || list[0].PreviousSecret != "" || list[0].TenantID != "acme" {
		t.Fatalf("list %+v %v", list, err)
	}
	for _, id := range []string{"nope", "00000000-0000-0000-0000-000000000000", "{" + w.Webhook.ID.String() + "}"} {
		if _, err := e.hooks.Get(e.ctx, id); !errors.Is(err, agentqtype.ErrNotFound) {
			t.Errorf("get %q: %v", id, err)
		}
	}
	var inv *agentqtype.InvalidError
	if _, err := e.hooks.Attempts(e.ctx, w.Webhook.ID.String(), webhooks.AttemptsParams{After: "x"}); !errors.As(err, &inv) {
		t.Errorf("bad cursor: %v", err)
	}

	// Pages of attempts, newest first.
	rcv := newReceiver(t, func(int, hook) int { return 500 })
	w2 := e.create(t, rcv.srv.URL, "", outbox.TypeLimitHit)
	r := e.relay([]time.Duration{0, time.Second, time.Second, time.Second, time.Second}, 0)
	e.write(t, e.hit(t, "acme", 1))
	runUntil(t, e.ctx, r, func() bool { e.clock.Add(time.Second); return len(rcv.got()) == 5 })
	var seen []int
	after := ""
	for {
		page, err := e.hooks.Attempts(e.ctx, w2.Webhook.ID.String(), webhooks.AttemptsParams{After: after, Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range page.Attempts {
			seen = append(seen, a.Attempt)
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	if fmt.Sprint(seen) != "[5 4 3 2 1]" {
		t.Errorf("attempts paged %v, want [5 4 3 2 1]", seen)
	}
}

// hungReceiver accepts every request and never answers it (until the test ends): a
// receiver that holds each of the relay's sends for its whole timeout. got counts
// the requests it took.
type hungReceiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	got    int
	answer int // requests answered 204 before it hangs
	done   chan struct{}
}

func newHungReceiver(t *testing.T) *hungReceiver { return newReceiverThatHangsAfter(t, 0) }

// newReceiverThatHangsAfter answers its first n requests 204, then never answers.
func newReceiverThatHangsAfter(t *testing.T, n int) *hungReceiver {
	t.Helper()
	h := &hungReceiver{done: make(chan struct{}), answer: n}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		h.mu.Lock()
		h.got++
		answer := h.got <= h.answer
		h.mu.Unlock()
		if answer {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		select {
		case <-req.Context().Done():
		case <-h.done:
		}
	}))
	t.Cleanup(func() { close(h.done); h.srv.Close() })
	return h
}

// count is the requests it holds, not answered.
func (h *hungReceiver) count() int { h.mu.Lock(); defer h.mu.Unlock(); return max(h.got-h.answer, 0) }

// waitFor polls cond for up to d and reports whether it held.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// A receiver that never answers holds only its own deliveries: another endpoint's
// next event is sent while the hung sends are still waiting for their timeout.
func TestRelayHungEndpointDoesNotDelayOthers(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	hung := newHungReceiver(t)
	healthy := newReceiver(t, nil)
	e.create(t, hung.srv.URL, "", outbox.TypeLimitHit)
	e.create(t, healthy.srv.URL, "", outbox.TypeLimitHit)
	const timeout = 20 * time.Second
	r := webhooks.NewRelay(e.st, webhooks.RelayConfig{
		Timeout: timeout, PollInterval: 10 * time.Millisecond,
		AllowNets: netguard.Loopback(),
	})
	if err := r.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	e.write(t, e.hit(t, "acme", 1))
	if !waitFor(10*time.Second, func() bool { return len(healthy.got()) == 1 && hung.count() == 1 }) {
		t.Fatalf("first event: healthy got %d, hung got %d", len(healthy.got()), hung.count())
	}
	// The hung endpoint holds its send; the next events must not wait for it.
	for i := 2; i <= 4; i++ {
		written := time.Now()
		e.write(t, e.hit(t, "acme", i))
		if !waitFor(5*time.Second, func() bool { return len(healthy.got()) == i }) {
			t.Fatalf("event %d reached the healthy endpoint %v after it was written, or never: it waited for the hung one (timeout %v)",
				i, time.Since(written).Round(time.Millisecond), timeout)
		}
	}
}

// fanOutAll fans the written events out at now until want deliveries were written.
func (e *relayEnv) fanOutAll(t *testing.T, now time.Time, want int) {
	t.Helper()
	got := 0
	if !waitFor(20*time.Second, func() bool {
		fo, err := e.st.UnscopedFanOutWebhooks(e.ctx, store.FanOutParams{Now: now, Limit: 500})
		if err != nil {
			t.Fatal(err)
		}
		got += fo.Deliveries
		return got >= want
	}) {
		t.Fatalf("fanned out %d deliveries, want %d", got, want)
	}
}

// A backlog of one endpoint's due deliveries does not fill the claim: every endpoint
// with due work gets its share of it, oldest first within each endpoint.
func TestClaimIsFairBetweenEndpoints(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	t0 := e.clock.Now()
	busy := e.create(t, "https://busy.example/hook", "", outbox.TypeLimitHit)
	var backlog []outbox.Event
	for i := range 200 {
		backlog = append(backlog, e.hit(t, "acme", i))
	}
	e.write(t, backlog...)
	e.fanOutAll(t, t0, 200)
	quiet := e.create(t, "https://quiet.example/hook", "", outbox.TypeLimitHit)
	e.write(t, e.hit(t, "globex", 1))
	e.fanOutAll(t, t0.Add(time.Second), 2) // one each: the quiet endpoint's is due after the whole backlog
	var claimed []store.DeliveryClaim
	claim := func(now time.Time, perEndpoint int) map[string]int {
		t.Helper()
		claims, err := e.st.UnscopedClaimWebhookDeliveries(e.ctx, store.ClaimDeliveriesParams{
			Now: now, Lease: time.Minute, Limit: 10, PerEndpoint: perEndpoint,
		})
		if err != nil {
			t.Fatal(err)
		}
		claimed = claims
		per := map[string]int{}
		for _, c := range claims {
			per[c.URL]++
		}
		return per
	}
	now := t0.Add(2 * time.Second)
	if per := claim(now, 0); per[quiet.Webhook.URL] != 1 || per[busy.Webhook.URL] != 9 {
		t.Fatalf("claimed %v of 10: the quiet endpoint's due delivery must be among them", per)
	}
	// The quiet endpoint's delivery and one of the busy one's succeed (an endpoint
	// that never succeeded would get one at a time: TestEndpointWithoutASuccessGetsOneInFlight).
	recorded := map[string]bool{}
	for _, c := range claimed {
		if recorded[c.URL] {
			continue
		}
		recorded[c.URL] = true
		if _, err := e.st.UnscopedRecordWebhookAttempt(e.ctx, store.RecordAttemptParams{Claim: c, At: now,
			StatusCode: 204, Result: store.AttemptSucceeded}); err != nil {
			t.Fatal(err)
		}
	}
	// With a cap, an endpoint's live leases count against it: 8 are held, so the
	// busy endpoint gets nothing more until they lapse, then 4 at a time.
	if per := claim(now, 4); len(per) != 0 {
		t.Fatalf("claimed %v while the busy endpoint holds 8 leases over its cap of 4", per)
	}
	now = now.Add(time.Minute)
	if per := claim(now, 4); per[busy.Webhook.URL] != 4 || per[quiet.Webhook.URL] != 0 {
		t.Fatalf("claimed %v after the leases lapsed, want 4 of the busy endpoint and none of the quiet one's", per)
	}
	if per := claim(now, 4); len(per) != 0 {
		t.Fatalf("claimed %v past the cap", per)
	}
}

// An endpoint whose last attempt failed, or that has no attempt yet, gets one
// delivery in flight at a time, not the full cap: a receiver that stopped answering,
// or never did, holds one of the relays' sends, not PerEndpoint of them, however many
// of its events come due. Once a delivery to it succeeds it gets the full cap.
func TestEndpointWithoutASuccessGetsOneInFlight(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	t0 := e.clock.Now()
	failing := e.create(t, "https://failing.example/hook", "acme", outbox.TypeLimitHit)
	healthy := e.create(t, "https://healthy.example/hook", "globex", outbox.TypeLimitHit)
	var evs []outbox.Event
	for i := range 10 {
		evs = append(evs, e.hit(t, "acme", i), e.hit(t, "globex", i))
	}
	e.write(t, evs...)
	e.fanOutAll(t, t0, 20)
	claim := func(now time.Time, limit int) ([]store.DeliveryClaim, map[string]int) {
		t.Helper()
		claims, err := e.st.UnscopedClaimWebhookDeliveries(e.ctx, store.ClaimDeliveriesParams{
			Now: now, Lease: time.Second, Limit: limit, PerEndpoint: 4,
		})
		if err != nil {
			t.Fatal(err)
		}
		per := map[string]int{}
		for _, c := range claims {
			per[c.URL]++
		}
		return claims, per
	}
	record := func(c store.DeliveryClaim, at time.Time, result string) {
		t.Helper()
		p := store.RecordAttemptParams{Claim: c, At: at, Result: result, StatusCode: 200}
		if result == store.AttemptRetrying {
			p.StatusCode, p.Error, p.NextAttemptAt = 0, "no answer", at.Add(time.Hour)
		}
		if owned, err := e.st.UnscopedRecordWebhookAttempt(e.ctx, p); err != nil || !owned {
			t.Fatalf("record %s: %v %v", result, owned, err)
		}
	}
	// The failing endpoint's first delivery fails; the healthy one's succeeds.
	now := t0.Add(time.Second)
	claims, _ := claim(now, 2)
	for _, c := range claims {
		if c.URL == failing.Webhook.URL {
			record(c, now, store.AttemptRetrying)
		} else {
			record(c, now, store.AttemptSucceeded)
		}
	}
	_, per := claim(now, 100)
	if per[failing.Webhook.URL] != 1 || per[healthy.Webhook.URL] != 4 {
		t.Fatalf("claimed %v: want one of the failing endpoint's and the healthy one's cap of 4", per)
	}
	// Every lease lapses: the failing endpoint still gets one, and once that one
	// succeeds, the cap is back.
	now = now.Add(2 * time.Hour)
	claims, per = claim(now, 100)
	if per[failing.Webhook.URL] != 1 {
		t.Fatalf("claimed %v: the failing endpoint's probe, one", per)
	}
	for _, c := range claims {
		record(c, now, store.AttemptSucceeded)
	}
	if _, per := claim(now, 100); per[failing.Webhook.URL] != 4 {
		t.Fatalf("claimed %v after the failing endpoint's retry succeeded: want its cap of 4 again", per)
	}
}

// A destination in a refused network is not dialled, whatever name leads to it:
// the attempt fails with an error that names the kind of address, not the URL or
// the address, and the receiver gets nothing. The allow-list lets it through.
func TestRelayRefusesPrivateDestinationsAtDialTime(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	rcv := newReceiver(t, nil)
	port := rcv.srv.URL[strings.LastIndex(rcv.srv.URL, ":")+1:]
	w := e.create(t, "http://localhost:"+port+"/hook?token=s3cret", "", outbox.TypeLimitHit)
	guarded := webhooks.NewRelay(e.st, webhooks.RelayConfig{
		Schedule: []time.Duration{0, time.Minute}, Jitter: func(d time.Duration) time.Duration { return d },
		Archetype: &baseservice.Archetype{Clock: e.clock.Now},
	})
	e.write(t, e.hit(t, "acme", 1))
	var page webhooks.AttemptsPage
	runUntil(t, e.ctx, guarded, func() bool {
		var err error
		page, err = e.hooks.Attempts(e.ctx, w.Webhook.ID.String(), webhooks.AttemptsParams{})
		if err != nil {
			t.Fatal(err)
		}
		return len(page.Attempts) == 1
	})
	a := page.Attempts[0]
	if n := len(rcv.got()); n != 0 {
		t.Fatalf("the loopback receiver got %d requests through the default guard", n)
	}
	if a.Result != store.AttemptRetrying || a.StatusCode != 0 || a.Error != "refused:loopback" {
		t.Errorf("attempt %+v, want a retrying failure saying the destination is refused", a)
	}
	for _, leak := range []string{"localhost", port, "127.0.0.1", "s3cret", "hook"} {
		if strings.Contains(a.Error, leak) {
			t.Errorf("attempt error %q shows %q", a.Error, leak)
		}
	}
	e.clock.Add(time.Minute)
	runUntil(t, e.ctx, e.relay([]time.Duration{0, time.Minute}, 0), func() bool { return len(rcv.got()) == 1 })
}

// Registration refuses an address literal in a refused network, and takes names
// (judged when dialled) and public addresses; the allow-list lets its networks in.
func TestWebhookRegistrationRefusesPrivateAddresses(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	strict := webhooks.NewWebhooks(e.st, webhooks.WebhooksOptions{})
	for _, u := range []string{
		"http://169.254.169.254/latest/meta-data/", "http://10.0.0.5:5432/", "http://[::1]:6379/", "http://127.0.0.1:8080/",
		"https://192.168.1.10/hook", "http://100.64.0.1/", "http://[fd00::1]/", "http://[::ffff:10.0.0.5]/", "http://0.0.0.0/",
		"http://[fe80::1%25eth0]/",
	} {
		_, err := strict.Create(e.ctx, webhooks.CreateWebhookParams{URL: u, Types: []string{outbox.TypeLimitHit}})
		var inv *agentqtype.InvalidError
		if !errors.As(err, &inv) || inv.Field != "url" || !strings.Contains(inv.Message, "refused") {
			t.Errorf("%s: %v, want the url refused", u, err)
		}
	}
	for _, u := range []string{"https://ops.example.com/agentq", "http://93.184.215.14/hook", "http://localhost:9/"} {
		if _, err := strict.Create(e.ctx, webhooks.CreateWebhookParams{URL: u, Types: []string{outbox.TypeLimitHit}}); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
	// The env's service allows loopback, and nothing else.
	if _, err := e.hooks.Create(e.ctx, webhooks.CreateWebhookParams{URL: "http://127.0.0.1:9/", Types: []string{outbox.TypeLimitHit}}); err != nil {
		t.Errorf("loopback with loopback allowed: %v", err)
	}
	if _, err := e.hooks.Create(e.ctx, webhooks.CreateWebhookParams{URL: "http://10.0.0.5/", Types: []string{outbox.TypeLimitHit}}); err == nil {
		t.Error("a private address passed a loopback allow-list")
	}
}

// A tenant's own endpoints: at most its limit (concurrent creations included), each
// visible and changeable by its tenant alone, never listing the operator's, and
// receiving its tenant's events only.
func TestTenantWebhooksAreScopedAndLimited(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	limits := map[string]quotas.Limit{"acme": 2, "globex": quotas.Unlimited}
	hooks := webhooks.NewWebhooks(e.st, webhooks.WebhooksOptions{AllowNets: netguard.Loopback(), Archetype: &baseservice.Archetype{Clock: e.clock.Now},
		EndpointLimit: func(_ context.Context, id string) (quotas.Limit, error) { return limits[id], nil }})
	mine := newReceiver(t, nil)
	operator := e.create(t, "https://ops.example/all", "", outbox.TypeLimitHit)

	// Five at once against a limit of 2: exactly two are made.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var made []webhooks.WebhookWithSecret
	var over []*webhooks.WebhookLimitError
	for range 5 {
		wg.Go(func() {
			w, err := hooks.CreateForTenant(e.ctx, webhooks.TenantWebhookParams{TenantID: "acme", URL: mine.srv.URL + "/acme",
				Types: []string{outbox.TypeLimitHit}})
			mu.Lock()
			defer mu.Unlock()
			var le *webhooks.WebhookLimitError
			switch {
			case err == nil:
				made = append(made, w)
			case errors.As(err, &le):
				over = append(over, le)
			default:
				t.Errorf("create: %v", err)
			}
		})
	}
	wg.Wait()
	if len(made) != 2 || len(over) != 3 || over[0].Limit != 2 || over[0].Used != 2 {
		t.Fatalf("made %d, refused %+v: want 2 made and 3 refused at 2 of 2", len(made), over)
	}
	if !strings.HasPrefix(made[0].Secret, "whsec_") || !made[0].Webhook.TenantOwned || made[0].Webhook.TenantID != "acme" {
		t.Errorf("made %+v", made[0].Webhook)
	}
	other, err := hooks.CreateForTenant(e.ctx, webhooks.TenantWebhookParams{TenantID: "globex", URL: "https://globex.example/hook",
		Types: []string{outbox.TypeLimitHit}})
	if err != nil {
		t.Fatal(err)
	}
	// The destination rules apply to tenants too.
	var inv *agentqtype.InvalidError
	if _, err := hooks.CreateForTenant(e.ctx, webhooks.TenantWebhookParams{TenantID: "globex", URL: "http://10.0.0.5/hook",
		Types: []string{outbox.TypeLimitHit}}); !errors.As(err, &inv) || inv.Field != "url" {
		t.Errorf("private address: %v", err)
	}

	list, err := hooks.ListForTenant(e.ctx, "acme")
	if err != nil || len(list) != 2 || list[0].Secret != "" {
		t.Fatalf("acme's list %+v %v", list, err)
	}
	for _, w := range list {
		if w.ID == operator.Webhook.ID || w.ID == other.Webhook.ID {
			t.Errorf("acme's list shows %s", w.URL)
		}
	}
	for _, id := range []string{other.Webhook.ID.String(), operator.Webhook.ID.String()} {
		if _, err := hooks.GetForTenant(e.ctx, "acme", id); !errors.Is(err, agentqtype.ErrNotFound) {
			t.Errorf("acme gets %s: %v", id, err)
		}
		if _, err := hooks.RotateSecretForTenant(e.ctx, "acme", id); !errors.Is(err, agentqtype.ErrNotFound) {
			t.Errorf("acme rotates %s: %v", id, err)
		}
		if err := hooks.DeleteForTenant(e.ctx, "acme", id); !errors.Is(err, agentqtype.ErrNotFound) {
			t.Errorf("acme deletes %s: %v", id, err)
		}
	}
	if _, err := hooks.Get(e.ctx, other.Webhook.ID.String()); err != nil {
		t.Errorf("globex's endpoint after acme's attempts: %v", err)
	}
	rot, err := hooks.RotateSecretForTenant(e.ctx, "acme", made[0].Webhook.ID.String())
	if err != nil || rot.Secret == made[0].Secret {
		t.Fatalf("rotate own: %v", err)
	}

	// Only acme's events reach acme's endpoints.
	acmeEv, globexEv := e.hit(t, "acme", 1), e.hit(t, "globex", 1)
	e.write(t, acmeEv, globexEv)
	r := e.relay(nil, 0)
	runUntil(t, e.ctx, r, func() bool { return len(mine.got()) >= 2 })
	for range 3 {
		if _, err := r.RunOnce(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range mine.got() {
		if id := h.header.Get("webhook-id"); id != acmeEv.ID {
			t.Errorf("acme's endpoint got %s, want only acme's event %s", id, acmeEv.ID)
		}
	}
	if n := len(mine.got()); n != 2 {
		t.Errorf("acme's two endpoints got %d requests, want one each", n)
	}

	// Deleting one makes room for another.
	if err := hooks.DeleteForTenant(e.ctx, "acme", made[1].Webhook.ID.String()); err != nil {
		t.Fatal(err)
	}
	if _, err := hooks.CreateForTenant(e.ctx, webhooks.TenantWebhookParams{TenantID: "acme", URL: "https://acme.example/new",
		Types: []string{outbox.TypeApproachingLimit}}); err != nil {
		t.Errorf("create after a delete: %v", err)
	}
}

// Several relays together keep an endpoint's in-flight cap: three relays over a hung
// endpoint with a backlog never have more than PerEndpoint requests open to it. Stop
// cuts the hung sends short, at once, and leaves their deliveries pending for the
// next relay once their leases lapse.
func TestRelaysKeepThePerEndpointCapAndStopPromptly(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	// It answers once (an endpoint that never succeeded gets one send at a time),
	// then holds every request.
	hung := newReceiverThatHangsAfter(t, 1)
	w := e.create(t, hung.srv.URL, "", outbox.TypeLimitHit)
	var evs []outbox.Event
	for i := range 30 {
		evs = append(evs, e.hit(t, "acme", i))
	}
	e.write(t, evs...)
	e.fanOutAll(t, e.clock.Now(), 30)
	var relays []*webhooks.Relay
	for range 3 {
		r := webhooks.NewRelay(e.st, webhooks.RelayConfig{
			Archetype: &baseservice.Archetype{Clock: e.clock.Now}, Timeout: 20 * time.Second, PollInterval: 5 * time.Millisecond, PerEndpoint: 3, Workers: 10,
			AllowNets: netguard.Loopback(),
		})
		if err := r.Start(e.ctx); err != nil {
			t.Fatal(err)
		}
		relays = append(relays, r)
	}
	if !waitFor(5*time.Second, func() bool { return hung.count() >= 3 }) {
		t.Fatalf("the hung endpoint got %d requests, want its cap of 3", hung.count())
	}
	time.Sleep(300 * time.Millisecond) // 60 polls of each relay: a fourth would show by now
	if n := hung.count(); n != 3 {
		t.Fatalf("the hung endpoint got %d requests from 3 relays, want at most its cap of 3", n)
	}
	start := time.Now()
	for _, r := range relays {
		r.Stop()
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Stop took %v with sends in flight: it waited for their timeout", took)
	}
	ds, err := e.st.UnscopedListWebhookDeliveries(e.ctx, w.Webhook.ID)
	if err != nil {
		t.Fatal(err)
	}
	pending := 0
	for _, d := range ds {
		if d.State == "pending" {
			pending++
		}
	}
	if pending != len(ds)-1 {
		t.Fatalf("%d of %d deliveries pending after Stop: want all but the answered one (a cut send decides nothing)", pending, len(ds))
	}
	page, _ := e.hooks.Attempts(e.ctx, w.Webhook.ID.String(), webhooks.AttemptsParams{})
	if len(page.Attempts) != 1 || page.Attempts[0].Result != store.AttemptSucceeded {
		t.Errorf("attempts after Stop: %+v, want only the answered one's (none for the sends Stop cut short)", page.Attempts)
	}
}
