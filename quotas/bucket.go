package quotas

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"
)

// Bucket is a token bucket guarding something that is not a tenant's API limit: the
// wrong admin tokens of one client address, the requests of one tenant panel link.
// Rate tokens come back per second, up to Burst.
type Bucket struct {
	Rate  float64
	Burst int
}

// BucketAnswer says whether a bucket had a token and, when it had none, how long
// until it has one. Degraded: Redis was unreachable and the answer came from this
// process's own bucket (at Rate ÷ replicas, like the degraded admission buckets).
type BucketAnswer struct {
	Allowed    bool
	RetryAfter time.Duration
	Degraded   bool
}

// bucketScript takes (or only looks for) one token of a GCRA bucket kept in one
// STRING: the bucket's theoretical arrival time. Taking and deciding are one step, so
// callers running at the same moment cannot all see the last token. A bucket that is
// full again has expired.
//
// KEYS[1] bucket (string, ms)   ARGV[1] now ms or ""   ARGV[2] emission interval ms
// ARGV[3] burst (>= 1)   ARGV[4] "1" takes a token, "0" only looks whether there is one
// Returns {1, 0} when there is (was) a token, {0, ms until there is one} when not.
var bucketScript = redis.NewScript(luaNow + `
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
func (q *Quotas) Bucket(ctx context.Context, key string, b Bucket, take bool) (BucketAnswer, error) {
	if b.Rate <= 0 || b.Burst < 1 {
		return BucketAnswer{}, fmt.Errorf("quotas: bucket %v: rate and burst must be positive", b)
	}
	flag := "0"
	if take {
		flag = "1"
	}
	interval := 1000 / b.Rate
	res, err := bucketScript.Run(ctx, q.rdb, []string{key}, q.nowArg(),
		strconv.FormatFloat(interval, 'f', -1, 64), b.Burst, flag).Int64Slice()
	if err != nil {
		return BucketAnswer{}, fmt.Errorf("quotas: bucket: %w", err)
	}
	if len(res) != 2 {
		return BucketAnswer{}, fmt.Errorf("quotas: bucket: unexpected reply %v", res)
	}
	return BucketAnswer{Allowed: res[0] == 1, RetryAfter: time.Duration(res[1]) * time.Millisecond}, nil
}

// TakeBucket takes one token of the bucket at key, in Redis, or, while Redis is
// unreachable, of this process's own bucket. The error is only the caller's own
// (its context ended).
func (g *Guard) TakeBucket(ctx context.Context, key string, b Bucket) (BucketAnswer, error) {
	return g.bucket(ctx, key, b, true)
}

// PeekBucket says whether the bucket at key has a token, taking none.
func (g *Guard) PeekBucket(ctx context.Context, key string, b Bucket) (BucketAnswer, error) {
	return g.bucket(ctx, key, b, false)
}

func (g *Guard) bucket(ctx context.Context, key string, b Bucket, take bool) (BucketAnswer, error) {
	try, probe := g.br.allow()
	if !try {
		return g.localBucket(key, b, take), nil
	}
	cctx, cancel := context.WithTimeout(ctx, g.timeout)
	a, err := g.q.Bucket(cctx, key, b, take)
	cancel()
	if err == nil {
		g.br.record(true, probe)
		return a, nil
	}
	if ctx.Err() != nil {
		g.br.abandon(probe)
		return BucketAnswer{}, ctx.Err()
	}
	g.br.record(false, probe)
	g.log.Debug("bucket call failed; answered in process", "err", err)
	return g.localBucket(key, b, take), nil
}

// localBucket is the bucket in this process, at Rate ÷ replicas.
func (g *Guard) localBucket(key string, b Bucket, take bool) BucketAnswer {
	n := float64(max(g.replicas.Load(), 1))
	r := rate.Limit(b.Rate / n)
	burst := max(1, int(math.Floor(float64(b.Burst)/n)))
	id := "b:" + key
	lim, ok := g.local.Get(id)
	if !ok || lim.Limit() != r || lim.Burst() != burst {
		lim = rate.NewLimiter(r, burst)
		g.local.Add(id, lim)
	}
	a := LocalBucket(lim, time.Now(), take)
	a.Degraded = true
	return a
}

// LocalBucket answers a bucket kept in this process, lim, at now: take takes a token
// when there is one, otherwise it only looks whether there is one. A refusal says
// when a token is there again.
func LocalBucket(lim *rate.Limiter, now time.Time, take bool) BucketAnswer {
	if take {
		res := lim.ReserveN(now, 1)
		if d := res.DelayFrom(now); d > 0 {
			res.CancelAt(now)
			return BucketAnswer{RetryAfter: d}
		}
		return BucketAnswer{Allowed: true}
	}
	if tokens := lim.TokensAt(now); tokens < 1 {
		return BucketAnswer{RetryAfter: time.Duration((1 - tokens) / float64(lim.Limit()) * float64(time.Second))}
	}
	return BucketAnswer{Allowed: true}
}
