package admission

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/riverqueue/river/rivershared/startstop"
	"golang.org/x/time/rate"

	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/capacity"
)

// Guard runs admissions against Redis with a short timeout and degrades when Redis is
// unreachable or slow: rate buckets fall back to in-process buckets at limit ÷ live
// API replicas, money/token/step quotas fail closed (ErrUnavailable), and session,
// backlog and inflight-request counts are not enforced while Redis is away.
//
// A failed call is answered by those degraded rules, but one failure does not switch
// the replica over: a circuit breaker skips Redis only after consecutive failures or a
// high failure rate (see breaker), for a cool-down, then probes it with one call. So
// a dead Redis costs no timeout per request, and one slow reply costs one request.
type Guard struct {
	startstop.BaseStartStop

	q        *Store
	buckets  *capacity.Buckets
	log      *slog.Logger
	timeout  time.Duration
	cooldown time.Duration
	id       string
	br       *breaker
	batch    *redisx.Batch
	now      func() time.Time // dates the refusals decided in process

	admissions admissionCounter

	replicas atomic.Int64
	local    *lru.Cache[string, *rate.Limiter]
	rejected localCounts // refusals decided in process, for the flush to Postgres

	mu    sync.Mutex
	later []pendingRelease // releases to retry once Redis answers again
}

type releaseKind int

const (
	releaseTask    releaseKind = iota // a task's session and long-running leases
	releaseRequest                    // a request's inflight_requests lease
)

type pendingRelease struct {
	kind           releaseKind
	tenant, member string
	after          time.Time // not before: a late script call runs first
}

// maxPendingReleases bounds the retry list; beyond it leases expire with their TTL.
const maxPendingReleases = 10000

// releaseLater frees a lease that a timed-out call may have taken in Redis after all
// (a task's, for a task that was not created; a request's): it is retried on every
// heartbeat until Redis answers, so a slow Redis cannot leak session slots.
func (g *Guard) releaseLater(kind releaseKind, tenant, member string) {
	// A call whose reply timed out may still be queued in Redis or in the batcher (at
	// most a timeout more); releasing before it runs would free nothing.
	after := time.Now().Add(max(time.Second, 2*g.timeout))
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.later) < maxPendingReleases {
		g.later = append(g.later, pendingRelease{kind, tenant, member, after})
	}
}

func (g *Guard) retryReleases(ctx context.Context) {
	g.mu.Lock()
	todo := g.later
	g.later = nil
	g.mu.Unlock()
	now := time.Now()
	var keep []pendingRelease
	for i, l := range todo {
		if now.Before(l.after) {
			keep = append(keep, l)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		var err error
		if l.kind == releaseRequest {
			err = g.q.ReleaseInflight(cctx, l.tenant, l.member)
		} else {
			_, err = g.q.Release(cctx, nil, l.tenant, l.member)
		}
		cancel()
		if err != nil { // Redis is still away: keep the rest for the next heartbeat
			keep = append(keep, todo[i:]...)
			break
		}
	}
	if len(keep) > 0 {
		g.mu.Lock()
		g.later = append(g.later, keep...)
		g.mu.Unlock()
	}
}

// GuardOptions configure a Guard.
type GuardOptions struct {
	Timeout  time.Duration // per admission call; default 50ms
	Cooldown time.Duration // how long to skip Redis once the breaker opens; default 1s
	ID       string        // this API replica's id
	// Archetype is where the guard logs and meters (agentq.admissions), and its
	// Clock dates the refusals decided in process (their minute); nil: the defaults.
	Archetype *baseservice.Archetype
	// Batch, when set, carries request slots' acquisitions and releases in round
	// trips shared with other requests, and releases each slot after its response;
	// nil sends each alone, and releases before the response. Its timeout should be
	// Timeout's; its owner closes it after the API stopped.
	Batch *redisx.Batch
}

// NewGuard wraps q.
func NewGuard(q *Store, o GuardOptions) *Guard {
	arch := o.Archetype.Defaults()
	g := &Guard{q: q, buckets: capacity.NewBuckets(q.rdb, q.keys, q.clock.NowMs), log: arch.Logger, timeout: o.Timeout, cooldown: o.Cooldown, id: o.ID, batch: o.Batch, now: arch.Clock}
	if g.timeout <= 0 {
		g.timeout = 50 * time.Millisecond
	}
	if g.cooldown <= 0 {
		g.cooldown = time.Second
	}
	g.br = &breaker{cooldown: g.cooldown, lasting: g.timeout, log: g.log}
	g.local, _ = lru.New[string, *rate.Limiter](100000)
	g.replicas.Store(1)
	g.admissions = newAdmissionCounter(arch.MeterProvider)
	return g
}

// Quotas returns the limit store the guard runs on.
func (g *Guard) Quotas() *Store { return g.q }

// Buckets returns the token buckets the guard takes from (TakeBucket), for the reads
// that only look at one (a tenant's ai_tokens_per_minute in its usage report).
func (g *Guard) Buckets() *capacity.Buckets { return g.buckets }

// Timeout is the deadline of each of admission's calls to Redis
// (AGENTQ_REDIS_TIMEOUT): the reads that only decorate an answer with what Redis
// holds have the same.
func (g *Guard) Timeout() time.Duration { return g.timeout }

// Degraded reports whether Redis is being skipped right now (the breaker is open, or
// half-open until a probe succeeds).
func (g *Guard) Degraded() bool { return g.br.openUntil.Load() != 0 }

// Admit runs p against Redis, or in degraded mode when Redis is unreachable.
// Decision.Degraded tells which. Counters Redis lost are rebuilt from the ledger
// before anything is decided on them; the rebuild reads Postgres, so it is bounded by
// its own timeout rather than the Redis one, and its failure is no Redis failure: it
// does not open the breaker, and the admission fails closed (ErrUnavailable).
func (g *Guard) Admit(ctx context.Context, p quotas.AdmitParams) (quotas.Decision, error) {
	var ans answer
	err := g.q.untilSeeded(ctx, p.TenantID, p.Period, func() (bool, error) {
		var err error
		ans, err = g.admitOnce(ctx, p)
		return ans.unseeded, err
	})
	if p.Mode == quotas.ModeAdmit {
		g.admissions.record(ctx, ans.d, err)
	}
	if err != nil {
		return quotas.Decision{}, err
	}
	return ans.d, nil
}

func (g *Guard) admitOnce(ctx context.Context, p quotas.AdmitParams) (answer, error) {
	try, probe := g.br.allow()
	if !try {
		d, err := g.inProcess(p)
		return answer{d: d}, err
	}
	cctx, cancel := context.WithTimeout(ctx, g.timeout)
	ans, err := g.q.admitRaw(cctx, p)
	cancel()
	if err == nil {
		g.br.record(true, probe)
		return ans, nil
	}
	if ctx.Err() != nil { // the caller left: that says nothing about Redis
		g.br.abandon(probe)
		g.mayHaveTaken(p)
		return answer{}, ctx.Err()
	}
	g.br.record(false, probe)
	g.log.Debug("admission call failed; answered in process", "err", err)
	d, err := g.inProcess(p)
	if err != nil || !d.Allowed {
		g.mayHaveTaken(p)
	}
	return answer{d: d}, err
}

// mayHaveTaken is called for an admission whose Redis call failed and whose task will
// not be created: the script may have run all the same and taken its leases.
func (g *Guard) mayHaveTaken(p quotas.AdmitParams) {
	if p.Mode == quotas.ModeAdmit && p.TaskID != "" {
		g.releaseLater(releaseTask, p.TenantID, p.TaskID)
	}
}

// Release frees a task's leases. While Redis is unreachable the release is queued and
// retried on the heartbeat rather than left to the lease TTL (hours).
func (g *Guard) Release(ctx context.Context, tenantID, taskID string) {
	try, probe := g.br.allow()
	if !try {
		g.releaseLater(releaseTask, tenantID, taskID)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, max(g.timeout, time.Second))
	defer cancel()
	if _, err := g.q.Release(cctx, nil, tenantID, taskID); err != nil {
		if ctx.Err() != nil {
			g.br.abandon(probe)
		} else {
			g.br.record(false, probe)
		}
		g.log.Warn("releasing session lease failed; retrying later", "task_id", taskID, "err", err)
		g.releaseLater(releaseTask, tenantID, taskID)
		return
	}
	g.br.record(true, probe)
}

// inProcess decides p in process (degraded) and counts what it refused.
func (g *Guard) inProcess(p quotas.AdmitParams) (quotas.Decision, error) {
	d, err := g.degraded(p)
	if err == nil {
		g.countLocal(p, d, g.now())
	}
	return d, err
}

func (g *Guard) degraded(p quotas.AdmitParams) (quotas.Decision, error) {
	l := p.Limits
	if p.Mode == quotas.ModePeek {
		return quotas.Decision{}, quotas.ErrUnavailable
	}
	if p.Mode == quotas.ModeAdmit && p.InScope && (l.StepsDaily >= 0 || l.TokensMonthly >= 0 || l.USDMonthlyMicro >= 0) {
		return quotas.Decision{}, quotas.ErrUnavailable
	}
	n := float64(max(g.replicas.Load(), 1))
	d := quotas.Decision{Allowed: true, Degraded: true}
	type bucket struct {
		name, id    string
		rate, burst float64
		per         time.Duration
	}
	buckets := []bucket{{quotas.KeyRate, "k:" + p.Kid, l.KeyRate, l.KeyBurst, time.Second}}
	if p.Mode == quotas.ModeAdmit && p.InScope {
		buckets = append(buckets,
			bucket{quotas.TenantRate, "t:" + p.TenantID, l.TenantRate, l.TenantBurst, time.Second},
			bucket{quotas.KeyAgentRate, "ka:" + p.Kid + ":" + p.Agent, l.KeyAgentRate, l.KeyAgentBurst, time.Second},
			bucket{quotas.UserTasksHourly, "u:" + p.TenantID + ":" + p.User, l.UserHourly, l.UserBurst, time.Hour})
	}
	now := time.Now()
	var lims []*rate.Limiter
	for _, b := range buckets {
		if b.rate < 0 { // off
			continue
		}
		if b.rate == 0 { // a rate of 0 lets nothing through
			d.Scopes = append(d.Scopes, quotas.Scope{Name: b.name, Window: b.per, Violated: true, RetryAfter: b.per})
			d.Violated = append(d.Violated, b.name)
			lims = append(lims, nil)
			if b.name == quotas.KeyRate {
				break
			}
			continue
		}
		r := rate.Limit(b.rate / n / b.per.Seconds())
		burst := max(1, int(math.Floor(b.burst/n)))
		lim := g.localLimiter(b.id, r, burst)
		tokens := lim.TokensAt(now)
		s := quotas.Scope{Name: b.name, Limit: b.rate, Window: b.per, Remaining: int64(max(0, tokens-1))}
		if tokens < 1 {
			s.Violated, s.Remaining = true, 0
			s.RetryAfter = time.Duration((1 - tokens) / float64(r) * float64(time.Second))
			d.Violated = append(d.Violated, b.name)
		}
		d.Scopes = append(d.Scopes, s)
		lims = append(lims, lim)
		if b.name == quotas.KeyRate && s.Violated {
			break // the key bucket comes first
		}
	}
	if p.Mode == quotas.ModeAdmit && p.InScope && len(d.Violated) == 0 {
		// Counts are not kept without Redis, but a limit of 0 needs none.
		zero := func(name string, limit int64) {
			if limit == 0 {
				d.Scopes = append(d.Scopes, quotas.Scope{Name: name, Violated: true, RetryAfter: time.Second})
				d.Violated = append(d.Violated, name)
			}
		}
		zero(quotas.ConcurrentSessions, l.Sessions)
		if p.LongRunning {
			zero(quotas.LongRunningInflight, l.LongRunning)
		}
		zero(quotas.QueueBacklog, l.Backlog)
	}
	if len(d.Violated) > 0 {
		d.Allowed = false
		// The key bucket counts every request, as in Redis.
		if d.Scopes[0].Name == quotas.KeyRate && !d.Scopes[0].Violated {
			lims[0].AllowN(now, 1)
		}
		return d, nil
	}
	for _, lim := range lims {
		lim.AllowN(now, 1)
	}
	if p.Mode == quotas.ModeAdmit && !p.InScope {
		d.Allowed, d.OutOfScope = false, true
	}
	return d, nil
}

const replicaTTL = 10 * time.Second

// Start registers this API replica and keeps the live replica count fresh, and retries
// the releases that failed while Redis was unreachable, until Stop. The count divides
// rate limits in degraded mode. Stop withdraws the replica.
func (g *Guard) Start(ctx context.Context) error {
	ctx, shouldStart, started, stopped := g.StartInit(ctx)
	if !shouldStart {
		return nil
	}
	go func() {
		started()
		defer stopped()
		defer g.withdraw()
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			g.heartbeat(ctx)
			g.retryReleases(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return nil
}

func (g *Guard) withdraw() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	g.q.rdb.ZRem(ctx, g.q.keys.APIReplicas(), g.id)
}

func (g *Guard) heartbeat(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	key := g.q.keys.APIReplicas()
	now := time.Now().UnixMilli()
	pipe := g.q.rdb.TxPipeline()
	pipe.ZAdd(ctx, key, redisZ(float64(now+replicaTTL.Milliseconds()), g.id))
	pipe.ZRemRangeByScore(ctx, key, "-inf", itoa(now))
	card := pipe.ZCard(ctx, key)
	pipe.PExpire(ctx, key, time.Hour)
	if _, err := pipe.Exec(ctx); err != nil {
		return // keep the last known count
	}
	g.replicas.Store(max(card.Val(), 1))
}
