package web

// Wrong admin tokens are limited per client address, on the admin API (/v1/admin/…)
// and the operator view's sign-in alike: one bucket per address, a burst of
// adminFailureBucket.Burst wrong tokens, then one a second. The bucket lives in Redis
// (quotas.Bucket, key rkeys.AuthFailures), so every replica counts into the same one
// and spreading guesses over replicas wins nothing; while Redis is unreachable each
// replica keeps its own at the bucket's rate ÷ replicas, as the degraded admission
// buckets do. A server without the admission guard (tests, tools) keeps its own.
//
// Only wrong tokens count. The token is compared first, in constant time and without
// answering; then one atomic step decides: a wrong token takes a token of the bucket
// (and is answered 401, or 429 when there was none), a right one only looks whether
// the bucket has one. So concurrent wrong guesses cannot all pass a check made before
// any of them is counted, and while an address is refused the right token is refused
// too — otherwise the 200 would tell a right guess from the 429s. Right tokens take
// nothing: admin traffic, however heavy, is never limited, and an address that
// guessed wrong is served again within a second of its last refused guess. A request
// without a token guesses nothing and is answered 401 without counting.
//
// IPv6 clients are counted per /64, which one host usually holds whole.

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/quotas"
)

// adminFailureBucket is the wrong admin tokens one client address may send.
var adminFailureBucket = quotas.Bucket{Rate: 1, Burst: 10}

// AdminAuthFailures is the limit_type of the refusal of an address that sent too many
// wrong admin tokens.
const AdminAuthFailures = "admin_auth_failures"

// addrKey is the address a client is counted under: its IP, or its /64 for IPv6.
func addrKey(r *http.Request) string {
	host := clientAddr(r)
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	if ip.To4() == nil {
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	return ip.String()
}

// adminAttempt books one admin token attempt of the request's address: ok says
// whether the token was right. It answers whether the request may go on.
func (s *Server) adminAttempt(ctx context.Context, r *http.Request, ok bool) (quotas.BucketAnswer, error) {
	addr := addrKey(r)
	if s.Admission == nil {
		return s.opAuth.attempt(addr, ok), nil
	}
	key := s.Admission.Quotas().Keys().AuthFailures(addr)
	if ok {
		return s.Admission.PeekBucket(ctx, key, adminFailureBucket)
	}
	return s.Admission.TakeBucket(ctx, key, adminFailureBucket)
}

// attempt is adminAttempt in this process: a wrong token takes from the address's
// bucket, a right one only looks.
func (a *operatorAuth) attempt(addr string, ok bool) quotas.BucketAnswer {
	return quotas.LocalBucket(a.limiter(addr), time.Now(), !ok)
}

// authFailureRefusal is the 429 of an address refused for its wrong admin tokens.
func authFailureRefusal(c echo.Context, a quotas.BucketAnswer) *APIError {
	ra := max(1, ceilSeconds(a.RetryAfter))
	c.Response().Header().Set("Retry-After", strconv.FormatInt(ra, 10))
	e := apiErr(http.StatusTooManyRequests, "RATE_LIMIT_EXCEEDED",
		"Too many wrong admin tokens from this address. Retry in %d second%s.", ra, plural(ra))
	e.Extra = map[string]any{"limit_type": AdminAuthFailures, "retry_after_seconds": ra, "violated": []string{AdminAuthFailures}}
	return e
}
