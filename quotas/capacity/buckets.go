package capacity

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/internal/script"
)

// Buckets are the token buckets in Redis that are no model pool: a tenant's
// ai_tokens_per_minute, which a step reserves its estimated tokens from before it
// runs (the worker's step reservation takes it in the same call as the period quotas,
// quotas/admission), and the plain GCRA buckets that guard what is not a tenant's API
// limit (the wrong admin tokens of one client address, a tenant panel link's
// requests).
type Buckets struct{ conn }

// NewBuckets returns the buckets on rdb. nowMs, when not nil, replaces Redis TIME
// (tests).
func NewBuckets(rdb redis.UniversalClient, keys rkeys.Keys, nowMs func() int64) *Buckets {
	return &Buckets{conn{rdb: rdb, keys: keys, clock: script.Clock{NowMs: nowMs}}}
}

// bucketScript takes (or only looks for) one token of a GCRA bucket kept in one
// STRING: the bucket's theoretical arrival time. Taking and deciding are one step, so
// callers running at the same moment cannot all see the last token. A bucket that is
// full again has expired.
//
// KEYS[1] bucket (string, ms)   ARGV[1] now ms or ""   ARGV[2] emission interval ms
// ARGV[3] burst (>= 1)   ARGV[4] "1" takes a token, "0" only looks whether there is one
// Returns {1, 0} when there is (was) a token, {0, ms until there is one} when not.
var bucketScript = redis.NewScript(script.Now + `
local T, burst = tonumber(ARGV[2]), tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local wait = tat + T - T * burst - now
if wait > 0 then return {0, math.ceil(wait)} end
if ARGV[4] == '1' then
  tat = tat + T
  redis.call('SET', KEYS[1], string.format('%.17g', tat), 'PX', math.max(1, math.ceil(tat - now)))
end
return {1, 0}
`)

// Bucket takes one token of the bucket at key (take) or only looks whether it has
// one, in Redis.
func (b *Buckets) Bucket(ctx context.Context, key string, bucket quotas.Bucket, take bool) (quotas.BucketAnswer, error) {
	if bucket.Rate <= 0 || bucket.Burst < 1 {
		return quotas.BucketAnswer{}, fmt.Errorf("quotas: bucket %v: rate and burst must be positive", bucket)
	}
	flag := "0"
	if take {
		flag = "1"
	}
	interval := 1000 / bucket.Rate
	res, err := bucketScript.Run(ctx, b.rdb, []string{key}, b.nowArg(),
		strconv.FormatFloat(interval, 'f', -1, 64), bucket.Burst, flag).Int64Slice()
	if err != nil {
		return quotas.BucketAnswer{}, fmt.Errorf("quotas: bucket: %w", err)
	}
	if len(res) != 2 {
		return quotas.BucketAnswer{}, fmt.Errorf("quotas: bucket: unexpected reply %v", res)
	}
	return quotas.BucketAnswer{Allowed: res[0] == 1, RetryAfter: time.Duration(res[1]) * time.Millisecond}, nil
}

// reserveTenantTokensScript takes a step's estimate from a tenant's tokens-per-minute
// bucket when the bucket holds it (an estimate larger than the burst needs a full
// bucket and leaves it in debt).
//
// KEYS[1] tenant token bucket (hash)   ARGV[1] now ms or ""   ARGV[2] tokens a minute
// ARGV[3] burst tokens   ARGV[4] tokens asked
// Returns {1, level after} when granted, {0, ms until the ask fits} when not.
var reserveTenantTokensScript = redisx.NewScript(script.Now + script.TenantTokens + `
local burst = tonumber(ARGV[3])
local l, rate = tpm_load(1, tonumber(ARGV[2]), burst)
local ask = tonumber(ARGV[4])
local need = math.min(ask, burst)
if l < need then return {0, math.ceil((need - l) / rate)} end
l = l - ask
tpm_save(1, l, rate, burst)
return {1, math.floor(l)}
`)

// ReserveTenantTokens reserves p.Tokens from the tenant's ai_tokens_per_minute bucket.
func (b *Buckets) ReserveTenantTokens(ctx context.Context, p quotas.TenantTokensParams) (quotas.TokenAnswer, error) {
	rate, burst, err := p.Bucket()
	if err != nil {
		return quotas.TokenAnswer{}, err
	}
	res, err := reserveTenantTokensScript.Run(ctx, b.rdb, []string{b.keys.TenantTokens(p.Tenant)},
		b.nowArg(), rate, burst, max(p.Tokens, 0)).Int64Slice()
	if err != nil {
		return quotas.TokenAnswer{}, fmt.Errorf("quotas: reserve %s: %w", tenantTokensName, err)
	}
	return tokenAnswer(res, tenantTokensName)
}

// settleTenantTokensScript settles a step against its tenant's bucket: the actual
// tokens minus the estimate come off the level (a refund when negative, never past
// the burst; debt when positive).
//
// KEYS[1] tenant token bucket (hash)   ARGV[1] now ms or ""   ARGV[2] tokens a minute
// ARGV[3] burst tokens   ARGV[4] actual minus estimate
// Returns the level after, in tokens.
var settleTenantTokensScript = redisx.NewScript(script.Now + script.TenantTokens + `
local burst = tonumber(ARGV[3])
local l, rate = tpm_load(1, tonumber(ARGV[2]), burst)
l = math.min(burst, l - tonumber(ARGV[4]))
tpm_save(1, l, rate, burst)
return math.floor(l)
`)

// SettleTenantTokens settles one step: p.Tokens is its actual use minus its estimate.
func (b *Buckets) SettleTenantTokens(ctx context.Context, p quotas.TenantTokensParams) (level int64, err error) {
	rate, burst, err := p.Bucket()
	if err != nil {
		return 0, err
	}
	level, err = settleTenantTokensScript.Run(ctx, b.rdb, []string{b.keys.TenantTokens(p.Tenant)},
		b.nowArg(), rate, burst, p.Tokens).Int64()
	if err != nil {
		return 0, fmt.Errorf("quotas: settle %s: %w", tenantTokensName, err)
	}
	return level, nil
}

// TenantTokensLevel reads a tenant's ai_tokens_per_minute bucket without changing it,
// refilled to now. A bucket never reserved from (or expired, being full) is full.
// p.Tokens is not used.
func (b *Buckets) TenantTokensLevel(ctx context.Context, p quotas.TenantTokensParams) (quotas.TenantTokensState, error) {
	rate, burst, err := p.Bucket()
	if err != nil {
		return quotas.TenantTokensState{}, err
	}
	pipe := b.rdb.Pipeline()
	read := b.queueTenantTokensLevel(ctx, pipe, p.Tenant, rate, burst)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return quotas.TenantTokensState{}, fmt.Errorf("quotas: read %s: %w", tenantTokensName, err)
	}
	return read()
}

// QueueTenantTokensLevel queues TenantTokensLevel's read on pipe, for a caller that
// sends it with other reads in one round trip; the function returned gives its
// answer once pipe was sent.
func (b *Buckets) QueueTenantTokensLevel(ctx context.Context, pipe redis.Pipeliner, p quotas.TenantTokensParams) func() (quotas.TenantTokensState, error) {
	rate, burst, err := p.Bucket()
	if err != nil {
		return func() (quotas.TenantTokensState, error) { return quotas.TenantTokensState{}, err }
	}
	return b.queueTenantTokensLevel(ctx, pipe, p.Tenant, rate, burst)
}

func (b *Buckets) queueTenantTokensLevel(ctx context.Context, pipe redis.Pipeliner, tenant string, rate, burst int64) func() (quotas.TenantTokensState, error) {
	stCmd := pipe.HMGet(ctx, b.keys.TenantTokens(tenant), "l", "t")
	tCmd := pipe.Time(ctx)
	return func() (quotas.TenantTokensState, error) {
		for _, c := range []redis.Cmder{stCmd, tCmd} {
			if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
				return quotas.TenantTokensState{}, fmt.Errorf("quotas: read %s: %w", tenantTokensName, err)
			}
		}
		nowMs := tCmd.Val().UnixMilli()
		if b.clock.Fake() {
			nowMs = b.clock.NowMs()
		}
		return tenantTokensState(stCmd.Val(), rate, burst, nowMs), nil
	}
}

// tenantTokensState refills a bucket's stored level (l) from its time (t) to nowMs,
// as luaTenantTokensLoad does.
func tenantTokensState(vals []any, rate, burst, nowMs int64) quotas.TenantTokensState {
	num := func(i int) (float64, bool) {
		if i >= len(vals) {
			return 0, false
		}
		s, ok := vals[i].(string)
		if !ok {
			return 0, false
		}
		f, err := strconv.ParseFloat(s, 64)
		return f, err == nil
	}
	level := float64(burst)
	l, okL := num(0)
	t, okT := num(1)
	perMs := float64(rate) / tokensMinuteMs
	if okL && okT {
		level = l
		if float64(nowMs) > t {
			level = math.Min(float64(burst), l+(float64(nowMs)-t)*perMs)
		}
	}
	st := quotas.TenantTokensState{Level: int64(math.Floor(level)), Used: max(0, int64(math.Ceil(float64(burst)-level)))}
	if st.Used > 0 {
		st.FullIn = time.Duration(math.Ceil((float64(burst)-level)/perMs)) * time.Millisecond
	}
	return st
}

func tokenAnswer(res []int64, what string) (quotas.TokenAnswer, error) {
	if len(res) < 2 {
		return quotas.TokenAnswer{}, fmt.Errorf("quotas: %s: unexpected reply %v", what, res)
	}
	var a quotas.TokenAnswer
	if len(res) > 2 {
		a.EffectiveRate = res[2]
	}
	if res[0] == 1 {
		a.Granted, a.Level = true, res[1]
		a.Unpaced = len(res) > 3 && res[3] == 2
	} else {
		a.Wait = time.Duration(res[1]) * time.Millisecond
		a.Throttled = len(res) > 3 && res[3] == 1
	}
	return a, nil
}
