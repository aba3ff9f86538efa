package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/billing/outbox"
)

// feedParams reads type, after and limit, and tenant when admin; every other query
// parameter is refused.
func feedParams(c echo.Context, admin bool) (outbox.FeedParams, string, error) {
	p := outbox.FeedParams{Limit: outbox.DefaultFeedLimit}
	q := c.QueryParams()
	for k := range q {
		switch k {
		case "type", "after", "limit":
		case "tenant":
			if admin {
				continue
			}
			fallthrough
		default:
			return p, "", Errorf(http.StatusBadRequest, CodeInvalidRequest, "Unknown query parameter %q.", k)
		}
	}
	if t := q.Get("type"); t != "" {
		if !outbox.KnownType(t) {
			return p, "", Errorf(http.StatusBadRequest, CodeInvalidRequest, "Unknown event type %q: use %s.",
				t, strings.Join(outbox.Types, ", "))
		}
		p.Type = t
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > outbox.MaxFeedLimit {
			return p, "", Errorf(http.StatusBadRequest, CodeInvalidRequest, "limit must be between 1 and %d.", outbox.MaxFeedLimit)
		}
		p.Limit = n
	}
	p.After = q.Get("after")
	if _, err := outbox.DecodeCursor(p.After); err != nil {
		return p, "", badCursor()
	}
	return p, q.Get("tenant"), nil
}

func badCursor() *APIError {
	return Errorf(http.StatusBadRequest, CodeInvalidRequest, "Malformed cursor: pass after= a next_cursor this feed gave.")
}

// writeEvents answers a page. The body is put together by hand, not re-encoded:
// encoding/json would re-compact (and HTML-escape) each stored event, and the
// contract is the stored bytes.
func writeEvents(c echo.Context, page outbox.FeedPage, err error) error {
	if errors.Is(err, outbox.ErrBadCursor) {
		return badCursor()
	}
	if err != nil {
		return err
	}
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, EventsBody(page))
}

// EventsBody is the JSON of a feed page, {"events":[…],"next_cursor":"…"}, each event
// its stored bytes; the CLI prints the same.
func EventsBody(page outbox.FeedPage) []byte {
	var b bytes.Buffer
	b.WriteString(`{"events":[`)
	for i, e := range page.Events {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(e.Payload)
	}
	next, _ := json.Marshal(page.Next) // a string always encodes
	b.WriteString(`],"next_cursor":`)
	b.Write(next)
	b.WriteString("}\n")
	return b.Bytes()
}

// tenantEvents is GET /v1/events: the caller tenant's own usage events.
func (s *API) tenantEvents(c echo.Context) error {
	p, _, err := feedParams(c, false)
	if err != nil {
		return err
	}
	page, err := s.Events.Tenant(c.Request().Context(), keyRecord(c).TenantID, p)
	return writeEvents(c, page, err)
}

// adminEvents is GET /v1/admin/events: every tenant's usage events, or one tenant's
// (tenant=), for finance.
func (s *API) adminEvents(c echo.Context) error {
	p, tenant, err := feedParams(c, true)
	if err != nil {
		return err
	}
	page, err := s.Events.All(c.Request().Context(), tenant, p)
	return writeEvents(c, page, err)
}
