// Package capacity holds agentq's token capacity in Redis: the buckets a step's
// tokens are reserved from before it runs, and their settlement after it.
//
// A step draws on two buckets: its tenant's ai_tokens_per_minute and, when its agent
// is bound to one, a model pool shared by every tenant. A reservation takes the step's estimate; settling after the
// step refunds what it did not use or carries its excess as debt (the bucket's level
// goes below zero), so a bucket never lets through more than its burst and rate by
// more than the largest single step's excess.
//
// A pool shares its capacity in weighted fair order when tenants wait on it: stride
// scheduling in tokens, the scheduler's idea applied to the pool. Each tenant has a
// pass (tokens used ÷ weight: a grant moves it by the estimate, the settlement by
// the rest, both at the weight the grant recorded) in the pool's virtual time; only a
// tenant whose pass is at or before every other waiting tenant's is served, and a
// tenant coming back from idleness starts at the virtual time, so it banks no credit. A tenant with
// several steps waiting (several workers) keeps its place in line when one of them is
// granted, at its new pass, until the last of the others is due back: otherwise a
// tenant further back is served between its asks, the virtual time passes it, and it
// loses what it was owed. A tenant that has been drawing at or past the line (its
// pass has caught up with the virtual time) also leaves one step's worth in the
// bucket while others wait: that reserve is what lets a light tenant, whose pass lags
// behind, be served at once in a saturated pool. An uncontended pool gives everything
// it has to whoever asks.
//
// The pool's effective rate adapts to its upstream (ThrottlePool): an upstream's
// refusal of one tenant's step holds that tenant back; the pool is lowered only on
// evidence across tenants, to the rate the upstream was measured to serve, and its
// bucket to what the retry time says is left upstream. It climbs back once nothing
// has been throttled for 2 s, slowly near the rate it learned, never above the
// configured rate.
//
// It also keeps the plain GCRA buckets that guard what is no tenant's API limit
// (Buckets.Bucket). Its words (PoolConfig, TokenAnswer, the params) are package
// quotas's, so that callers that only name them need no Redis; what it shares with
// quotas/admission's step reservation (the clock, the tenant bucket's Lua) is in
// quotas/internal/script.
package capacity

import (
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/quotas/internal/script"
)

// conn is what the buckets and the pools run on: the Redis, its keys and the clock
// their scripts decide by.
type conn struct {
	rdb   redis.UniversalClient
	keys  rkeys.Keys
	clock script.Clock
}

func (c *conn) nowArg() string { return c.clock.Arg() }
