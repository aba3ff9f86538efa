package api

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/web/internal/webtest"
)

// TestPostgresRefusalOfAValueIsA400: should a value that input validation missed
// reach Postgres and be refused as data (NUL, bad encoding, a number out of range,
// nesting too deep), the store says so (agentqtype.ErrValueRefused; its test holds
// Postgres's own errors to it) and the answer is a 400 with the error body, never a
// 500. A backing service the store cannot reach is a 503 the client retries.
func TestPostgresRefusalOfAValueIsA400(t *testing.T) {
	handle := ErrorHandler(webtest.Quiet())
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
		handle(c.err, e.NewContext(httptest.NewRequest(http.MethodPost, "/v1/tasks", nil), rec))
		var eb struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if json.Unmarshal(rec.Body.Bytes(), &eb); rec.Code != c.status || eb.Error.Code != c.code || eb.Error.Message == "" {
			t.Errorf("%v: %d %s, want %d %s", c.err, rec.Code, rec.Body.String(), c.status, c.code)
		}
	}
}

// A resume that meets the pausing worker's hand-off is a 409 TASK_HANDOFF_IN_PROGRESS
// with Retry-After: the client retries, nothing changed.
func TestResumeDuringTheHandOffIsARetryable409(t *testing.T) {
	s := New(Deps{Logger: webtest.Quiet()})
	id := uuid.Must(uuid.NewV7())
	rec := httptest.NewRecorder()
	err := s.taskErr(fmt.Errorf("resume: %w", &tasks.HandOffError{ID: id}), &id)
	ErrorHandler(s.log)(err, echo.New().NewContext(httptest.NewRequest(http.MethodPost, "/v1/tasks/"+id.String()+"/resume", nil), rec))
	var eb struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if json.Unmarshal(rec.Body.Bytes(), &eb); rec.Code != http.StatusConflict || eb.Error.Code != CodeTaskHandOff || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("%d %s Retry-After %q, want 409 %s with Retry-After 1", rec.Code, rec.Body, rec.Header().Get("Retry-After"), CodeTaskHandOff)
	}
}
