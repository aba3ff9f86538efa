package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
)

// Row is one row of the log as its readers see it.
type Row struct {
	ID           int64
	At           time.Time
	Actor        agentqtype.Actor // Kind, Name and Role
	ClaimedActor string
	Reason       string
	Action       string
	Object       Object
	Before       json.RawMessage // null when the object did not exist
	After        json.RawMessage // null when it no longer does
	RequestID    string
	Reverts      int64 // the row a revert undid; 0 for other changes
	PrevHash     string
	Hash         string
}

func rowFrom(r store.AuditRow) (Row, error) {
	out := Row{ID: r.ID, At: r.At.UTC(), ClaimedActor: r.ClaimedActor, Reason: r.Reason, Action: r.Action,
		Before: orNull(r.Before), After: orNull(r.After), RequestID: r.RequestID, PrevHash: r.PrevHash, Hash: r.Hash}
	if r.Reverts != nil {
		out.Reverts = *r.Reverts
	}
	if err := json.Unmarshal(r.Actor, &out.Actor); err != nil {
		return out, fmt.Errorf("audit: row %d actor: %w", r.ID, err)
	}
	if err := json.Unmarshal(r.Object, &out.Object); err != nil {
		return out, fmt.Errorf("audit: row %d object: %w", r.ID, err)
	}
	return out, nil
}

func orNull(b []byte) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	return b
}

// Reverter undoes row r of its kind of object: it applies r's Before when the object
// still matches r's After (else a *ConflictError), records the revert, and returns
// the revert's row head. A row it cannot undo is a *NotRevertibleError.
type Reverter func(ctx context.Context, r Row) (Head, error)

// Log reads, verifies and reverts the audit log.
type Log struct {
	st        *store.Store
	reverters map[string]Reverter
}

// NewLog returns the log over st; Handle gives it the reverters of the kinds of
// object that can be reverted.
func NewLog(st *store.Store) *Log { return &Log{st: st, reverters: map[string]Reverter{}} }

// Handle makes r the reverter of the objects of kind.
func (l *Log) Handle(kind string, r Reverter) { l.reverters[kind] = r }

// Page sizes of List.
const (
	DefaultLimit = 100
	MaxLimit     = store.MaxAuditPage
)

// ListParams select a page of the log, newest first. Object is "kind" or "kind:id";
// Actor an actor's name; Cursor a Page's Next ("" from the newest); Limit at most
// MaxLimit (DefaultLimit when 0).
type ListParams struct {
	Tenant string
	Object string
	Actor  string
	Since  time.Time
	Cursor string
	Limit  int
}

// Page is a page of rows; Next is the cursor of the page after it, "" at the end.
type Page struct {
	Rows []Row
	Next string
}

// kinds are the kinds of object rows name.
var kinds = []string{KindTenant, KindKey, KindAgent, KindBinding, KindPool, KindWebhook, KindPanelLinks, KindTask, KindCredential}

// List returns a page of the log, newest first. A bad parameter is an
// *agentqtype.InvalidError.
func (l *Log) List(ctx context.Context, p ListParams) (Page, error) {
	q, err := listQuery(p)
	if err != nil {
		return Page{}, err
	}
	limit := q.Limit
	q.Limit++
	rs, err := l.st.UnscopedListAudit(ctx, q)
	if err != nil {
		return Page{}, err
	}
	page := Page{}
	if len(rs) > limit {
		rs = rs[:limit]
		page.Next = strconv.FormatInt(rs[limit-1].ID, 10)
	}
	page.Rows, err = rowsFrom(rs)
	return page, err
}

func listQuery(p ListParams) (store.ListAuditParams, error) {
	q := store.ListAuditParams{Tenant: p.Tenant, Actor: p.Actor, Since: p.Since, Limit: p.Limit}
	if q.Limit == 0 {
		q.Limit = DefaultLimit
	}
	if q.Limit < 0 || q.Limit > MaxLimit {
		return q, agentqtype.Invalid("limit", "limit must be between 1 and %d.", MaxLimit)
	}
	if p.Object != "" {
		kind, id, _ := strings.Cut(p.Object, ":")
		if !slices.Contains(kinds, kind) {
			return q, agentqtype.Invalid("object", "object must be KIND or KIND:ID, KIND one of %s.", strings.Join(kinds, ", "))
		}
		q.ObjectKind, q.ObjectID = kind, id
	}
	if p.Cursor != "" {
		n, err := strconv.ParseInt(p.Cursor, 10, 64)
		if err != nil || n <= 0 || strconv.FormatInt(n, 10) != p.Cursor {
			return q, agentqtype.Invalid("cursor", "Malformed cursor: pass cursor= a next_cursor this list gave.")
		}
		q.Before = n
	}
	return q, nil
}

func rowsFrom(rs []store.AuditRow) ([]Row, error) {
	out := make([]Row, 0, len(rs))
	for _, r := range rs {
		row, err := rowFrom(r)
		if err != nil {
			return nil, err
		}
		out = append(out, row)
	}
	return out, nil
}

// noRow is an id naming no row.
func noRow(id string) *agentqtype.NotFoundError {
	return &agentqtype.NotFoundError{What: "audit row", Name: id, Message: fmt.Sprintf("No audit row %s.", strconv.Quote(id))}
}

// ParseID reads a row's id; anything but a positive decimal names no row (a
// *agentqtype.NotFoundError).
func ParseID(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || strconv.FormatInt(n, 10) != s {
		return 0, noRow(s)
	}
	return n, nil
}

// Get returns row id, or a *agentqtype.NotFoundError.
func (l *Log) Get(ctx context.Context, id int64) (Row, error) {
	r, err := l.st.UnscopedGetAudit(ctx, id)
	if errors.Is(err, agentqtype.ErrNotFound) {
		return Row{}, noRow(strconv.FormatInt(id, 10))
	}
	if err != nil {
		return Row{}, err
	}
	return rowFrom(r)
}

// Head returns the chain's head: its last row's id and hash (0 and Genesis when the
// log is empty).
func (l *Log) Head(ctx context.Context) (Head, error) {
	h, err := l.st.UnscopedAuditHead(ctx)
	return Head{ID: h.ID, Hash: h.Hash}, err
}

// Revert undoes row id through the reverter of its object's kind. A row of a kind
// nothing reverts, or that its reverter cannot undo, is a *NotRevertibleError; an
// object changed since, a *ConflictError.
func (l *Log) Revert(ctx context.Context, id int64) (Row, error) {
	r, err := l.Get(ctx, id)
	if err != nil {
		return Row{}, err
	}
	rev, ok := l.reverters[r.Object.Kind]
	if !ok {
		return Row{}, notRevertible(r, "")
	}
	h, err := rev(ctx, r)
	if err != nil {
		return Row{}, err
	}
	return l.Get(ctx, h.ID)
}
