package quotas

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/agentq/agentq/agentqtype"
)

// Token capacity's words: the tenant's ai_tokens_per_minute bucket and the model
// pools a step's tokens are reserved from before it runs (quotas/capacity holds the
// buckets themselves, in Redis).

// ErrNoCapacity is a reservation's configuration error: a bucket with no rate or
// burst can never grant anything, so the caller must not wait on it.
var ErrNoCapacity = errors.New("quotas: a token bucket needs a positive rate and burst")

// TokenAnswer is the answer to a reservation. When not Granted, Wait is how long until
// the capacity is expected (the step waits that long without holding a worker).
// Level is the bucket's level after a grant, in tokens (negative: in debt).
type TokenAnswer struct {
	Granted bool
	Wait    time.Duration
	Level   int64
	// EffectiveRate is a pool's effective rate at the answer, in tokens a minute (0
	// for a tenant's bucket).
	EffectiveRate int64
	// Throttled says a pool refused because the tenant is held back after its
	// upstream refused it (capacity.Pools.ThrottlePool): the step waits with ThrottleReason.
	Throttled bool
	// Unpaced says a pool granted while no tenant waited: the grant moved no pass, so
	// its settlement or give-back must move none either (PoolSettleParams.Unpaced).
	Unpaced bool
}

// TenantTokensParams names a tenant's ai_tokens_per_minute bucket and one step's
// tokens: the estimate to reserve, or in a settlement the actual use minus the
// estimate (negative refunds).
type TenantTokensParams struct {
	Tenant    string
	PerMinute int64 // the plan's ai_tokens_per_minute (> 0)
	Burst     int64 // tokens; 0: one minute's worth
	Tokens    int64
}

// Bucket is the bucket's rate and burst as the scripts take them (a burst of 0 is
// one minute's worth); ErrNoCapacity when it can grant nothing.
func (p TenantTokensParams) Bucket() (rate, burst int64, err error) {
	burst = p.Burst
	if burst <= 0 {
		burst = p.PerMinute
	}
	if p.PerMinute <= 0 || burst <= 0 {
		return 0, 0, ErrNoCapacity
	}
	return p.PerMinute, burst, nil
}

// TenantTokensState is a tenant's ai_tokens_per_minute bucket as the usage report
// shows it: Level is the tokens in it now (negative: in debt), Used what has been
// reserved from it and not yet refilled (burst − level, never below 0), FullIn how
// long until it is full again.
type TenantTokensState struct {
	Level  int64
	Used   int64
	FullIn time.Duration
}

// PoolConfig is a model pool's declared capacity.
type PoolConfig struct {
	Name              string
	TokensPerMinute   int64 // > 0
	BurstTokens       int64 // 0: one minute's worth; never more than that
	RequestsPerMinute int64 // 0: not limited
}

// Burst is the pool bucket's burst in tokens.
func (c PoolConfig) Burst() int64 {
	if c.BurstTokens <= 0 || c.BurstTokens > c.TokensPerMinute {
		return c.TokensPerMinute
	}
	return c.BurstTokens
}

// Check refuses a pool that cannot be reserved from: a name Redis keys cannot hold,
// or no capacity.
func (c PoolConfig) Check() error {
	if c.Name == "" || strings.ContainsAny(c.Name, "{}") {
		return fmt.Errorf("quotas: pool name %q", c.Name)
	}
	if c.TokensPerMinute <= 0 || c.RequestsPerMinute < 0 {
		return ErrNoCapacity
	}
	return nil
}

// PoolBinding is the model pool an agent's steps draw on, with the tokens a step is
// estimated at before anything better is known.
type PoolBinding struct {
	Pool          PoolConfig
	TokensPerStep int64
}

// WaitReason is the wait_reason of a step waiting for the pool.
func (c PoolConfig) WaitReason() agentqtype.WaitReason { return agentqtype.WaitPool(c.Name) }

// ThrottleReason is the wait_reason of a step waiting after the pool's upstream
// refused it, or while its tenant is held back for such a refusal.
func (c PoolConfig) ThrottleReason() agentqtype.WaitReason { return agentqtype.WaitThrottled(c.Name) }

// PoolReserveParams is one step's reservation from a pool.
type PoolReserveParams struct {
	Pool   PoolConfig
	Tenant string
	Weight int   // the tenant's weight, as in the scheduler (>= 1)
	Tokens int64 // the step's estimate
}

// PoolSettleParams settles one step against its pool: Tokens is its actual use minus
// its estimate (negative refunds). It names no weight: the settlement moves the
// tenant's pass at the weight its reservation wrote.
type PoolSettleParams struct {
	Pool   PoolConfig
	Tenant string
	Tokens int64
	// Unpaced settles or gives back a grant that moved no pass (TokenAnswer.Unpaced):
	// the tokens and the request only.
	Unpaced bool
}

// PoolThrottleParams is an upstream's refusal of one tenant's step.
type PoolThrottleParams struct {
	Pool       PoolConfig
	Tenant     string
	Tokens     int64         // the refused step's estimate
	RetryAfter time.Duration // the upstream's retry time
}

// PoolThrottle is what a refusal did: the pool's effective rate after it, how long the
// tenant is held back from the pool (at least the retry time), and whether the pool
// itself was lowered (the refusal was evidence across tenants).
type PoolThrottle struct {
	EffectiveRate int64 // tokens a minute
	Backoff       time.Duration
	PoolWide      bool
}

// PoolWaiter is a tenant waiting on a pool, with its share of the pool among the
// waiting tenants (its weight over theirs).
type PoolWaiter struct {
	Tenant string
	Weight int
	Share  float64
}

// PoolStatus is a pool's state as the operator view shows it.
type PoolStatus struct {
	Level            int64 // tokens in the bucket now (negative: in debt)
	EffectiveRate    int64 // tokens a minute
	UsedLastMinute   int64 // tokens granted (and settled) in the last 60 s
	LastThrottledAgo time.Duration
	Throttled        bool // throttled answers lowered the pool in the last minute
	Waiting          []PoolWaiter
}
