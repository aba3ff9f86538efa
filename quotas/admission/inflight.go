package admission

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/internal/script"
)

// RequestLeases are the requests' leases that inflight_requests counts, one per open
// API request (the Guard takes and releases them).
type RequestLeases struct{ conn }

// inflightScript takes one of a tenant's inflight_requests slots for a request, if the
// tenant holds fewer than the limit. Expired leases (requests of a replica that died)
// are dropped only when the set is full, so the common case is one ZCARD and one ZADD.
// The set never holds more than limit members and lives as long as its newest lease.
//
// KEYS[1] request leases (zset)   ARGV[1] now ms or ""   ARGV[2] request id
// ARGV[3] limit (> 0)   ARGV[4] lease ttl ms
// Returns the number of leases held, this one included, or minus the number held when
// the tenant is at its limit (nothing taken).
var inflightScript = redisx.NewScript(script.Now + `
local limit, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local n = redis.call('ZCARD', KEYS[1])
if n >= limit then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  n = redis.call('ZCARD', KEYS[1])
  if n >= limit then return -n end
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl)
return n + 1
`)

// touchInflightScript pushes an open request's lease forward (long event streams).
//
// KEYS[1] request leases   ARGV[1] now ms or ""   ARGV[2] request id   ARGV[3] lease ttl ms
// Returns 1 if the lease was still held.
var touchInflightScript = redis.NewScript(script.Now + `
local n = redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[3]), ARGV[2])
if n > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return n
`)

// AcquireInflight takes an inflight_requests lease for request id. It returns the
// leases held (this one included), or ok=false and the number held when the tenant is
// at limit.
func (rl *RequestLeases) AcquireInflight(ctx context.Context, tenantID, id string, limit int64) (held int64, ok bool, err error) {
	return rl.acquireInflight(ctx, nil, tenantID, id, limit)
}

// acquireInflight is AcquireInflight, sent through batch when it is not nil (in a
// round trip shared with other requests').
func (rl *RequestLeases) acquireInflight(ctx context.Context, batch *redisx.Batch, tenantID, id string, limit int64) (held int64, ok bool, err error) {
	run := func(c redis.Scripter) *redis.Cmd {
		return inflightScript.Run(ctx, c, []string{rl.keys.InflightRequests(tenantID)}, rl.nowArg(), id, limit,
			quotas.InflightLeaseTTL.Milliseconds())
	}
	var cmd *redis.Cmd
	if batch != nil {
		err = batch.Do(ctx, func(pipe redis.Pipeliner) { cmd = run(pipe) })
	} else {
		cmd = run(rl.rdb)
	}
	var n int64
	if err == nil {
		n, err = cmd.Int64()
	}
	if err != nil {
		return 0, false, fmt.Errorf("quotas: acquire inflight request: %w", err)
	}
	if n < 0 {
		return -n, false, nil
	}
	return n, true, nil
}

// TouchInflight keeps a request's lease for another InflightLeaseTTL.
func (rl *RequestLeases) TouchInflight(ctx context.Context, tenantID, id string) error {
	err := touchInflightScript.Run(ctx, rl.rdb, []string{rl.keys.InflightRequests(tenantID)},
		rl.nowArg(), id, quotas.InflightLeaseTTL.Milliseconds()).Err()
	if err != nil {
		return fmt.Errorf("quotas: refresh inflight request: %w", err)
	}
	return nil
}

// ReleaseInflight frees a request's lease. Releasing twice is harmless.
func (rl *RequestLeases) ReleaseInflight(ctx context.Context, tenantID, id string) error {
	if err := rl.releaseInflight(ctx, rl.rdb, tenantID, id).Err(); err != nil {
		return fmt.Errorf("quotas: release inflight request: %w", err)
	}
	return nil
}

// releaseInflight sends (or queues, on a pipe) ReleaseInflight's command.
func (rl *RequestLeases) releaseInflight(ctx context.Context, c redis.Cmdable, tenantID, id string) *redis.IntCmd {
	return c.ZRem(ctx, rl.keys.InflightRequests(tenantID), id)
}

// requestIDs are unique per process without a random read per request: a random
// process prefix and a counter.
var (
	requestPrefix = func() string {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		return hex.EncodeToString(b) + ":"
	}()
	requestSeq atomic.Uint64
)

// AcquireInflight takes a lease of tenantID's inflight_requests limit for one request.
// Like session counts, the limit is not enforced while Redis is unreachable: the
// request is allowed and Degraded is set. A lease the answer of which was lost is
// released later.
func (g *Guard) AcquireInflight(ctx context.Context, tenantID string, limit int64) (quotas.InflightSlot, error) {
	s := quotas.InflightSlot{TenantID: tenantID, Limit: limit, Allowed: true}
	if limit <= 0 {
		return s, nil
	}
	s.ID = requestPrefix + strconv.FormatUint(requestSeq.Add(1), 36)
	try, probe := g.br.allow()
	if !try {
		s.Degraded = true
		return s, nil
	}
	cctx, cancel := context.WithTimeout(ctx, g.timeout)
	held, ok, err := g.q.acquireInflight(cctx, g.batch, tenantID, s.ID, limit)
	cancel()
	if err == nil {
		g.br.record(true, probe)
		s.Held, s.Allowed, s.Leased = held, ok, ok
		return s, nil
	}
	if ctx.Err() != nil { // the caller left; the script may have run all the same
		g.br.abandon(probe)
		g.releaseLater(releaseRequest, tenantID, s.ID)
		return s, ctx.Err()
	}
	g.br.record(false, probe)
	s.Degraded, s.Leased = true, true // the script may have run: release at the end
	return s, nil
}

// TouchInflight refreshes a long request's lease (event streams, every few seconds).
func (g *Guard) TouchInflight(ctx context.Context, s quotas.InflightSlot) {
	if !s.Leased || g.Degraded() {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, max(g.timeout, time.Second))
	defer cancel()
	if err := g.q.TouchInflight(cctx, s.TenantID, s.ID); err != nil {
		g.log.Warn("refreshing an open request's inflight lease failed", "err", err)
	}
}

// ReleaseInflight gives a request's lease back when the request ends. While Redis is
// unreachable the release is queued and retried, so it costs the request no timeout.
func (g *Guard) ReleaseInflight(ctx context.Context, s quotas.InflightSlot) {
	if !s.Leased {
		return
	}
	try, probe := g.br.allow()
	if !try {
		g.releaseLater(releaseRequest, s.TenantID, s.ID)
		return
	}
	outcome := func(err error) {
		if err == nil {
			g.br.record(true, probe)
			return
		}
		if ctx.Err() != nil {
			g.br.abandon(probe)
		} else {
			g.br.record(false, probe)
		}
		g.releaseLater(releaseRequest, s.TenantID, s.ID)
	}
	if g.batch != nil {
		// The response need not wait for its slot's release: it goes out after it,
		// with the other requests' releases of the moment, in one round trip.
		g.batch.Go(ctx, func(pipe redis.Pipeliner) { g.q.releaseInflight(ctx, pipe, s.TenantID, s.ID) }, outcome)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, g.timeout)
	err := g.q.ReleaseInflight(cctx, s.TenantID, s.ID)
	cancel()
	outcome(err)
}

// ReleaseInflightAlong gives a request's lease back in the round trip of another call
// of the request (a submission's queue push): along queues the release on that call's
// pipe, and done, called once the call has returned, queues a retry when the release
// was not answered. A slot with no lease gives a nil along.
func (g *Guard) ReleaseInflightAlong(ctx context.Context, s quotas.InflightSlot) (along func(pipe redis.Pipeliner), done func()) {
	if !s.Leased {
		return nil, func() {}
	}
	var cmd *redis.IntCmd
	along = func(pipe redis.Pipeliner) { cmd = g.q.releaseInflight(ctx, pipe, s.TenantID, s.ID) }
	done = func() {
		if cmd == nil || cmd.Err() != nil {
			g.releaseLater(releaseRequest, s.TenantID, s.ID)
		}
	}
	return along, done
}
