package web

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/agentqtype"
)

// TestPostgresRefusalOfAValueIsA400: should a value that input validation missed
// reach Postgres and be refused as data (NUL, bad encoding, a number out of range,
// nesting too deep), the store says so (agentqtype.ErrValueRefused; its test holds
// Postgres's own errors to it) and the answer is a 400 with the error body, never a
// 500. A backing service the store cannot reach is a 503 the client retries.
func TestPostgresRefusalOfAValueIsA400(t *testing.T) {
	s := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	e := echo.New()
	for _, c := range []struct {
		err    error
		status int
		code   string
	}{
		{fmt.Errorf("insert task: %w", agentqtype.ErrValueRefused), http.StatusBadRequest, CodeInvalidRequest},
		{fmt.Errorf("insert task: %w", agentqtype.ErrUnavailable), http.StatusServiceUnavailable, CodeUnavailable},
		{fmt.Errorf("insert task: %w", io.ErrUnexpectedEOF), http.StatusServiceUnavailable, CodeUnavailable},
		{fmt.Errorf("insert task: something else"), http.StatusInternalServerError, CodeInternal},
	} {
		rec := httptest.NewRecorder()
		s.errorHandler(c.err, e.NewContext(httptest.NewRequest(http.MethodPost, "/v1/tasks", nil), rec))
		var eb struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if json.Unmarshal(rec.Body.Bytes(), &eb); rec.Code != c.status || eb.Error.Code != c.code || eb.Error.Message == "" {
			t.Errorf("%v: %d %s, want %d %s", c.err, rec.Code, rec.Body.String(), c.status, c.code)
		}
	}
}
