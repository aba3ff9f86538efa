package admission

import (
	"context"
	"math"
	"time"

	"golang.org/x/time/rate"

	"github.com/agentq/agentq/quotas"
)

// TakeBucket takes one token of the bucket at key, in Redis, or, while Redis is
// unreachable, of this process's own bucket. The error is only the caller's own
// (its context ended).
func (g *Guard) TakeBucket(ctx context.Context, key string, b quotas.Bucket) (quotas.BucketAnswer, error) {
	return g.bucket(ctx, key, b, true)
}

// PeekBucket says whether the bucket at key has a token, taking none.
func (g *Guard) PeekBucket(ctx context.Context, key string, b quotas.Bucket) (quotas.BucketAnswer, error) {
	return g.bucket(ctx, key, b, false)
}

func (g *Guard) bucket(ctx context.Context, key string, b quotas.Bucket, take bool) (quotas.BucketAnswer, error) {
	try, probe := g.br.allow()
	if !try {
		return g.localBucket(key, b, take), nil
	}
	cctx, cancel := context.WithTimeout(ctx, g.timeout)
	a, err := g.buckets.Bucket(cctx, key, b, take)
	cancel()
	if err == nil {
		g.br.record(true, probe)
		return a, nil
	}
	if ctx.Err() != nil {
		g.br.abandon(probe)
		return quotas.BucketAnswer{}, ctx.Err()
	}
	g.br.record(false, probe)
	g.log.Debug("bucket call failed; answered in process", "err", err)
	return g.localBucket(key, b, take), nil
}

// localBucket is the bucket in this process, at Rate ÷ replicas.
func (g *Guard) localBucket(key string, b quotas.Bucket, take bool) quotas.BucketAnswer {
	n := float64(max(g.replicas.Load(), 1))
	r := rate.Limit(b.Rate / n)
	burst := max(1, int(math.Floor(float64(b.Burst)/n)))
	id := "b:" + key
	a := quotas.LocalBucket(g.localLimiter(id, r, burst), time.Now(), take)
	a.Degraded = true
	return a
}

// localLimiter is this process's limiter id at rate r and burst: the one it has, or a
// new one when it has none or the limit changed. A first limiter is added only if
// still absent, in one step: two callers at once would each make one, and the one
// overwritten would have let its own burst through.
func (g *Guard) localLimiter(id string, r rate.Limit, burst int) *rate.Limiter {
	lim, ok := g.local.Get(id)
	switch {
	case !ok:
		lim = rate.NewLimiter(r, burst)
		if prev, ok, _ := g.local.PeekOrAdd(id, lim); ok && prev.Limit() == r && prev.Burst() == burst {
			return prev
		}
	case lim.Limit() != r || lim.Burst() != burst:
		lim = rate.NewLimiter(r, burst)
		g.local.Add(id, lim)
	}
	return lim
}
