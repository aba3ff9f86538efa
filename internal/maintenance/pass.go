package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Leadership says whether this process leads the janitor (*Elector). since is when it
// took the lead, zero while it does not; changed is closed at the next change.
type Leadership interface {
	Watch() (since time.Time, changed <-chan struct{})
}

// PassStats says how one run of a pass went.
type PassStats struct {
	Name string        `json:"name"`
	Rows int           `json:"rows"` // tenants, tasks or shards it looked at
	Took time.Duration `json:"took"`
	// Done: the pass reached the end of its work; otherwise it stopped at its budget
	// and the next run resumes from Cursor.
	Done   bool   `json:"done"`
	Cursor string `json:"cursor,omitempty"`
	Err    string `json:"err,omitempty"`
}

// Pass names.
const (
	passStale      = "stale_heartbeats"
	passLeases     = "leases"
	passRunning    = "running_sets"
	passRepush     = "repush"
	passSlots      = "pool"
	passGeneration = "generation"
	passPauses     = "pauses"
	passRecount    = "quota_recount"
	passRejections = "rejection_flush"
	passLateStarts = "late_starts"

	passStartDeadlines = "start_deadlines"
	passTrees          = "trees"

	passWebhookRetention = "webhook_retention"
)

// Defaults every drift pass shares.
const (
	defaultInterval = 5 * time.Minute // between runs
	defaultBudget   = 5 * time.Second // each run's time bound
)

func orDefault[T int | time.Duration](v, d T) T {
	if v <= 0 {
		return d
	}
	return v
}

// withinBudget runs one pass within its time budget and fills its stats. Running out
// of budget is no error: the pass stopped where it was and the next run resumes from
// its cursor.
func withinBudget(ctx context.Context, name string, budget time.Duration, run func(ctx context.Context, st *PassStats) error) (PassStats, error) {
	pctx, cancel := context.WithTimeout(context.WithValue(ctx, unbudgetedKey{}, ctx), budget)
	defer cancel()
	st := PassStats{Name: name}
	began := time.Now()
	err := run(pctx, &st)
	st.Took = time.Since(began)
	if err != nil && pctx.Err() != nil && ctx.Err() == nil {
		err = nil
	}
	if err != nil {
		st.Err = err.Error()
	}
	return st, err
}

// unbudgetedKey holds, in a pass's context, the context the pass runs in without its
// budget: a walk reviews its first page there, so that a run always advances, however
// short its budget against the time one page takes.
type unbudgetedKey struct{}

// unbudgeted is ctx without the pass's budget (ctx itself outside a pass).
func unbudgeted(ctx context.Context) context.Context {
	if c, ok := ctx.Value(unbudgetedKey{}).(context.Context); ok {
		return c
	}
	return ctx
}

// runWhileLeading is the loop of a leader-only service: whenever this process takes
// the lead it calls run at once, then again after the wait run returns, until ctx
// ends. Losing the lead cancels the run in progress and waits for the next term.
func runWhileLeading(ctx context.Context, l Leadership, run func(ctx context.Context) time.Duration) {
	for {
		since, changed := l.Watch()
		if since.IsZero() {
			select {
			case <-ctx.Done():
				return
			case <-changed:
				continue
			}
		}
		lctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-changed:
				cancel()
			case <-lctx.Done():
			}
		}()
		t := time.NewTimer(0)
	term:
		for {
			select {
			case <-lctx.Done():
				break term
			case <-t.C:
				t.Reset(run(lctx))
			}
		}
		t.Stop()
		cancel()
		if ctx.Err() != nil {
			return
		}
	}
}

// DriftKinds are the kind label values of agentq.janitor.drift (Prometheus
// agentq_janitor_drift_total): what the passes correct.
var DriftKinds = []string{
	"leases_released", "leases_added", "pool", "quota_tenants", "quota_steps", "quota_tokens",
	"quota_cost_micro_usd", "repushed", "running_removed", "running_added", "stale_requeued", "abandoned",
}

// drift is the counter of the Redis state the passes found out of line with Postgres,
// by kind. The SDK hands every caller the same instrument.
func (d Deps) drift() metric.Int64Counter {
	c, _ := d.Archetype.Meter("github.com/agentq/agentq/internal/maintenance").Int64Counter("agentq.janitor.drift",
		metric.WithUnit("{item}"),
		metric.WithDescription("Redis state the janitor found out of line with Postgres and corrected, by kind"))
	return c
}

// CorrectionLog keeps what the janitor's runs corrected where the operator view reads
// it, whichever process leads (*store.Store, the janitor_runs table).
type CorrectionLog interface {
	UnscopedRecordJanitorRun(ctx context.Context, pass string, corrections map[string]int64) error
}

// driftRecorder reports what a pass corrected: the drift metric, one log line and,
// when the pass corrected anything and a CorrectionLog is set, a record of the run.
type driftRecorder struct {
	counter metric.Int64Counter
	log     *slog.Logger
	sink    CorrectionLog
}

func newDriftRecorder(d Deps) driftRecorder {
	return driftRecorder{counter: d.drift(), log: d.logger().With("component", "janitor"), sink: d.Corrections}
}

// record adds what a pass corrected to the drift metric and, if it corrected
// anything, logs it in one line and records the run. kv alternates kind names and
// counts. Recording is best effort: a failure is logged, the pass's work stands.
func (r driftRecorder) record(ctx context.Context, pass string, kv ...any) {
	attrs := []any{"pass", pass}
	fixed := map[string]int64{}
	for i := 0; i+1 < len(kv); i += 2 {
		kind, _ := kv[i].(string)
		var n int64
		switch v := kv[i+1].(type) {
		case int:
			n = int64(v)
		case int64:
			n = v
		}
		attrs = append(attrs, kind, n)
		if n != 0 {
			fixed[kind] = n
		}
		if n < 0 {
			n = -n
		}
		if n > 0 {
			r.counter.Add(ctx, n, metric.WithAttributes(attribute.String("kind", kind)))
		}
	}
	if len(fixed) == 0 {
		return
	}
	r.log.Warn("janitor fixed drift between Redis and Postgres", attrs...)
	if r.sink == nil {
		return
	}
	// The pass's own context may have ended with its budget or its leadership; what
	// it did is done, so the record gets a short deadline of its own.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := r.sink.UnscopedRecordJanitorRun(rctx, pass, fixed); err != nil {
		r.log.Warn("janitor: could not record the run's corrections", "pass", pass, "err", err)
	}
}

// startLeaderOnly is a pass's Start: a goroutine, owned by the service b and ended by
// its Stop, that runs run whenever this process leads and again after the wait run
// returns. A failed run is logged under msg and the pass's name; the next comes on
// schedule.
func startLeaderOnly(ctx context.Context, b *startstop.BaseStartStop, leader Leadership, log *slog.Logger, msg, name string, run func(ctx context.Context) (time.Duration, error)) error {
	ctx, shouldStart, started, stopped := b.StartInit(ctx)
	if !shouldStart {
		return nil
	}
	go func() {
		started()
		defer stopped()
		runWhileLeading(ctx, leader, func(ctx context.Context) time.Duration {
			wait, err := run(ctx)
			if err != nil && ctx.Err() == nil {
				log.Warn(msg, "pass", name, "err", err)
			}
			return wait
		})
	}()
	return nil
}
