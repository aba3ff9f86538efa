package outbox

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/agentq/agentq/internal/store"
)

// WriteEvent writes ev into the outbox on tx, the transaction of the change that
// caused it (store.InTx), unless an event with its dedupe key is there already:
// written=false then, and the stored event is left as it was.
func WriteEvent(ctx context.Context, tx *store.Store, ev Event) (written bool, err error) {
	return tx.InsertEvent(ctx, store.InsertEventParams{
		ID: ev.ID, TenantID: ev.TenantID, Type: ev.Type, DedupeKey: ev.DedupeKey, Payload: ev.Payload, Audience: ev.Audience,
	})
}

// ErrBadCursor: a feed's after cursor is not one the feed gave.
var ErrBadCursor = errors.New("billing: not an events cursor")

// ErrNoTenant: the tenant feed was asked for no tenant. It is also store.ErrNoTenant.
var ErrNoTenant = fmt.Errorf("billing: no tenant given: %w", store.ErrNoTenant)

// The feeds' page sizes.
const (
	DefaultFeedLimit = 100
	MaxFeedLimit     = store.MaxEventsPage
)

const cursorVersion = 1

// EncodeCursor writes a feed position as an opaque string.
func EncodeCursor(c store.EventCursor) string {
	b := make([]byte, 17)
	b[0] = cursorVersion
	binary.BigEndian.PutUint64(b[1:], c.XID)
	binary.BigEndian.PutUint64(b[9:], uint64(c.Seq))
	return base64.RawURLEncoding.EncodeToString(b)
}

// DecodeCursor reads what EncodeCursor writes; "" is the start of the feed.
func DecodeCursor(s string) (store.EventCursor, error) {
	if s == "" {
		return store.EventCursor{}, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) != 17 || b[0] != cursorVersion {
		return store.EventCursor{}, ErrBadCursor
	}
	c := store.EventCursor{XID: binary.BigEndian.Uint64(b[1:]), Seq: int64(binary.BigEndian.Uint64(b[9:]))}
	if c.Seq < 0 {
		return store.EventCursor{}, ErrBadCursor
	}
	return c, nil
}

// Feed reads the events outbox for the pull feeds.
type Feed struct {
	st *store.Store
}

// NewFeed returns a Feed reading st.
func NewFeed(st *store.Store) *Feed { return &Feed{st: st} }

// FeedParams select a page: events after the cursor After ("" from the start), of
// Type when set, at most Limit (DefaultFeedLimit when 0, MaxFeedLimit at most).
type FeedParams struct {
	Type  string
	After string
	Limit int
}

// FeedPage is a page of a feed. Next is where the next page starts: After again when
// the page is empty, so a reader polls from where it is.
type FeedPage struct {
	Events []FeedEvent
	Next   string
}

// FeedEvent is one event of a feed.
type FeedEvent struct {
	ID       string
	Type     string
	TenantID string
	Payload  []byte // the CloudEvent as written
}

// Tenant returns a page of one tenant's own events (GET /v1/events).
func (f *Feed) Tenant(ctx context.Context, tenantID string, p FeedParams) (FeedPage, error) {
	if tenantID == "" {
		return FeedPage{}, ErrNoTenant
	}
	return f.page(ctx, tenantID, p, f.st.ListEvents)
}

// All returns a page of every tenant's events, or of tenantID's when it is set: the
// finance feed (GET /v1/admin/events).
func (f *Feed) All(ctx context.Context, tenantID string, p FeedParams) (FeedPage, error) {
	return f.page(ctx, tenantID, p, f.st.UnscopedListEvents)
}

func (f *Feed) page(ctx context.Context, tenantID string, p FeedParams,
	list func(context.Context, store.ListEventsParams) ([]store.Event, error)) (FeedPage, error) {
	after, err := DecodeCursor(p.After)
	if err != nil {
		return FeedPage{}, err
	}
	limit := p.Limit
	if limit <= 0 {
		limit = DefaultFeedLimit
	}
	limit = min(limit, MaxFeedLimit)
	evs, err := list(ctx, store.ListEventsParams{TenantID: tenantID, Type: p.Type, After: after, Limit: limit})
	if err != nil {
		return FeedPage{}, err
	}
	page := FeedPage{Events: make([]FeedEvent, len(evs)), Next: p.After}
	for i, e := range evs {
		page.Events[i] = FeedEvent{ID: e.ID, Type: e.Type, TenantID: e.TenantID, Payload: e.Payload}
	}
	if len(evs) > 0 {
		page.Next = EncodeCursor(evs[len(evs)-1].Cursor)
	}
	return page, nil
}
