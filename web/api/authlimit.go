package api

import (
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/quotas"
)

// AdminAuthFailures is the limit_type of the refusal of an address that sent too many
// wrong admin tokens (package adminauth).
const AdminAuthFailures = "admin_auth_failures"

// authFailureRefusal is the 429 of an address refused for its wrong admin tokens.
func authFailureRefusal(c echo.Context, a quotas.BucketAnswer) *APIError {
	return BucketRefusal(c, a, AdminAuthFailures, "Too many wrong admin tokens from this address.")
}

// BucketRefusal is the 429 of a request a token bucket refused: msg says which,
// limitType names it in the body, and the body and Retry-After say when to retry.
func BucketRefusal(c echo.Context, a quotas.BucketAnswer, limitType, msg string) *APIError {
	ra := max(1, ceilSeconds(a.RetryAfter))
	c.Response().Header().Set("Retry-After", strconv.FormatInt(ra, 10))
	e := Errorf(http.StatusTooManyRequests, "RATE_LIMIT_EXCEEDED", "%s Retry in %d second%s.", msg, ra, plural(ra))
	e.Extra = map[string]any{"limit_type": limitType, "retry_after_seconds": ra, "violated": []string{limitType}}
	return e
}
