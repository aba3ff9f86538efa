// Package adminauth resolves a presented admin token to its named credential and
// role (package credentials), for the admin API (/v1/admin/…) and the operator view's
// sign-in alike, and limits wrong tokens per client address.
//
// One bucket per address: a burst of FailureBucket.Burst wrong tokens, then one a
// second. The bucket lives in Redis (quotas.Bucket, key rkeys.AuthFailures), so every
// replica counts into the same one and spreading guesses over replicas wins nothing;
// while Redis is unreachable each replica keeps its own at the bucket's rate ÷
// replicas, as the degraded admission buckets do. A Guard without the admission guard
// (tests, tools) keeps its own.
//
// Only wrong tokens count. The token is resolved first (the environment's credentials
// compared in constant time, stored ones found by hash) without answering; then one
// atomic step decides: a wrong token takes a token of the bucket
// (and is answered 401, or 429 when there was none), a right one only looks whether
// the bucket has one. So concurrent wrong guesses cannot all pass a check made before
// any of them is counted, and while an address is refused the right token is refused
// too — otherwise the 200 would tell a right guess from the 429s. Right tokens take
// nothing: admin traffic, however heavy, is never limited, and an address that
// guessed wrong is served again within a second of its last refused guess. A request
// without a token guesses nothing and is answered 401 without counting.
//
// IPv6 clients are counted per /64, which one host usually holds whole.
package adminauth

import (
	"context"
	"errors"
	"math"
	"net"
	"net/http"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"

	"github.com/agentq/agentq/internal/credentials"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
)

// FailureBucket is the wrong admin tokens one client address may send.
var FailureBucket = quotas.Bucket{Rate: 1, Burst: 10}

// MaxTokenBytes bounds an admin token: a longer one is wrong without being compared.
const MaxTokenBytes = credentials.MaxTokenBytes

// Guard resolves admin tokens and counts the wrong ones.
type Guard struct {
	creds     *credentials.Service // nil: no credential, every token is wrong
	admission *admission.Guard
	fails     *lru.Cache[string, *rate.Limiter]
}

// New is the Guard over creds (nil: admin access off); admission holds the shared
// failure buckets (nil: this process keeps its own).
func New(creds *credentials.Service, admission *admission.Guard) *Guard {
	g := &Guard{creds: creds, admission: admission}
	g.fails, _ = lru.New[string, *rate.Limiter](4096)
	return g
}

// On reports whether admin access is on: some credential exists, in the environment
// or stored.
func (g *Guard) On(ctx context.Context) (bool, error) {
	if g.creds == nil {
		return false, nil
	}
	return g.creds.Configured(ctx)
}

// Resolve is the live credential a presented token is; ok is false for a wrong token.
// An error is a lookup that failed: nothing is decided, and nothing should be counted.
func (g *Guard) Resolve(ctx context.Context, token string) (c credentials.Credential, ok bool, err error) {
	if g.creds == nil || len(token) > MaxTokenBytes {
		return c, false, nil
	}
	c, err = g.creds.Authenticate(ctx, token)
	if errors.Is(err, credentials.ErrInvalid) {
		return c, false, nil
	}
	return c, err == nil, err
}

// Lookup is the live credential called name (the operator view's sessions name theirs);
// ok is false when there is none.
func (g *Guard) Lookup(ctx context.Context, name string) (c credentials.Credential, ok bool, err error) {
	if g.creds == nil {
		return c, false, nil
	}
	c, err = g.creds.Lookup(ctx, name)
	if errors.Is(err, credentials.ErrInvalid) {
		return c, false, nil
	}
	return c, err == nil, err
}

// Attempt books one admin token attempt of the request's address: ok says whether
// the token was right. It answers whether the request may go on.
func (g *Guard) Attempt(ctx context.Context, r *http.Request, ok bool) (quotas.BucketAnswer, error) {
	addr := addrKey(r)
	if g.admission == nil {
		return quotas.LocalBucket(g.limiter(addr), time.Now(), !ok), nil
	}
	key := g.admission.Quotas().Keys().AuthFailures(addr)
	if ok {
		return g.admission.PeekBucket(ctx, key, FailureBucket)
	}
	return g.admission.TakeBucket(ctx, key, FailureBucket)
}

func (g *Guard) limiter(addr string) *rate.Limiter {
	if l, ok := g.fails.Get(addr); ok {
		return l
	}
	// Added only if absent, in one step: two first failures at once would each make a
	// limiter, and the one overwritten would have let its own burst through.
	l := rate.NewLimiter(rate.Limit(FailureBucket.Rate), FailureBucket.Burst)
	if prev, ok, _ := g.fails.PeekOrAdd(addr, l); ok {
		return prev
	}
	return l
}

// RetryAfter is how long a refused address waits, in whole seconds, at least 1.
func RetryAfter(a quotas.BucketAnswer) int64 { return max(1, int64(math.Ceil(a.RetryAfter.Seconds()))) }

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

func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
