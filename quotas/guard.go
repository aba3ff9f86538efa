package quotas

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"
)

// ErrUnavailable means a limit could not be checked (Redis is unreachable) and the
// limit class fails closed: money and token quotas, and the usage report. Callers
// answer 503 with Retry-After.
var ErrUnavailable = errors.New("quotas: limit store unavailable")

// Guard runs admissions against Redis with a short timeout and degrades when Redis is
// unreachable or slow: rate buckets fall back to in-process buckets at limit ÷ live
// API replicas, money/token/step quotas fail closed (ErrUnavailable), and session and
// backlog counts are not enforced while Redis is away. After a failure Redis is skipped for a short cool-down, so a dead Redis costs
// no timeout per request.
type Guard struct {
	q        *Quotas
	log      *slog.Logger
	timeout  time.Duration
	cooldown time.Duration
	id       string

	replicas  atomic.Int64
	downUntil atomic.Int64 // unix ms
	local     *lru.Cache[string, *rate.Limiter]

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
	later  []lease // releases to retry once Redis answers again
}

type lease struct{ tenant, task string }

// maxPendingReleases bounds the retry list; beyond it leases expire with their TTL.
const maxPendingReleases = 10000

// ReleaseLater frees a lease that a timed-out admission may have taken in Redis after
// all, for a request that was then refused (503): it is retried on every heartbeat
// until Redis answers, so a slow Redis cannot leak session slots.
func (g *Guard) ReleaseLater(tenantID, taskID string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.later) < maxPendingReleases {
		g.later = append(g.later, lease{tenantID, taskID})
	}
}

func (g *Guard) retryReleases(ctx context.Context) {
	g.mu.Lock()
	todo := g.later
	g.later = nil
	g.mu.Unlock()
	for i, l := range todo {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := g.q.Release(cctx, l.tenant, l.task)
		cancel()
		if err != nil {
			g.mu.Lock()
			g.later = append(g.later, todo[i:]...)
			g.mu.Unlock()
			return
		}
	}
}

// GuardOptions configure a Guard.
type GuardOptions struct {
	Timeout  time.Duration // per admission call; default 50ms
	Cooldown time.Duration // how long to skip Redis after a failure; default 1s
	ID       string        // this API replica's id
	Logger   *slog.Logger
}

// NewGuard wraps q.
func NewGuard(q *Quotas, o GuardOptions) *Guard {
	g := &Guard{q: q, log: o.Logger, timeout: o.Timeout, cooldown: o.Cooldown, id: o.ID}
	if g.timeout <= 0 {
		g.timeout = 50 * time.Millisecond
	}
	if g.cooldown <= 0 {
		g.cooldown = time.Second
	}
	if g.log == nil {
		g.log = slog.Default()
	}
	g.local, _ = lru.New[string, *rate.Limiter](100000)
	g.replicas.Store(1)
	return g
}

// Quotas returns the wrapped Quotas.
func (g *Guard) Quotas() *Quotas { return g.q }

// Degraded reports whether Redis is being skipped right now.
func (g *Guard) Degraded() bool { return time.Now().UnixMilli() < g.downUntil.Load() }

func (g *Guard) markDown(err error) {
	if !g.Degraded() {
		g.log.Warn("admission store unreachable: degrading (local rate buckets, quotas fail closed)", "err", err, "cooldown", g.cooldown)
	}
	g.downUntil.Store(time.Now().Add(g.cooldown).UnixMilli())
}

// Admit runs p against Redis, or in degraded mode when Redis is unreachable.
// Decision.Degraded tells which.
func (g *Guard) Admit(ctx context.Context, p AdmitParams) (Decision, error) {
	if !g.Degraded() {
		cctx, cancel := context.WithTimeout(ctx, g.timeout)
		d, err := g.q.Admit(cctx, p)
		cancel()
		if err == nil {
			return d, nil
		}
		if ctx.Err() != nil {
			return Decision{}, ctx.Err()
		}
		g.markDown(err)
	}
	return g.degraded(p)
}

// Release frees a task's leases; a failure is logged and the lease expires with its
// TTL.
func (g *Guard) Release(ctx context.Context, tenantID, taskID string) {
	cctx, cancel := context.WithTimeout(ctx, max(g.timeout, time.Second))
	defer cancel()
	if _, err := g.q.Release(cctx, tenantID, taskID); err != nil {
		g.log.Warn("releasing session lease failed; it expires with its TTL", "task_id", taskID, "err", err)
	}
}

func (g *Guard) degraded(p AdmitParams) (Decision, error) {
	l := p.Limits
	if p.Mode == ModePeek {
		return Decision{}, ErrUnavailable
	}
	if p.Mode == ModeAdmit && p.InScope && (l.StepsDaily >= 0 || l.TokensMonthly >= 0 || l.USDMonthlyMicro >= 0) {
		return Decision{}, ErrUnavailable
	}
	n := float64(max(g.replicas.Load(), 1))
	d := Decision{Allowed: true, Degraded: true}
	type bucket struct {
		name, id    string
		rate, burst float64
		per         time.Duration
	}
	buckets := []bucket{{KeyRate, "k:" + p.Kid, l.KeyRate, l.KeyBurst, time.Second}}
	if p.Mode == ModeAdmit && p.InScope {
		buckets = append(buckets,
			bucket{TenantRate, "t:" + p.TenantID, l.TenantRate, l.TenantBurst, time.Second},
			bucket{KeyAgentRate, "ka:" + p.Kid + ":" + p.Agent, l.KeyAgentRate, l.KeyAgentBurst, time.Second},
			bucket{UserTasksHourly, "u:" + p.TenantID + ":" + p.User, l.UserHourly, l.UserBurst, time.Hour})
	}
	now := time.Now()
	var lims []*rate.Limiter
	for _, b := range buckets {
		if b.rate < 0 { // off
			continue
		}
		if b.rate == 0 { // a rate of 0 lets nothing through
			d.Scopes = append(d.Scopes, Scope{Name: b.name, Window: b.per, Violated: true, RetryAfter: b.per})
			d.Violated = append(d.Violated, b.name)
			lims = append(lims, nil)
			if b.name == KeyRate {
				break
			}
			continue
		}
		r := rate.Limit(b.rate / n / b.per.Seconds())
		burst := max(1, int(math.Floor(b.burst/n)))
		lim, ok := g.local.Get(b.id)
		if !ok || lim.Limit() != r || lim.Burst() != burst {
			lim = rate.NewLimiter(r, burst)
			g.local.Add(b.id, lim)
		}
		tokens := lim.TokensAt(now)
		s := Scope{Name: b.name, Limit: b.rate, Window: b.per, Remaining: int64(max(0, tokens-1))}
		if tokens < 1 {
			s.Violated, s.Remaining = true, 0
			s.RetryAfter = time.Duration((1 - tokens) / float64(r) * float64(time.Second))
			d.Violated = append(d.Violated, b.name)
		}
		d.Scopes = append(d.Scopes, s)
		lims = append(lims, lim)
		if b.name == KeyRate && s.Violated {
			break // the key bucket comes first
		}
	}
	if p.Mode == ModeAdmit && p.InScope && len(d.Violated) == 0 {
		// Counts are not kept without Redis, but a limit of 0 needs none.
		zero := func(name string, limit int64) {
			if limit == 0 {
				d.Scopes = append(d.Scopes, Scope{Name: name, Violated: true, RetryAfter: time.Second})
				d.Violated = append(d.Violated, name)
			}
		}
		zero(ConcurrentSessions, l.Sessions)
		if p.LongRunning {
			zero(LongRunningInflight, l.LongRunning)
		}
		zero(QueueBacklog, l.Backlog)
	}
	if len(d.Violated) > 0 {
		d.Allowed = false
		// The key bucket counts every request, as in Redis.
		if d.Scopes[0].Name == KeyRate && !d.Scopes[0].Violated {
			lims[0].AllowN(now, 1)
		}
		return d, nil
	}
	for _, lim := range lims {
		lim.AllowN(now, 1)
	}
	if p.Mode == ModeAdmit && !p.InScope {
		d.Allowed, d.OutOfScope = false, true
	}
	return d, nil
}

const replicaTTL = 10 * time.Second

// Start registers this API replica and keeps the live replica count fresh, until
// Stop. The count divides rate limits in degraded mode.
func (g *Guard) Start(ctx context.Context) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cancel != nil {
		return
	}
	ctx, g.cancel = context.WithCancel(ctx)
	g.done = make(chan struct{})
	go func() {
		defer close(g.done)
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
}

// Stop withdraws the replica and stops the heartbeat.
func (g *Guard) Stop() {
	g.mu.Lock()
	cancel, done := g.cancel, g.done
	g.cancel = nil
	g.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
	ctx, c := context.WithTimeout(context.Background(), time.Second)
	defer c()
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

// Replicas is the last known number of live API replicas.
func (g *Guard) Replicas() int64 { return g.replicas.Load() }
