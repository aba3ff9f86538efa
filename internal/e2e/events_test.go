package e2e_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// eventWriter writes usage events into the outbox as the domain services do, each
// in its own transaction (n > 1: several in one).
type eventWriter struct {
	st  *store.Store
	evs outbox.Events
}

var feedEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// limitHit builds tenant's limit_hit number i of the named writer: a minute of its own,
// so no two dedupe.
func (w eventWriter) limitHit(tenant, writer string, i int) outbox.Event {
	ev, err := w.evs.LimitHit(outbox.Refusal{TenantID: tenant, Plan: "pro", LimitType: quotas.TenantRate + "_" + writer,
		Limit: 5, Used: 5, At: feedEpoch.Add(time.Duration(i) * time.Minute)})
	if err != nil {
		panic(err) // a tenant is always given
	}
	return ev
}

func (w eventWriter) write(ctx context.Context, evs ...outbox.Event) error {
	return w.st.InTx(ctx, func(tx *store.Store) error {
		for _, ev := range evs {
			if ok, err := outbox.WriteEvent(ctx, tx, ev); err != nil || !ok {
				return fmt.Errorf("write %s: %v %v", ev.ID, ok, err)
			}
		}
		return nil
	})
}

// drain pages through a feed from after until fetch gives an empty page, and returns
// the events and the last cursor.
func drain(t *testing.T, after string, fetch func(after string) (*client.EventPage, error)) ([]client.Event, string) {
	t.Helper()
	var out []client.Event
	for {
		p, err := fetch(after)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Events) == 0 {
			if p.NextCursor != after {
				t.Fatalf("an empty page moved the cursor from %q to %q", after, p.NextCursor)
			}
			return out, after
		}
		out = append(out, p.Events...)
		after = p.NextCursor
	}
}

// Paging through GET /v1/events while events are written sees each of the tenant's
// events once, in the order each writer wrote them, byte for byte as stored, and
// none of another tenant's.
func TestEventsFeedPaginatesUnderConcurrentWrites(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.start(t)
	acme, _ := h.tenantClient("acme", "pro", nil)
	h.tenantClient("globex", "pro", nil)
	w := eventWriter{st: store.New(e.pool), evs: outbox.Events{UpgradeURL: "https://agentq.example/upgrade?plan=pro&x=<y>"}}
	ctx := context.Background()

	const perWriter = 60
	written := map[string][]byte{} // acme's events, by id
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, writer := range []string{"a", "b", "c"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWriter; {
				// Some transactions write two events, and each also writes one of globex's.
				batch := []outbox.Event{w.limitHit("acme", writer, i), w.limitHit("globex", writer, i)}
				i++
				if i%3 == 0 && i < perWriter {
					batch = append(batch, w.limitHit("acme", writer, i))
					i++
				}
				mu.Lock()
				for _, ev := range batch {
					if ev.TenantID == "acme" {
						written[ev.ID] = ev.Payload
					}
				}
				mu.Unlock()
				if err := w.write(ctx, batch...); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	fetch := func(after string) (*client.EventPage, error) {
		return acme.Events(ctx, client.EventsQuery{After: after, Limit: 7})
	}
	var seen []client.Event
	after := ""
	deadline := time.Now().Add(30 * time.Second)
	for finished := false; ; {
		select {
		case <-done:
			finished = true
		default:
		}
		var got []client.Event
		got, after = drain(t, after, fetch)
		seen = append(seen, got...)
		if finished && len(seen) >= 3*perWriter {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("saw %d of %d events", len(seen), 3*perWriter)
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(seen) != 3*perWriter {
		t.Fatalf("saw %d events, want %d", len(seen), 3*perWriter)
	}
	last := map[string]time.Time{}
	ids := map[string]bool{}
	for _, ev := range seen {
		if ev.Subject != "acme" || ev.Data.TenantID != "acme" {
			t.Fatalf("acme's feed shows %s's event %s", ev.Subject, ev.Raw)
		}
		if ids[ev.ID] {
			t.Fatalf("event %s seen twice", ev.ID)
		}
		ids[ev.ID] = true
		if !bytes.Equal(ev.Raw, written[ev.ID]) {
			t.Fatalf("event %s is not byte for byte as stored:\n%s\n%s", ev.ID, ev.Raw, written[ev.ID])
		}
		// Each writer's events carry increasing minutes and were committed in that order.
		if prev, ok := last[ev.Data.LimitType]; ok && !ev.Time.After(prev) {
			t.Fatalf("%s: event at %s after one at %s", ev.Data.LimitType, ev.Time, prev)
		}
		last[ev.Data.LimitType] = ev.Time
	}
	// From the last cursor, nothing more; a new event shows after it.
	ev := w.limitHit("acme", "late", 0)
	if err := w.write(ctx, ev); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		got, _ := drain(t, after, fetch)
		if len(got) == 1 && got[0].ID == ev.ID {
			break
		}
		if len(got) > 0 || time.Now().After(deadline) {
			t.Fatalf("after the last cursor: %d events, want the new one", len(got))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The admin feed shows every tenant's events and filters by tenant and type; the
// tenant feed filters by type; a cursor the feed did not give is a 400.
func TestAdminEventsFeedFilters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.start(t)
	acme, _ := h.tenantClient("acme", "pro", nil)
	h.tenantClient("globex", "pro", nil)
	w := eventWriter{st: store.New(e.pool)}
	ctx := context.Background()
	period := outbox.Span{Start: feedEpoch, End: feedEpoch.AddDate(0, 1, 0)}
	for _, tenant := range []string{"acme", "globex"} {
		// 80 %, 90 % and 100 % of the tokens quota: two approaching_limit and a limit_hit.
		evs, err := w.evs.Crossings(outbox.Quota{TenantID: tenant, Plan: "pro", LimitType: quotas.AITokensMonthly, Limit: 100, Period: period}, 0, 100, feedEpoch)
		if err != nil || len(evs) != 3 {
			t.Fatalf("crossings: %d %v", len(evs), err)
		}
		if err := w.write(ctx, evs...); err != nil {
			t.Fatal(err)
		}
	}
	admin := h.adminClient()
	// The feed shows an event once no transaction older than it is still open, in any
	// schema of the database: another test's open transaction can hold back globex's
	// events after acme's show, so wait for the count the query should reach.
	all := func(q client.AdminEventsQuery, want int) []client.Event {
		t.Helper()
		var out []client.Event
		for deadline := time.Now().Add(10 * time.Second); ; {
			out, _ = drain(t, "", func(after string) (*client.EventPage, error) {
				q.After = after
				return admin.Events(ctx, q)
			})
			if len(out) >= want || time.Now().After(deadline) {
				return out
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if got := all(client.AdminEventsQuery{}, 6); len(got) != 6 {
		t.Fatalf("admin feed: %d events, want 6", len(got))
	}
	got := all(client.AdminEventsQuery{Tenant: "globex", EventsQuery: client.EventsQuery{Type: client.EventApproachingLimit, Limit: 1}}, 2)
	if len(got) != 2 {
		t.Fatalf("globex's approaching_limit: %d events, want 2", len(got))
	}
	for _, ev := range got {
		if ev.Subject != "globex" || ev.Type != client.EventApproachingLimit {
			t.Fatalf("filtered admin feed shows %s", ev.Raw)
		}
	}
	if got := all(client.AdminEventsQuery{Tenant: "globex", EventsQuery: client.EventsQuery{Type: client.EventLimitHit}}, 1); len(got) != 1 ||
		got[0].Data.Threshold != 100 || got[0].Data.LimitType != quotas.AITokensMonthly {
		t.Fatalf("globex's limit_hit: %+v", got)
	}
	page, err := acme.Events(ctx, client.EventsQuery{Type: client.EventLimitHit})
	if err != nil || len(page.Events) != 1 || page.Events[0].Subject != "acme" || page.Events[0].Type != client.EventLimitHit {
		t.Fatalf("acme's limit_hit: %+v %v", page, err)
	}
	for _, bad := range []func() error{
		func() error { _, err := acme.Events(ctx, client.EventsQuery{After: "not-a-cursor"}); return err },
		func() error { _, err := acme.Events(ctx, client.EventsQuery{Limit: 1001}); return err },
		func() error { _, err := acme.Events(ctx, client.EventsQuery{Type: "usage.other"}); return err },
		func() error {
			_, err := admin.Events(ctx, client.AdminEventsQuery{EventsQuery: client.EventsQuery{After: page.NextCursor + "x"}})
			return err
		},
	} {
		var ae *client.Error
		if err := bad(); !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest || ae.Code != "INVALID_REQUEST" {
			t.Errorf("bad query: %v, want 400 INVALID_REQUEST", err)
		}
	}
	// The tenant feed is authenticated like every tenant read.
	if _, err := client.New(h.base, "aq_nope_nope").Events(ctx, client.EventsQuery{}); err == nil {
		t.Error("the tenant feed answered without a valid key")
	}
}

// A task the worker stops at its budget leaves one usage.limit_hit naming the budget
// field, readable in the tenant's feed.
func TestBudgetStopShowsInTheFeed(t *testing.T) {
	t.Parallel()
	h := start(t)
	acme, _ := h.tenantClient("acme", "pro_stop", nil)
	ctx := context.Background()
	steps, cost := 2, 0.0025
	for _, b := range []*client.BudgetRequest{{MaxSteps: &steps}, {MaxCostUSD: &cost}} {
		req := client.SubmitTaskRequest{Agent: "sim", Budget: b,
			Input: map[string]any{"steps": 5, "step_ms": 1, "cost_usd_per_step": 0.001}}
		task, err := acme.SubmitTask(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		waitState(t, acme, task.ID, client.StateBudgetExceeded, 20*time.Second)
	}
	var got []client.Event
	for deadline := time.Now().Add(10 * time.Second); len(got) < 2 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		got, _ = drain(t, "", func(after string) (*client.EventPage, error) {
			return acme.Events(ctx, client.EventsQuery{After: after, Type: client.EventLimitHit})
		})
	}
	byType := map[string]client.EventData{}
	for _, ev := range got {
		byType[ev.Data.LimitType] = ev.Data
	}
	if d := byType[outbox.LimitTaskMaxSteps]; len(got) != 2 || d.LimitValue != "2" || d.CurrentUsage != "2" ||
		d.Enforcement != "stopped" || d.SLAClassification != "enforced_limit" || d.Window == nil {
		t.Fatalf("limit_hit events %+v", got)
	}
	// Stopped before the step that would pass the cap: $0.002 spent, a third $0.001
	// step would make $0.003.
	if d := byType[outbox.LimitTaskMaxCostUSD]; d.LimitValue != "0.002500" || d.CurrentUsage != "0.002000" {
		t.Fatalf("cost limit_hit %+v", d)
	}
}
