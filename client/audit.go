package client

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// The audit log of changes (GET /v1/admin/audit and the calls below), who made a
// change and why they said they did, and the tenant.limits_changed event.

// WithClaimedActor sends name as X-Agentq-Actor on every request: who the caller says
// acts, kept in the audit log next to the authority the token proves.
func WithClaimedActor(name string) Option {
	return func(t *transport) { t.claimedActor = name }
}

type reasonKey struct{}

// WithReason returns ctx whose requests carry reason as X-Agentq-Reason: why the
// change is made, kept in the audit log with it.
func WithReason(ctx context.Context, reason string) context.Context {
	return context.WithValue(ctx, reasonKey{}, reason)
}

func setChangeHeaders(ctx context.Context, req *http.Request, claimedActor string) {
	if claimedActor != "" {
		req.Header.Set("X-Agentq-Actor", claimedActor)
	}
	if r, ok := ctx.Value(reasonKey{}).(string); ok && r != "" {
		req.Header.Set("X-Agentq-Reason", r)
	}
}

// AuditActor is who made a change, as the server proved it: Kind credential (Name a
// named admin credential, Role its role), key (Name its kid), link (a signed link),
// cli ("cli:<os user>") or library.
type AuditActor struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
	Role string `json:"role"`
}

// AuditObject is what a change was made to.
type AuditObject struct {
	Kind   string `json:"kind"` // tenant, key, agent, binding, pool, webhook, panel_links, task
	ID     string `json:"id"`
	Tenant string `json:"tenant"` // "" for the deployment's own configuration
}

// AuditEntry is one row of the audit log. Before and After are the object's states
// as JSON (null: it did not exist, or no longer does), secrets masked.
type AuditEntry struct {
	ID           int64           `json:"id"`
	At           time.Time       `json:"at"`
	Actor        AuditActor      `json:"actor"`
	ClaimedActor string          `json:"claimed_actor"`
	Reason       string          `json:"reason"`
	Action       string          `json:"action"`
	Object       AuditObject     `json:"object"`
	Before       json.RawMessage `json:"before"`
	After        json.RawMessage `json:"after"`
	RequestID    string          `json:"request_id"`
	Reverts      *int64          `json:"reverts"` // the row a revert undid
	PrevHash     string          `json:"prev_hash"`
	Hash         string          `json:"hash"`
}

// AuditQuery selects a page of the audit log, newest first; empty fields filter
// nothing. Object is "KIND" or "KIND:ID".
type AuditQuery struct {
	Tenant string
	Object string
	Actor  string
	Since  time.Time
	Cursor string // NextCursor of the previous page
	Limit  int    // 1 to 1000; 0 for the server's default (100)
}

func (q AuditQuery) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"tenant": q.Tenant, "object": q.Object, "actor": q.Actor, "cursor": q.Cursor} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	return v
}

// AuditPage is a page of the audit log; NextCursor is "" on the last page.
type AuditPage struct {
	Entries    []AuditEntry `json:"entries"`
	NextCursor string       `json:"next_cursor"`
}

// AuditHead is the audit log's chain head: its last row's id and hash. Keep it
// elsewhere to check later (agentq admin audit verify --expect-head) that no tail
// was cut off.
type AuditHead struct {
	ID   int64  `json:"id"`
	Hash string `json:"hash"`
}

// ListAudit returns a page of the audit log (GET /v1/admin/audit).
func (a *Admin) ListAudit(ctx context.Context, q AuditQuery) (*AuditPage, error) {
	var raw struct {
		Entries    []AuditEntry `json:"entries"`
		NextCursor *string      `json:"next_cursor"`
	}
	if err := a.t.do(ctx, http.MethodGet, "/v1/admin/audit", q.values(), nil, nil, &raw); err != nil {
		return nil, err
	}
	p := &AuditPage{Entries: raw.Entries}
	if raw.NextCursor != nil {
		p.NextCursor = *raw.NextCursor
	}
	return p, nil
}

// GetAudit returns one row of the audit log.
func (a *Admin) GetAudit(ctx context.Context, id int64) (*AuditEntry, error) {
	var e AuditEntry
	if err := a.t.do(ctx, http.MethodGet, "/v1/admin/audit/"+strconv.FormatInt(id, 10), nil, nil, nil, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// AuditHead returns the audit log's chain head.
func (a *Admin) AuditHead(ctx context.Context) (*AuditHead, error) {
	var h AuditHead
	if err := a.t.do(ctx, http.MethodGet, "/v1/admin/audit/head", nil, nil, nil, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// RevertAudit undoes row id when its object is still as the row left it, and returns
// the revert's own row. A row that cannot be undone is an *Error of Code
// "NOT_REVERTIBLE" (400); an object changed since, "REVERT_CONFLICT" (409).
func (a *Admin) RevertAudit(ctx context.Context, id int64) (*AuditEntry, error) {
	var e AuditEntry
	if err := a.t.do(ctx, http.MethodPost, "/v1/admin/audit/"+strconv.FormatInt(id, 10)+"/revert", nil, nil, nil, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// UpdateWebhook enables or disables a webhook endpoint (PATCH /v1/admin/webhooks/{id}).
func (a *Admin) UpdateWebhook(ctx context.Context, id string, enabled bool) (*Webhook, error) {
	var w Webhook
	body := map[string]bool{"enabled": enabled}
	if err := a.t.do(ctx, http.MethodPatch, "/v1/admin/webhooks/"+url.PathEscape(id), nil, nil, body, &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// LimitsState is a tenant's limits as a tenant.limits_changed shows them.
type LimitsState struct {
	Plan       string           `json:"plan"`
	Weight     *int             `json:"weight"` // nil: the plan's
	Status     string           `json:"status"`
	Overrides  map[string]Limit `json:"overrides"`
	BillingDay int              `json:"billing_day"`
	TimeZone   string           `json:"time_zone"`
}

// LimitsChangedData is the data of a tenant.limits_changed. Actor, ClaimedActor and
// Reason are in the operators' copy only (the admin feed, the operator's endpoints).
type LimitsChangedData struct {
	TenantID     string      `json:"tenant_id"`
	Changed      []string    `json:"changed"`
	Before       LimitsState `json:"before"`
	After        LimitsState `json:"after"`
	Audit        AuditHead   `json:"audit"` // the change's row of the audit log
	Actor        *AuditActor `json:"actor"`
	ClaimedActor string      `json:"claimed_actor"`
	Reason       string      `json:"reason"`
}

// LimitsChanged decodes the data of a tenant.limits_changed event.
func (e *Event) LimitsChanged() (*LimitsChangedData, error) {
	if e.Type != EventLimitsChanged {
		return nil, errors.New("agentq: event " + e.ID + " is a " + e.Type + ", not a " + EventLimitsChanged)
	}
	var env struct {
		Data LimitsChangedData `json:"data"`
	}
	if err := json.Unmarshal(e.Raw, &env); err != nil {
		return nil, err
	}
	return &env.Data, nil
}
