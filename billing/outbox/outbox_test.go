package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
)

func newOutbox(t *testing.T) (context.Context, *store.Store, *outbox.Feed) {
	t.Helper()
	t.Parallel()
	st := store.New(testenv.Postgres(t))
	return context.Background(), st, outbox.NewFeed(st)
}

// settled reads the finance feed from the start until it holds want events: the feed
// shows a commit once every older transaction of the server has ended, and another
// test's may still be running.
func settled(t *testing.T, ctx context.Context, f *outbox.Feed, p outbox.FeedParams, want int) outbox.FeedPage {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		pg, err := f.All(ctx, "", p)
		if err != nil {
			t.Fatal(err)
		}
		if len(pg.Events) >= want || time.Now().After(deadline) {
			if len(pg.Events) != want {
				t.Fatalf("feed: %d events, want %d", len(pg.Events), want)
			}
			return pg
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// An event commits or rolls back with the change it is written with, and is written
// once: a quota reaching 100 % and three refusals after it in its period are one
// limit_hit, stored as first built.
func TestWriteEventWithTheChange(t *testing.T) {
	ctx, st, feed := newOutbox(t)
	crossed, err := events.Crossings(usd, 90_000_000, 100_000_000, eventAt)
	if err != nil || len(crossed) != 1 {
		t.Fatalf("%v %v", crossed, err)
	}
	boom := errors.New("the change failed")
	err = st.InTx(ctx, func(tx *store.Store) error {
		if written, err := outbox.WriteEvent(ctx, tx, crossed[0]); err != nil || !written {
			t.Fatalf("written %v, %v", written, err)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if err := st.InTx(ctx, func(tx *store.Store) error {
		_, err := outbox.WriteEvent(ctx, tx, crossed[0])
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		r, err := events.LimitHit(outbox.Refusal{TenantID: "acme", Plan: "pro", LimitType: quotas.USDMonthly,
			Limit: usd.Limit, Used: usd.Limit + int64(i), Period: &novPeriod, At: eventAt.Add(time.Duration(i) * time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		if written, err := outbox.WriteEvent(ctx, st, r); err != nil || written {
			t.Fatalf("refusal %d after the quota's 100 %% event: written %v, %v", i, written, err)
		}
	}
	pg := settled(t, ctx, feed, outbox.FeedParams{}, 1)
	if e := pg.Events[0]; !bytes.Equal(e.Payload, crossed[0].Payload) || e.ID != crossed[0].ID || e.Type != outbox.TypeLimitHit || e.TenantID != "acme" {
		t.Fatalf("stored %+v (%s)", e, e.Payload)
	}
}

func TestCursor(t *testing.T) {
	for _, c := range []store.EventCursor{{}, {XID: 1, Seq: 1}, {XID: 1<<64 - 1, Seq: 1<<63 - 1}} {
		got, err := outbox.DecodeCursor(outbox.EncodeCursor(c))
		if err != nil || got != c {
			t.Errorf("%+v came back as %+v, %v", c, got, err)
		}
	}
	if c, err := outbox.DecodeCursor(""); err != nil || c != (store.EventCursor{}) {
		t.Errorf("the empty cursor: %+v, %v", c, err)
	}
	neg := outbox.EncodeCursor(store.EventCursor{XID: 1, Seq: -1})
	for _, bad := range []string{"x", "12", "AAAA", neg, outbox.EncodeCursor(store.EventCursor{XID: 1, Seq: 2}) + "A"} {
		if _, err := outbox.DecodeCursor(bad); !errors.Is(err, outbox.ErrBadCursor) {
			t.Errorf("DecodeCursor(%q): %v, want ErrBadCursor", bad, err)
		}
	}
}

// The feeds page by the cursor they give; a tenant's feed holds its events only.
func TestFeedPages(t *testing.T) {
	ctx, st, feed := newOutbox(t)
	for _, tenant := range []string{"acme", "globex"} {
		q := usd
		q.TenantID = tenant
		evs, err := events.Crossings(q, 0, q.Limit, eventAt)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if _, err := outbox.WriteEvent(ctx, st, ev); err != nil {
				t.Fatal(err)
			}
		}
	}
	settled(t, ctx, feed, outbox.FeedParams{}, 6)
	var ids []string
	after := ""
	for range 10 {
		pg, err := feed.Tenant(ctx, "acme", outbox.FeedParams{After: after, Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		if len(pg.Events) == 0 {
			if pg.Next != after {
				t.Fatalf("an empty page moved the cursor from %q to %q", after, pg.Next)
			}
			break
		}
		for _, e := range pg.Events {
			if e.TenantID != "acme" {
				t.Fatalf("acme's feed holds %+v", e)
			}
			ids = append(ids, e.ID)
		}
		after = pg.Next
	}
	want := []string{
		outbox.EventID(outbox.PeriodKey("acme", quotas.USDMonthly, novPeriod.Start, 80)),
		outbox.EventID(outbox.PeriodKey("acme", quotas.USDMonthly, novPeriod.Start, 90)),
		outbox.EventID(outbox.PeriodKey("acme", quotas.USDMonthly, novPeriod.Start, 100)),
	}
	if len(ids) != 3 || ids[0] != want[0] || ids[1] != want[1] || ids[2] != want[2] {
		t.Fatalf("acme's pages: %v, want %v", ids, want)
	}
	pg, err := feed.All(ctx, "globex", outbox.FeedParams{Type: outbox.TypeLimitHit})
	if err != nil || len(pg.Events) != 1 || pg.Events[0].TenantID != "globex" || pg.Events[0].Type != outbox.TypeLimitHit {
		t.Fatalf("globex's limit hits: %+v, %v", pg, err)
	}
	if _, err := feed.Tenant(ctx, "", outbox.FeedParams{}); !errors.Is(err, store.ErrNoTenant) {
		t.Fatalf("a tenant feed without a tenant: %v", err)
	}
	if _, err := feed.All(ctx, "", outbox.FeedParams{After: "nope"}); !errors.Is(err, outbox.ErrBadCursor) {
		t.Fatalf("a bad cursor: %v", err)
	}
}
