package store

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Event is one row of the events outbox.
type Event struct {
	Cursor    EventCursor // where the feeds resume after it
	ID        string      // the CloudEvents id
	TenantID  string
	Type      string
	DedupeKey string
	Payload   []byte // the event's bytes as written; a resend sends them as they are
	CreatedAt time.Time
}

// EventCursor is a position in the feed order: (xid, seq) of the last event read; the
// zero cursor is the start. The feeds order by the writing transaction's id first, not
// by seq alone, because seq values are taken before their transactions commit, in
// another order.
type EventCursor struct {
	XID uint64 // the id of the transaction that wrote the event
	Seq int64
}

// InsertEventParams are one event to write.
type InsertEventParams struct {
	ID        string
	TenantID  string
	Type      string
	DedupeKey string
	Payload   []byte
	// Audience is who may read the event: AudienceAll ("" too), AudienceOperator (the
	// admin feed, the operator's endpoints) or AudienceTenant (the tenant's feed and
	// its own endpoints).
	Audience string
}

// The audiences of an event.
const (
	AudienceAll      = "all"
	AudienceOperator = "operator"
	AudienceTenant   = "tenant"
)

func audience(a string) string {
	if a == "" {
		return AudienceAll
	}
	return a
}

// InsertEvent writes an event into the outbox unless one with its dedupe key (or id)
// is there already, on the Store's transaction when it runs in InTx: the event then
// commits or rolls back with the change that caused it. written=false when the event
// existed; the stored one is left as it is. A concurrent insert of the same key waits
// for the other transaction and writes only if that one rolled back.
func (s *Store) InsertEvent(ctx context.Context, p InsertEventParams) (written bool, err error) {
	if p.TenantID == "" {
		return false, ErrNoTenant
	}
	tag, err := s.db.Exec(ctx, `
		INSERT INTO events (id, tenant_id, type, dedupe_key, payload, audience) VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT DO NOTHING`, p.ID, p.TenantID, p.Type, p.DedupeKey, p.Payload, audience(p.Audience))
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// UnscopedInsertEvents is InsertEvent for many events, of any tenants, in one
// statement (the refusal flush writes a page of tenants' events at once): each is
// written unless one with its dedupe key (or id) is there already, or comes earlier
// in evs. It returns how many it wrote.
func (s *Store) UnscopedInsertEvents(ctx context.Context, evs []InsertEventParams) (int, error) {
	if len(evs) == 0 {
		return 0, nil
	}
	ids, tenants, types := make([]string, len(evs)), make([]string, len(evs)), make([]string, len(evs))
	keys, payloads, auds := make([]string, len(evs)), make([][]byte, len(evs)), make([]string, len(evs))
	for i, e := range evs {
		if e.TenantID == "" {
			return 0, ErrNoTenant
		}
		ids[i], tenants[i], types[i], keys[i], payloads[i] = e.ID, e.TenantID, e.Type, e.DedupeKey, e.Payload
		auds[i] = audience(e.Audience)
	}
	tag, err := s.db.Exec(ctx, `
		INSERT INTO events (id, tenant_id, type, dedupe_key, payload, audience)
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::text[])
		ON CONFLICT DO NOTHING`, ids, tenants, types, keys, payloads, auds)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// MaxEventsPage bounds a page of the feeds.
const MaxEventsPage = 1000

// ListEventsParams select a page of a feed: the events after After in feed order,
// of Type when set, at most Limit (MaxEventsPage when 0 or above it).
type ListEventsParams struct {
	TenantID string // ListEvents: required; UnscopedListEvents: a filter when set
	Type     string
	After    EventCursor
	Limit    int
}

// ListEvents returns a page of the tenant's own events in feed order, those written
// for the operator alone left out. Events whose
// transaction is younger than the oldest one still running are not shown yet: they
// appear, in order, once that transaction ends, so a reader resuming from the last
// cursor it saw misses none and sees none twice while new events are written.
func (s *Store) ListEvents(ctx context.Context, p ListEventsParams) ([]Event, error) {
	if p.TenantID == "" {
		return nil, ErrNoTenant
	}
	return s.listEvents(ctx, p, AudienceOperator)
}

// UnscopedListEvents is ListEvents across every tenant (TenantID filters when set):
// the finance feed, which leaves out the copies written for the tenants alone.
func (s *Store) UnscopedListEvents(ctx context.Context, p ListEventsParams) ([]Event, error) {
	return s.listEvents(ctx, p, AudienceTenant)
}

// listEvents reads a page of the feed without the events written for audience not.
func (s *Store) listEvents(ctx context.Context, p ListEventsParams, not string) ([]Event, error) {
	if p.Limit <= 0 || p.Limit > MaxEventsPage {
		p.Limit = MaxEventsPage
	}
	// Filters are added to the text rather than written as "$n = '' OR ...", so the
	// plan of each variant can use the tenant's index. xid8 travels as text: pgx has no
	// codec of its own for it.
	q := `SELECT xid::text, seq, id, tenant_id, type, dedupe_key, payload, created_at FROM events
		WHERE (xid, seq) > ($1::text::xid8, $2) AND xid < pg_snapshot_xmin(pg_current_snapshot())`
	args := []any{strconv.FormatUint(p.After.XID, 10), p.After.Seq, not}
	q += ` AND audience <> $3`
	if p.TenantID != "" {
		args = append(args, p.TenantID)
		q += ` AND tenant_id = $` + strconv.Itoa(len(args))
	}
	if p.Type != "" {
		args = append(args, p.Type)
		q += ` AND type = $` + strconv.Itoa(len(args))
	}
	args = append(args, p.Limit)
	q += ` ORDER BY xid, seq LIMIT $` + strconv.Itoa(len(args))
	rows, err := s.db.Query(ctx, q, args...)
	return collect(rows, err, func(row pgx.Row) (Event, error) {
		var e Event
		var xid string
		if err := row.Scan(&xid, &e.Cursor.Seq, &e.ID, &e.TenantID, &e.Type, &e.DedupeKey, &e.Payload, &e.CreatedAt); err != nil {
			return Event{}, err
		}
		var err error
		e.Cursor.XID, err = strconv.ParseUint(xid, 10, 64)
		return e, err
	})
}
