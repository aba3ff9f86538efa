package scheduler

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/telemetry"
)

// fairWindow is the span of recent dispatches agentq.fair_share_ratio is computed on,
// kept in fairBuckets buckets.
const (
	fairWindow  = time.Minute
	fairBuckets = 6
)

// dispatchMetrics are the dispatcher's instruments.
type dispatchMetrics struct {
	sched *Scheduler
	log   *slog.Logger
	count metric.Int64Counter
	now   func() time.Time

	mu      sync.Mutex
	buckets [fairBuckets]fairBucket
}

// fairBucket is the worker time charged per tenant in one slice of the window, and
// the tenants' weights as last seen.
type fairBucket struct {
	start  time.Time
	charge map[string]float64
	weight map[string]float64
}

// newDispatchMetrics makes the instruments on arch's meter provider; the fair-share
// window follows arch's clock.
func newDispatchMetrics(arch *baseservice.Archetype, sched *Scheduler) *dispatchMetrics {
	arch = arch.Defaults()
	m := &dispatchMetrics{sched: sched, log: arch.Logger, now: arch.Clock}
	meter := arch.Meter("github.com/agentq/agentq/scheduler")
	m.count, _ = meter.Int64Counter("agentq.dispatched", metric.WithUnit("{task}"),
		metric.WithDescription("Tasks handed from the tenant queues to the workers' asynq queues"))
	m.count.Add(context.Background(), 0)
	depth, _ := meter.Int64ObservableGauge("agentq.queue_depth", metric.WithUnit("{task}"),
		metric.WithDescription("Tasks queued per tenant, waiting for dispatch: the 20 deepest tenants each by name, the rest summed as tenant=\"other\""))
	share, _ := meter.Float64ObservableGauge("agentq.fair_share_ratio", metric.WithUnit("1"),
		metric.WithDescription("Per tenant, its share of the worker time dispatched in the last minute over the share its weight entitles it to among the tenants dispatched then (1 is fair); the 20 most served tenants by name, the rest together as tenant=\"other\""))
	_, err := meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		m.observeDepth(ctx, o, depth)
		m.observeShare(o, share)
		return nil
	}, depth, share)
	if err != nil {
		m.log.Warn("registering the scheduler's gauges failed", "err", err)
	}
	return m
}

func (m *dispatchMetrics) dispatched(ctx context.Context, job Dispatched) {
	m.count.Add(context.WithoutCancel(ctx), 1)
	if job.Weight <= 0 {
		return // a re-send: charged when it was first dispatched
	}
	now := m.now()
	slot := now.UnixNano() / int64(fairWindow/fairBuckets)
	m.mu.Lock()
	defer m.mu.Unlock()
	b := &m.buckets[slot%fairBuckets]
	start := time.Unix(0, slot*int64(fairWindow/fairBuckets))
	if !b.start.Equal(start) {
		*b = fairBucket{start: start, charge: map[string]float64{}, weight: map[string]float64{}}
	}
	b.charge[job.TenantID] += float64(max(job.EstimateMs, 1))
	b.weight[job.TenantID] = float64(job.Weight)
}

// observeShare reports each recently dispatched tenant's fair-share ratio: its share
// of the charged worker time over its weight's share.
func (m *dispatchMetrics) observeShare(o metric.Observer, g metric.Float64ObservableGauge) {
	since := m.now().Add(-fairWindow)
	charge, weight := map[string]float64{}, map[string]float64{}
	m.mu.Lock()
	for _, b := range m.buckets {
		if b.charge == nil || b.start.Before(since) {
			continue
		}
		for t, c := range b.charge {
			charge[t] += c
		}
		for t, w := range b.weight {
			weight[t] = w
		}
	}
	m.mu.Unlock()
	var total, weights float64
	for t, c := range charge {
		total += c
		weights += weight[t]
	}
	if total == 0 || weights == 0 {
		return
	}
	ratio := func(c, w float64) float64 { return (c / total) / (w / weights) }
	top, rest := telemetry.TopN(charge, telemetry.TopTenants)
	for _, t := range top {
		o.ObserveFloat64(g, ratio(charge[t], weight[t]), metric.WithAttributes(attribute.String("tenant", t)))
	}
	if len(rest) > 0 {
		var c, w float64
		for _, t := range rest {
			c, w = c+charge[t], w+weight[t]
		}
		o.ObserveFloat64(g, ratio(c, w), metric.WithAttributes(attribute.String("tenant", telemetry.OtherLabel)))
	}
}

// observeDepth reads the backlogged tenants of every shard and their queue lengths
// (two pipelined round trips), and reports the deepest tenants and the rest summed
// as "other" (reported also at 0, so the series always exists).
func (m *dispatchMetrics) observeDepth(ctx context.Context, o metric.Observer, g metric.Int64ObservableGauge) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	depth, err := m.sched.queueDepths(ctx)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Debug("reading queue depths for the metrics failed", "err", err)
		}
		return
	}
	top, rest := telemetry.TopN(depth, telemetry.TopTenants)
	for _, t := range top {
		o.ObserveInt64(g, int64(depth[t]), metric.WithAttributes(attribute.String("tenant", t)))
	}
	var other float64
	for _, t := range rest {
		other += depth[t]
	}
	o.ObserveInt64(g, int64(other), metric.WithAttributes(attribute.String("tenant", telemetry.OtherLabel)))
}

// queueDepths is the queue length of every backlogged tenant (ready or capped).
func (s *Scheduler) queueDepths(ctx context.Context) (map[string]float64, error) {
	pipe := s.rdb.Pipeline()
	var sets []*redis.StringSliceCmd
	for shard := range s.keys.Shards() {
		sets = append(sets, pipe.ZRange(ctx, s.keys.Ready(shard), 0, -1), pipe.ZRange(ctx, s.keys.Capped(shard), 0, -1))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	var tenants []string
	for _, c := range sets {
		tenants = append(tenants, c.Val()...)
	}
	depth := make(map[string]float64, len(tenants))
	if len(tenants) == 0 {
		return depth, nil
	}
	pipe = s.rdb.Pipeline()
	lens := make([]*redis.IntCmd, len(tenants))
	for i, t := range tenants {
		lens[i] = pipe.ZCard(ctx, s.keys.TenantQueue(t))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	for i, t := range tenants {
		depth[t] += float64(lens[i].Val())
	}
	return depth, nil
}
