package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/audit"
)

// The audit log: GET /v1/admin/audit lists it, newest first; GET /v1/admin/audit/{id}
// reads a row, GET /v1/admin/audit/head the chain's head; POST
// /v1/admin/audit/{id}/revert undoes a row (package audit says what can be).

// Error codes of a refused revert.
const (
	CodeNotRevertible  = "NOT_REVERTIBLE"
	CodeRevertConflict = "REVERT_CONFLICT"
)

// AuditActorJSON is who made a change, as proven.
type AuditActorJSON struct {
	Kind string  `json:"kind"`
	Name string  `json:"name"`
	Role *string `json:"role"`
}

// AuditEntryJSON is one row of the audit log.
type AuditEntryJSON struct {
	ID           int64           `json:"id"`
	At           time.Time       `json:"at"`
	Actor        AuditActorJSON  `json:"actor"`
	ClaimedActor string          `json:"claimed_actor"`
	Reason       string          `json:"reason"`
	Action       string          `json:"action"`
	Object       audit.Object    `json:"object"`
	Before       json.RawMessage `json:"before"`
	After        json.RawMessage `json:"after"`
	RequestID    string          `json:"request_id"`
	Reverts      *int64          `json:"reverts"`
	PrevHash     string          `json:"prev_hash"`
	Hash         string          `json:"hash"`
}

// NewAuditEntryJSON is r as the API shows it (the CLI prints the same).
func NewAuditEntryJSON(r audit.Row) AuditEntryJSON {
	out := AuditEntryJSON{ID: r.ID, At: r.At, Actor: AuditActorJSON{Kind: string(r.Actor.Kind), Name: r.Actor.Name},
		ClaimedActor: r.ClaimedActor, Reason: r.Reason, Action: r.Action, Object: r.Object, Before: r.Before,
		After: r.After, RequestID: r.RequestID, PrevHash: r.PrevHash, Hash: r.Hash}
	if r.Actor.Role != "" {
		role := string(r.Actor.Role)
		out.Actor.Role = &role
	}
	if r.Reverts > 0 {
		out.Reverts = &r.Reverts
	}
	return out
}

// AuditPageJSON is a page of the audit log.
type AuditPageJSON struct {
	Entries    []AuditEntryJSON `json:"entries"`
	NextCursor *string          `json:"next_cursor"`
}

// NewAuditPageJSON is p as the API shows it.
func NewAuditPageJSON(p audit.Page) AuditPageJSON {
	out := AuditPageJSON{Entries: make([]AuditEntryJSON, 0, len(p.Rows))}
	for _, r := range p.Rows {
		out.Entries = append(out.Entries, NewAuditEntryJSON(r))
	}
	if p.Next != "" {
		out.NextCursor = &p.Next
	}
	return out
}

// auditErr turns the audit log's errors into the API's.
func auditErr(err error) error {
	var inv *agentqtype.InvalidError
	var nf *agentqtype.NotFoundError
	var no *audit.NotRevertibleError
	var conflict *audit.ConflictError
	switch {
	case errors.As(err, &no):
		return Errorf(http.StatusBadRequest, CodeNotRevertible, "%s", no.Error())
	case errors.As(err, &conflict):
		return Errorf(http.StatusConflict, CodeRevertConflict, "%s", conflict.Error())
	case errors.As(err, &inv):
		return Errorf(http.StatusBadRequest, CodeInvalidRequest, "%s", inv.Message)
	case errors.As(err, &nf):
		return Errorf(http.StatusNotFound, CodeNotFound, "%s", nf.Message)
	}
	return err
}

// auditQuery reads GET /v1/admin/audit's query: tenant, object, actor, since,
// cursor, limit, nothing else.
func auditQuery(c echo.Context) (audit.ListParams, error) {
	q := c.QueryParams()
	for k := range q {
		switch k {
		case "tenant", "object", "actor", "since", "cursor", "limit":
		default:
			return audit.ListParams{}, Errorf(http.StatusBadRequest, CodeInvalidRequest, "Unknown query parameter %q.", k)
		}
	}
	p := audit.ListParams{Tenant: q.Get("tenant"), Object: q.Get("object"), Actor: q.Get("actor"), Cursor: q.Get("cursor")}
	if s := q.Get("since"); s != "" {
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			return p, Errorf(http.StatusBadRequest, CodeInvalidRequest, "since must be an RFC 3339 time, e.g. 2026-01-02T15:04:05Z.")
		}
		p.Since = t
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > audit.MaxLimit {
			return p, Errorf(http.StatusBadRequest, CodeInvalidRequest, "limit must be between 1 and %d.", audit.MaxLimit)
		}
		p.Limit = n
	}
	return p, nil
}

func (s *API) listAudit(c echo.Context) error {
	p, err := auditQuery(c)
	if err != nil {
		return err
	}
	page, err := s.Audit.List(c.Request().Context(), p)
	if err != nil {
		return auditErr(err)
	}
	return c.JSON(http.StatusOK, NewAuditPageJSON(page))
}

func (s *API) getAudit(c echo.Context) error {
	id, err := audit.ParseID(c.Param("id"))
	if err != nil {
		return auditErr(err)
	}
	r, err := s.Audit.Get(c.Request().Context(), id)
	if err != nil {
		return auditErr(err)
	}
	return c.JSON(http.StatusOK, NewAuditEntryJSON(r))
}

func (s *API) auditHead(c echo.Context) error {
	h, err := s.Audit.Head(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, h)
}

// revertAudit is POST /v1/admin/audit/{id}/revert: 200 with the revert's own row.
func (s *API) revertAudit(c echo.Context) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	var none struct{} // no body, or an empty object
	if err := decodeStrict(body, &none, true); err != nil {
		return err
	}
	id, err := audit.ParseID(c.Param("id"))
	if err != nil {
		return auditErr(err)
	}
	r, err := s.Audit.Revert(c.Request().Context(), id)
	if err != nil {
		return auditErr(err)
	}
	return c.JSON(http.StatusOK, NewAuditEntryJSON(r))
}
