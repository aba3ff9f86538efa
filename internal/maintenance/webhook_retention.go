package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"

	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/store"
)

// WebhookPruner deletes finished webhook deliveries and their attempts
// (*store.Store).
type WebhookPruner interface {
	UnscopedPruneWebhookDeliveries(ctx context.Context, p store.PruneWebhookDeliveriesParams) (deliveries, attempts int64, err error)
}

// DefaultWebhookRetention is how long finished webhook deliveries and their attempts
// are kept (AGENTQ_WEBHOOK_RETENTION): 30 days.
const DefaultWebhookRetention = 30 * 24 * time.Hour

// WebhookRetentionConfig configures the retention pass. Zero fields take the
// defaults.
type WebhookRetentionConfig struct {
	// Retention: deliveries that finished (succeeded, failed or were cancelled) longer
	// ago are deleted with their attempts (30 days). Pending ones are kept however old.
	Retention time.Duration
	Interval  time.Duration // between runs (5 min)
	// BatchSize bounds the deliveries one statement deletes (1000), so a run holds no
	// long lock and a large backlog is worked off batch by batch.
	BatchSize int
	Budget    time.Duration // a run's time bound (5 s); the next run goes on
}

func (c WebhookRetentionConfig) withDefaults() WebhookRetentionConfig {
	c.Retention = orDefault(c.Retention, DefaultWebhookRetention)
	c.Interval = orDefault(c.Interval, defaultInterval)
	c.BatchSize = orDefault(c.BatchSize, 1000)
	c.Budget = orDefault(c.Budget, defaultBudget)
	return c
}

// WebhookRetentionResult is what one run deleted.
type WebhookRetentionResult struct {
	Deliveries, Attempts int64
	Batches              int
	Stats                PassStats
}

// WebhookRetentionTestSignals are signalled after each run (initialised only in tests).
type WebhookRetentionTestSignals struct {
	Ran testsignal.TestSignal[WebhookRetentionResult]
}

// Init makes the signals waitable.
func (ts *WebhookRetentionTestSignals) Init(tb testutil.TestingTB) { ts.Ran.Init(tb) }

// WebhookRetention deletes, on the leader, the webhook deliveries that finished longer
// than the retention ago and their attempts, in bounded batches, so the two tables do
// not grow forever. It repairs nothing the drift passes touch, so it takes no turn
// with them. Without a pruner (Deps.Webhooks nil) it does nothing.
type WebhookRetention struct {
	startstop.BaseStartStop

	TestSignals WebhookRetentionTestSignals

	pruner WebhookPruner
	leader Leadership
	log    *slog.Logger
	arch   *baseservice.Archetype // its clock dates the retention's cut-off
	cfg    WebhookRetentionConfig
}

// NewWebhookRetention returns a stopped pass that runs while leader leads.
func NewWebhookRetention(d Deps, leader Leadership, c WebhookRetentionConfig) *WebhookRetention {
	return &WebhookRetention{pruner: d.Webhooks, leader: leader, log: d.logger().With("component", "janitor"), arch: d.Archetype,
		cfg: c.withDefaults()}
}

// Start runs the pass every Interval while this process leads, until Stop.
func (p *WebhookRetention) Start(ctx context.Context) error {
	return startLeaderOnly(ctx, &p.BaseStartStop, p.leader, p.log, "janitor pass failed", passWebhookRetention, func(ctx context.Context) (time.Duration, error) {
		res, err := p.runOnce(ctx)
		return p.nextRun(res, err), err
	})
}

// backlogPause is the wait before the next run when a run stopped at its budget with
// more to delete: a backlog is worked through run after run, not one run an Interval.
const backlogPause = time.Second

// nextRun is the wait after a run: backlogPause when it stopped at its budget, else
// Interval.
func (p *WebhookRetention) nextRun(res WebhookRetentionResult, err error) time.Duration {
	if err == nil && !res.Stats.Done && res.Batches > 0 {
		return min(backlogPause, p.cfg.Interval)
	}
	return p.cfg.Interval
}

// runOnce deletes batches until one comes back short or the budget ends.
func (p *WebhookRetention) runOnce(ctx context.Context) (WebhookRetentionResult, error) {
	var res WebhookRetentionResult
	var err error
	before := p.arch.Now().Add(-p.cfg.Retention)
	res.Stats, err = withinBudget(ctx, passWebhookRetention, p.cfg.Budget, func(ctx context.Context, st *PassStats) error {
		for p.pruner != nil {
			d, a, err := p.pruner.UnscopedPruneWebhookDeliveries(ctx, store.PruneWebhookDeliveriesParams{Before: before, Limit: p.cfg.BatchSize})
			if err != nil {
				return err
			}
			res.Deliveries, res.Attempts, res.Batches = res.Deliveries+d, res.Attempts+a, res.Batches+1
			st.Rows = int(res.Deliveries)
			if d < int64(p.cfg.BatchSize) {
				break
			}
		}
		st.Done = true
		return nil
	})
	if res.Deliveries > 0 {
		p.log.Info("janitor pruned finished webhook deliveries past their retention",
			"deliveries", res.Deliveries, "attempts", res.Attempts, "retention", p.cfg.Retention)
	}
	p.TestSignals.Ran.Signal(res)
	return res, err
}
