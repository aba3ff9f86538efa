package web

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/internal/testenv"
)

// TestPostgresRefusalOfAValueIsA400: should a value that input validation missed
// reach Postgres and be refused as data (NUL, bad encoding, a number out of range,
// nesting too deep), the answer is a 400 with the error body, never a 500. The errors
// are Postgres's own, produced on the real server.
func TestPostgresRefusalOfAValueIsA400(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := context.Background()
	s := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	e := echo.New()
	for _, c := range []struct {
		name, sql string
		arg       any
	}{
		{"NUL in text", `SELECT $1::text`, "a\x00b"},
		{"NUL escape in jsonb", `SELECT $1::jsonb`, `{"a":"\u0000"}`},
		{"invalid UTF-8", `SELECT $1::text`, "a\xffb"},
		{"lone surrogate in jsonb", `SELECT $1::jsonb`, `{"a":"\ud800"}`},
		{"number beyond numeric in jsonb", `SELECT $1::jsonb`, `{"n":1e1000000}`},
		{"nesting too deep", `SELECT $1::jsonb`, strings.Repeat("[", 100000) + strings.Repeat("]", 100000)},
	} {
		var out any
		err := pool.QueryRow(ctx, c.sql, c.arg).Scan(&out)
		if err == nil {
			t.Fatalf("%s: Postgres took it", c.name)
		}
		rec := httptest.NewRecorder()
		s.errorHandler(err, e.NewContext(httptest.NewRequest(http.MethodPost, "/v1/tasks", nil), rec))
		var eb struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if json.Unmarshal(rec.Body.Bytes(), &eb); rec.Code != http.StatusBadRequest || eb.Error.Code != CodeInvalidRequest || eb.Error.Message == "" {
			t.Errorf("%s (%v): %d %s, want 400 %s", c.name, err, rec.Code, rec.Body.String(), CodeInvalidRequest)
		}
	}
}
