package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/agentqtype"
)

// Error codes of the error body.
const (
	CodeInvalidJSON         = "INVALID_JSON"
	CodeInvalidRequest      = "INVALID_REQUEST"
	CodePayloadTooLarge     = "PAYLOAD_TOO_LARGE"
	CodeUnauthorized        = "UNAUTHORIZED"
	CodeScopeForbidden      = "SCOPE_FORBIDDEN"
	CodeRoleForbidden       = "ROLE_FORBIDDEN"
	CodeTenantSuspended     = "TENANT_SUSPENDED"
	CodeNotFound            = "NOT_FOUND"
	CodeMethodNotAllowed    = "METHOD_NOT_ALLOWED"
	CodeUnknownAgent        = "UNKNOWN_AGENT"
	CodeIdempotencyConflict = "IDEMPOTENCY_CONFLICT"
	CodeConflict            = "CONFLICT"
	CodeTaskFinished        = "TASK_ALREADY_FINISHED"
	CodeTaskNotPaused       = "TASK_NOT_PAUSED"
	CodeResumeNeedsRoom     = "RESUME_NEEDS_ROOM"
	CodeTaskHandOff         = "TASK_HANDOFF_IN_PROGRESS"
	CodeUnsupportedMedia    = "UNSUPPORTED_MEDIA_TYPE"
	CodeInternal            = "INTERNAL"
	CodeUnavailable         = "SERVICE_UNAVAILABLE"
)

// APIError is the error body: {"error":{"code","message",...}}. Extra carries the
// fields some codes add (limit_type, retry_after_seconds, ...).
type APIError struct {
	Status  int            `json:"-"`
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Extra   map[string]any `json:"-"`
}

func (e *APIError) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// Errorf is an error body with a message made as fmt.Sprintf makes it.
func Errorf(status int, code, format string, args ...any) *APIError {
	return &APIError{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

func (e *APIError) body() map[string]any {
	inner := map[string]any{"code": e.Code, "message": e.Message}
	for k, v := range e.Extra {
		inner[k] = v
	}
	return map[string]any{"error": inner}
}

// ErrorHandler renders every error, including echo's own (404 route, 405), with the
// documented body. Internal errors are logged to log, never shown.
func ErrorHandler(log *slog.Logger) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) { renderError(log, err, c) }
}

func renderError(log *slog.Logger, err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var ae *APIError
	var he *echo.HTTPError
	switch {
	case errors.As(err, &ae):
	case errors.As(err, &he):
		switch he.Code {
		case http.StatusNotFound:
			ae = Errorf(http.StatusNotFound, CodeNotFound, "No route for %s %s.", c.Request().Method, c.Request().URL.Path)
		case http.StatusMethodNotAllowed:
			ae = Errorf(http.StatusMethodNotAllowed, CodeMethodNotAllowed, "Method %s is not allowed on %s.", c.Request().Method, c.Request().URL.Path)
		case http.StatusRequestEntityTooLarge:
			ae = tooLarge()
		case http.StatusUnsupportedMediaType:
			ae = Errorf(he.Code, CodeUnsupportedMedia, "Send JSON with Content-Type: application/json.")
		default:
			ae = Errorf(he.Code, CodeInvalidRequest, "%v", he.Message)
		}
	case refusedValue(err):
		log.Warn("Postgres refused a value of the request; input validation let it through", "method", c.Request().Method, "path", c.Path(), "err", err)
		ae = Errorf(http.StatusBadRequest, CodeInvalidRequest, "A value in the request cannot be stored (bad encoding, NUL, or out of range).")
	case unreachable(err):
		log.Warn("a backing service is unreachable", "method", c.Request().Method, "path", c.Path(), "err", err)
		ae = Unavailable()
	default:
		log.Error("request failed", "method", c.Request().Method, "path", c.Path(), "err", err)
		ae = Errorf(http.StatusInternalServerError, CodeInternal, "Internal error; it has been logged.")
	}
	if ra, ok := ae.Extra["retry_after_seconds"]; ok && c.Response().Header().Get("Retry-After") == "" {
		c.Response().Header().Set("Retry-After", fmt.Sprint(ra))
	}
	if c.Request().Method == http.MethodHead {
		_ = c.NoContent(ae.Status)
		return
	}
	_ = c.JSON(ae.Status, ae.body())
}

// unreachable tells a backing service that cannot be reached (Postgres restarting, a
// dropped connection, a timeout) from a real internal error: the first is a 503 the
// client retries, the second a 500. The store marks its own (ErrUnavailable); the
// rest are the network's and the context's, as Redis's calls return them.
func unreachable(err error) bool {
	var netErr net.Error
	return errors.Is(err, agentqtype.ErrUnavailable) || errors.As(err, &netErr) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed)
}

// refusedValue tells Postgres refusing a value as data (bad encoding, NUL, a number or
// nesting it cannot hold). Requests are validated before anything is stored, so this
// is the safety net for what validation misses: the client's input, not a 500.
func refusedValue(err error) bool { return errors.Is(err, agentqtype.ErrValueRefused) }

// Unavailable is the 503 of a backing service that did not answer.
func Unavailable() *APIError {
	e := Errorf(http.StatusServiceUnavailable, CodeUnavailable, "A backing service is unavailable. Retry in 1 second.")
	e.Extra = map[string]any{"retry_after_seconds": 1}
	return e
}

func tooLarge() *APIError {
	return Errorf(http.StatusRequestEntityTooLarge, CodePayloadTooLarge, "Request body exceeds %d bytes.", maxBodyBytes)
}
