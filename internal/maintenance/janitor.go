package maintenance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/riverqueue/river/rivershared/startstop"
)

// JanitorConfig configures the janitor's elector and passes. Zero fields take the
// defaults; Interval is every drift pass's interval unless the pass sets its own.
type JanitorConfig struct {
	Interval    time.Duration // between runs of each drift pass (5 min)
	Elector     ElectorConfig
	StaleTasks  StaleTasksConfig
	Leases      LeasesConfig
	RunningSets RunningSetsConfig
	Repush      RepushConfig
	SlotCounter SlotCounterConfig
	Recount     QuotaRecountConfig
	Generation  GenerationCheckConfig
	Rejections  RejectionFlushConfig
	// WebhookRetention: its Interval is its own (5 min), not Interval.
	WebhookRetention WebhookRetentionConfig
	// StartDeadlines: its Interval is its own (1 s), not Interval.
	StartDeadlines StartDeadlinesConfig
	// LateStarts: its Interval is its own (10 s), not Interval.
	LateStarts LateStartsConfig
	// Pauses: its Interval is its own (1 s), not Interval.
	Pauses PauseWatcherConfig
	// Trees: its Interval is its own (10 s), not Interval.
	Trees TreeRepairConfig
}

// Janitor reconciles Redis with Postgres, the system of record, so that crashes and
// Redis data loss lose no accepted task and leak no lease. It is a leader elector and
// one pass per kind of drift, each a service of its own that runs only while the
// elector says this process leads, on its own interval and within its own time and row
// budget, so one slow pass never starves the others; the passes that walk tenants or
// tasks keep a cursor and resume where their previous run stopped.
type Janitor struct {
	elector    *Elector
	stale      *StaleTasks
	leases     *Leases
	running    *RunningSets
	repush     *Repush
	slots      *SlotCounter
	recount    *QuotaRecount
	generation *GenerationCheck
	rejections *RejectionFlush
	webhooks   *WebhookRetention
	deadlines  *StartDeadlines
	lateStarts *LateStarts
	pauses     *PauseWatcher
	trees      *TreeRepair
}

// NewJanitor builds the elector and the passes. Nothing runs until their Start.
func NewJanitor(d Deps, c JanitorConfig) *Janitor {
	iv := func(v time.Duration) time.Duration { return orDefault(v, orDefault(c.Interval, defaultInterval)) }
	c.StaleTasks.Interval = iv(c.StaleTasks.Interval)
	c.Leases.Interval = iv(c.Leases.Interval)
	c.RunningSets.Interval = iv(c.RunningSets.Interval)
	c.Repush.Interval = iv(c.Repush.Interval)
	c.SlotCounter.Interval = iv(c.SlotCounter.Interval)
	c.Recount.Interval = iv(c.Recount.Interval)
	e := NewElector(d, c.Elector)
	// Every kind exists from the start, at 0, for the dashboards and alerts.
	drift := d.drift()
	for _, k := range DriftKinds {
		drift.Add(context.Background(), 0, metric.WithAttributes(attribute.String("kind", k)))
	}
	j := &Janitor{
		elector: e,
		stale:   NewStaleTasks(d, e, c.StaleTasks),
		leases:  NewLeases(d, e, c.Leases),
		running: NewRunningSets(d, e, c.RunningSets),
		repush:  NewRepush(d, e, c.Repush),
		slots:   NewSlotCounter(d, e, c.SlotCounter),
		recount: NewQuotaRecount(d, e, c.Recount),
		// The refusal-count flush takes no turn: it repairs nothing the others touch.
		rejections: NewRejectionFlush(d, e, c.Rejections),
		// Nor does the webhook retention: it deletes history no pass reads.
		webhooks: NewWebhookRetention(d, e, c.WebhookRetention),
		// Nor does the start-deadline pass: it ends tasks no other pass touches
		// (queued, never started), by conditional updates.
		deadlines: NewStartDeadlines(d, e, c.StartDeadlines),
		// Nor does the late-start pass: it only reports.
		lateStarts: NewLateStarts(d, e, c.LateStarts),
		// Nor does the pause watcher: it moves paused tasks only, by conditional
		// updates.
		pauses: NewPauseWatcher(d, e, c.Pauses),
		// Nor does the tree repair: it cancels tasks by conditional updates, as a
		// tenant's cancel does.
		trees: NewTreeRepair(d, e, c.Trees),
	}
	// One pass at a time: each pass reads Postgres and Redis and acts on what it read,
	// and two passes acting on one task at once (the stale pass re-queueing it while
	// the running-set pass re-adds its entry) would undo each other's work.
	turn := new(sync.Mutex)
	j.stale.runMu, j.leases.runMu, j.running.runMu, j.repush.runMu, j.slots.runMu = turn, turn, turn, turn, turn
	j.recount.runMu = turn
	j.generation = newGenerationCheck(d, e, j, c.Generation)
	return j
}

// Elector is the janitor's leader elector.
func (j *Janitor) Elector() *Elector { return j.elector }

// Services are the elector and the passes, in the order they start: the elector
// first, so that stopped in reverse the passes end before the lock is given up.
func (j *Janitor) Services() []startstop.Service {
	return []startstop.Service{j.elector, j.stale, j.leases, j.running, j.repush, j.slots, j.recount, j.generation, j.rejections, j.webhooks,
		j.deadlines, j.lateStarts, j.pauses, j.trees}
}

// Report says what one run of every drift pass found and fixed, per kind of drift,
// and how each pass went.
type Report struct {
	StaleRequeued   int         `json:"stale_requeued"`
	Abandoned       int         `json:"abandoned"`
	Repushed        int         `json:"repushed"` // missing from Redis, or lost to asynq after dispatch
	LeasesReleased  int         `json:"leases_released"`
	LeasesAdded     int         `json:"leases_added"`
	RunningRemoved  int         `json:"running_removed"`
	RunningAdded    int         `json:"running_added"`
	SlotsCorrected  int64       `json:"pool_corrected"`
	RedisDataLoss   bool        `json:"redis_data_loss"`
	StaleDeferred   bool        `json:"stale_deferred"` // a new leader left stale tasks alone
	TenantsReviewed int         `json:"tenants_reviewed"`
	Passes          []PassStats `json:"passes"`
}

// complete reports whether every pass reached the end of its work.
func (r Report) complete() bool {
	for _, p := range r.Passes {
		if !p.Done {
			return false
		}
	}
	return len(r.Passes) > 0
}

// runOnce runs every drift pass once, one after the other (a pass that fails does not
// stop the others), and returns their errors together. The quota recount is not among
// them: it is what a repair after data loss runs, and then the counters are unseeded,
// which the recount leaves to admission to rebuild.
func (j *Janitor) runOnce(ctx context.Context) (Report, error) {
	var rep Report
	var errs []error
	add := func(st PassStats, err error) {
		rep.Passes = append(rep.Passes, st)
		if err != nil {
			errs = append(errs, fmt.Errorf("janitor: %s: %w", st.Name, err))
		}
	}
	s, err := j.stale.runOnce(ctx)
	rep.StaleRequeued, rep.Abandoned, rep.StaleDeferred = s.Requeued, s.Abandoned, s.Deferred
	add(s.Stats, err)
	l, err := j.leases.runOnce(ctx)
	rep.LeasesReleased, rep.LeasesAdded, rep.TenantsReviewed = l.Released, l.Added, l.Stats.Rows
	add(l.Stats, err)
	r, err := j.running.runOnce(ctx)
	rep.RunningRemoved, rep.RunningAdded, rep.Repushed = r.Removed, r.Added, r.Stranded
	add(r.Stats, err)
	p, err := j.repush.runOnce(ctx)
	rep.Repushed += p.Repushed
	add(p.Stats, err)
	c, err := j.slots.runOnce(ctx)
	rep.SlotsCorrected = c.Corrected
	add(c.Stats, err)
	return rep, errors.Join(errs...)
}

// resetCursors makes the walking passes' next runs start from the first tenant and task.
func (j *Janitor) resetCursors() {
	j.leases.resetCursor()
	j.running.resetCursor()
	j.repush.resetCursor()
}
