package quotas

import (
	"time"

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
