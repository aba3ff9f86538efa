package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agentq/agentq/internal/store"
)

func event(key string) store.InsertEventParams {
	return store.InsertEventParams{ID: "id-" + key, TenantID: "acme", Type: "usage.limit_hit", DedupeKey: key, Payload: []byte(`{"k":"` + key + `"}`)}
}

func insertEvent(t *testing.T, ctx context.Context, st *store.Store, p store.InsertEventParams) {
	t.Helper()
	if written, err := st.InsertEvent(ctx, p); err != nil || !written {
		t.Fatalf("insert %s: written %v, %v", p.DedupeKey, written, err)
	}
}

// page reads the feed after a cursor.
func page(t *testing.T, ctx context.Context, st *store.Store, after store.EventCursor, limit int) []store.Event {
	t.Helper()
	evs, err := st.UnscopedListEvents(ctx, store.ListEventsParams{After: after, Limit: limit})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// keys returns the dedupe keys of evs.
func keys(evs []store.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.DedupeKey
	}
	return out
}

// eventually reads the feed after a cursor until it holds want events. The horizon is
// the whole server's oldest running transaction, so a transaction of another test may
// hold it back a moment.
func eventually(t *testing.T, ctx context.Context, st *store.Store, after store.EventCursor, want int) []store.Event {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		evs := page(t, ctx, st, after, 100)
		if len(evs) >= want || time.Now().After(deadline) {
			if len(evs) != want {
				t.Fatalf("feed after %+v: %v, want %d events", after, keys(evs), want)
			}
			return evs
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// An event is written once per dedupe key; a second write with the key writes
// nothing and leaves the stored bytes as they were. The table refuses updates.
func TestInsertEventOncePerDedupeKey(t *testing.T) {
	t.Parallel()
	ctx, st, pool := setup(t)
	insertEvent(t, ctx, st, event("a"))
	again := event("a")
	again.Payload = []byte(`{"changed":true}`)
	if written, err := st.InsertEvent(ctx, again); err != nil || written {
		t.Fatalf("second insert of a dedupe key: written %v, %v", written, err)
	}
	sameID := event("b")
	sameID.ID = "id-a"
	if written, err := st.InsertEvent(ctx, sameID); err != nil || written {
		t.Fatalf("insert of an existing id: written %v, %v", written, err)
	}
	evs := eventually(t, ctx, st, store.EventCursor{}, 1)
	if !bytes.Equal(evs[0].Payload, event("a").Payload) || evs[0].ID != "id-a" || evs[0].TenantID != "acme" || evs[0].Type != "usage.limit_hit" {
		t.Fatalf("stored event: %+v (%s)", evs[0], evs[0].Payload)
	}
	if _, err := pool.Exec(ctx, `UPDATE events SET payload = '\x00'`); err == nil {
		t.Fatal("an update of an event was accepted")
	}
}

// An event written in a transaction that rolls back is not there; one written in a
// transaction that commits is.
func TestInsertEventInTx(t *testing.T) {
	t.Parallel()
	ctx, st, _ := setup(t)
	boom := errors.New("boom")
	err := st.InTx(ctx, func(tx *store.Store) error {
		insertEvent(t, ctx, tx, event("rolled-back"))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if err := st.InTx(ctx, func(tx *store.Store) error {
		_, err := tx.InsertEvent(ctx, event("committed"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// The rolled-back key is free again.
	insertEvent(t, ctx, st, event("rolled-back"))
	if got := keys(eventually(t, ctx, st, store.EventCursor{}, 2)); got[0] != "committed" || got[1] != "rolled-back" {
		t.Fatalf("feed: %v", got)
	}
}

// The feed filters by tenant and type, and pages by cursor and limit.
func TestListEventsFiltersAndPages(t *testing.T) {
	t.Parallel()
	ctx, st, _ := setup(t)
	for i := range 5 {
		p := event(fmt.Sprint("acme-", i))
		if i%2 == 1 {
			p.Type = "usage.approaching_limit"
		}
		insertEvent(t, ctx, st, p)
		other := event(fmt.Sprint("globex-", i))
		other.TenantID = "globex"
		insertEvent(t, ctx, st, other)
	}
	all := eventually(t, ctx, st, store.EventCursor{}, 10)
	var walked []string
	for after := (store.EventCursor{}); ; {
		evs, err := st.ListEvents(ctx, store.ListEventsParams{TenantID: "acme", After: after, Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			break
		}
		if len(evs) > 2 {
			t.Fatalf("a page of limit 2 held %d", len(evs))
		}
		walked = append(walked, keys(evs)...)
		after = evs[len(evs)-1].Cursor
	}
	if fmt.Sprint(walked) != "[acme-0 acme-1 acme-2 acme-3 acme-4]" {
		t.Fatalf("acme's pages: %v (feed %v)", walked, keys(all))
	}
	evs, err := st.UnscopedListEvents(ctx, store.ListEventsParams{Type: "usage.approaching_limit"})
	if err != nil || fmt.Sprint(keys(evs)) != "[acme-1 acme-3]" {
		t.Fatalf("approaching events of every tenant: %v, %v", keys(evs), err)
	}
	evs, err = st.UnscopedListEvents(ctx, store.ListEventsParams{TenantID: "globex", Type: "usage.limit_hit", After: all[0].Cursor})
	if err != nil || fmt.Sprint(keys(evs)) != "[globex-0 globex-1 globex-2 globex-3 globex-4]" {
		t.Fatalf("globex's limit hits: %v, %v", keys(evs), err)
	}
}

// begin opens a transaction on its own connection.
func begin(t *testing.T, ctx context.Context, st *store.Store) pgx.Tx {
	t.Helper()
	tx, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	return tx
}

func txInsert(t *testing.T, ctx context.Context, tx pgx.Tx, key string) {
	t.Helper()
	p := event(key)
	if _, err := tx.Exec(ctx, `INSERT INTO events (id, tenant_id, type, dedupe_key, payload) VALUES ($1, $2, $3, $4, $5)`,
		p.ID, p.TenantID, p.Type, p.DedupeKey, p.Payload); err != nil {
		t.Fatal(err)
	}
}

// Two transactions insert; the one holding the later seq commits first. The feed
// shows neither until the earlier one ends, then both, in seq order.
func TestFeedWaitsForAnEarlierSeqInFlight(t *testing.T) {
	t.Parallel()
	ctx, st, _ := setup(t)
	a, b := begin(t, ctx, st), begin(t, ctx, st)
	txInsert(t, ctx, a, "first-seq")
	txInsert(t, ctx, b, "second-seq")
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if evs := page(t, ctx, st, store.EventCursor{}, 100); len(evs) != 0 {
		t.Fatalf("the feed showed %v while an earlier seq was in flight", keys(evs))
	}
	if err := a.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	evs := eventually(t, ctx, st, store.EventCursor{}, 2)
	if got := keys(evs); got[0] != "first-seq" || got[1] != "second-seq" || evs[0].Cursor.Seq >= evs[1].Cursor.Seq {
		t.Fatalf("feed: %v %+v", got, evs)
	}
}

// The transaction that took its id first inserts last, with the later seq, and
// commits while the other is still open. A reader that has read its event, and
// resumes from there, still gets the other's (lower) seq once it commits: the feed
// orders by transaction, not by seq alone.
func TestFeedMissesNoLowerSeqCommittedLater(t *testing.T) {
	t.Parallel()
	ctx, st, _ := setup(t)
	a, b := begin(t, ctx, st), begin(t, ctx, st)
	if _, err := a.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil { // a's id first
		t.Fatal(err)
	}
	txInsert(t, ctx, b, "lower-seq")
	txInsert(t, ctx, a, "higher-seq")
	if err := a.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	first := eventually(t, ctx, st, store.EventCursor{}, 1)
	if first[0].DedupeKey != "higher-seq" {
		t.Fatalf("feed: %v", keys(first))
	}
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	next := eventually(t, ctx, st, first[0].Cursor, 1)
	if next[0].DedupeKey != "lower-seq" || next[0].Cursor.Seq >= first[0].Cursor.Seq {
		t.Fatalf("after %+v: %+v", first[0].Cursor, next)
	}
}

// Writers insert events in transactions of their own while a reader pages the feed
// from its last cursor: the reader gets every committed event exactly once, none
// rolled back, in increasing cursor order.
func TestFeedPagesWhileEventsArrive(t *testing.T) {
	t.Parallel()
	ctx, st, _ := setup(t)
	const writers, each = 4, 25
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				key := fmt.Sprintf("w%d-%d", w, i)
				err := st.InTx(ctx, func(tx *store.Store) error {
					if _, err := tx.InsertEvent(ctx, event(key)); err != nil {
						return err
					}
					time.Sleep(time.Duration((w*7+i*3)%5) * time.Millisecond)
					if i%5 == 4 {
						return errRollback
					}
					return nil
				})
				if err != nil && !errors.Is(err, errRollback) {
					t.Error(err)
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	want := writers * each * 4 / 5
	seen := map[string]bool{}
	var after store.EventCursor
	deadline := time.Now().Add(30 * time.Second)
	for len(seen) < want && time.Now().Before(deadline) {
		for _, e := range page(t, ctx, st, after, 7) {
			if e.Cursor.XID < after.XID || (e.Cursor.XID == after.XID && e.Cursor.Seq <= after.Seq) {
				t.Fatalf("cursor went back: %+v after %+v", e.Cursor, after)
			}
			if seen[e.DedupeKey] {
				t.Fatalf("%s read twice", e.DedupeKey)
			}
			seen[e.DedupeKey] = true
			after = e.Cursor
		}
	}
	<-done
	if len(seen) != want {
		t.Fatalf("read %d events, want %d", len(seen), want)
	}
	for k := range seen {
		var w, i int
		if _, err := fmt.Sscanf(k, "w%d-%d", &w, &i); err != nil || i%5 == 4 {
			t.Fatalf("read %s, which was rolled back", k)
		}
	}
	if evs := page(t, ctx, st, after, 100); len(evs) != 0 {
		t.Fatalf("events after the last: %v", keys(evs))
	}
}

var errRollback = errors.New("roll back")

// Many events written in one statement keep InsertEvent's rule: one per dedupe key,
// the first bytes kept, against the table and within the batch.
func TestInsertEventsWritesEachKeyOnce(t *testing.T) {
	t.Parallel()
	ctx, st, _ := setup(t)
	insertEvent(t, ctx, st, event("a"))
	again := event("c")
	again.ID, again.Payload = "id-c2", []byte(`{"k":"again"}`)
	n, err := st.UnscopedInsertEvents(ctx, []store.InsertEventParams{event("a"), event("b"), event("c"), again})
	if err != nil || n != 2 {
		t.Fatalf("wrote %d %v, want b and c", n, err)
	}
	evs := eventually(t, ctx, st, store.EventCursor{}, 3)
	if got := keys(evs); fmt.Sprint(got) != "[a b c]" || !bytes.Equal(evs[2].Payload, event("c").Payload) {
		t.Fatalf("events %v, c %s", got, evs[2].Payload)
	}
	if _, err := st.UnscopedInsertEvents(ctx, []store.InsertEventParams{{ID: "x", DedupeKey: "x", Type: "t", Payload: []byte("{}")}}); !errors.Is(err, store.ErrNoTenant) {
		t.Fatalf("an event without its tenant: %v", err)
	}
}
