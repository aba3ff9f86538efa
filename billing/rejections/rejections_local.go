package rejections

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"

	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// LocalRejectionCounts is where an API replica counts the admissions it refused in
// process while Redis was unreachable (*admission.Guard).
type LocalRejectionCounts interface {
	LocalRejections() quotas.LocalRejections
	ForgetLocalRejections(flushed quotas.LocalRejections, before time.Time) int
}

// FlushLocal copies the refusals this replica decided in process (Rejections.Local)
// into Postgres and writes, in the same transaction, the limit_hit of each limit's
// first such refusal in its window: the platform refused that work, not the tenant's
// plan, so the event is an eligible_breach with refused_by "platform", keyed apart
// from the plan's refusals of the window. Replicas' counts are rows of their own, and
// one window's event is written once whichever replica writes it first. Counts of
// minutes that ended are forgotten once committed; if Postgres fails, nothing is,
// and the next flush tries again. Without Local it does nothing.
func (r *Rejections) FlushLocal(ctx context.Context) (FlushResult, error) {
	var res FlushResult
	if r.Local == nil {
		return res, nil
	}
	snap := r.Local.LocalRejections()
	if len(snap.Counts) == 0 {
		return res, nil
	}
	rows := make([]store.RejectionRow, len(snap.Counts))
	for i, c := range snap.Counts {
		rows[i] = store.RejectionRow{TenantID: c.TenantID, LimitType: c.LimitType, Minute: c.Minute, Count: c.Count}
		if i == 0 || c.TenantID != snap.Counts[i-1].TenantID {
			res.Tenants++
		}
	}
	err := r.Store.InTx(ctx, func(tx *store.Store) error {
		first, err := tx.UnscopedAddDegradedRejections(ctx, store.AddDegradedRejectionsParams{Replica: snap.Replica, Rows: rows})
		if err != nil {
			return fmt.Errorf("billing: copy degraded-mode refusal counts: %w", err)
		}
		res.Events, err = r.writeEvents(ctx, tx, first, nil)
		return err
	})
	if err != nil {
		return FlushResult{}, err
	}
	res.Rows = len(rows)
	// A minute is forgotten once it is over by a minute, as the Redis counts are pruned.
	res.Pruned = r.Local.ForgetLocalRejections(snap, r.now().Truncate(time.Minute).Add(-time.Minute))
	return res, nil
}

// LocalRejectionFlushOptions configure a LocalRejectionFlush. Zero fields take the
// defaults.
type LocalRejectionFlushOptions struct {
	Interval time.Duration // between flushes (1 s)
	Timeout  time.Duration // a flush's time bound, the last one's at shutdown too (5 s)
	// Archetype is where a failed flush is logged; nil: the defaults.
	Archetype *baseservice.Archetype
}

// LocalRejectionFlush runs FlushLocal every Interval on an API replica (each counts
// its own), and once more when it stops, so what the replica refused in degraded mode
// just before it goes down is not lost with it.
type LocalRejectionFlush struct {
	startstop.BaseStartStop
	r   *Rejections
	cfg LocalRejectionFlushOptions
	log *slog.Logger
}

// NewLocalRejectionFlush returns a stopped flush of r's in-process counts.
func NewLocalRejectionFlush(r *Rejections, o LocalRejectionFlushOptions) *LocalRejectionFlush {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	return &LocalRejectionFlush{r: r, cfg: o, log: o.Archetype.Defaults().Logger}
}

// Start flushes every Interval until Stop, which waits for one last flush.
func (f *LocalRejectionFlush) Start(ctx context.Context) error {
	ctx, shouldStart, started, stopped := f.StartInit(ctx)
	if !shouldStart {
		return nil
	}
	go func() {
		started()
		defer stopped()
		t := time.NewTicker(f.cfg.Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				f.flush(context.WithoutCancel(ctx)) // the last one, on the way down
				return
			case <-t.C:
				f.flush(ctx)
			}
		}
	}()
	return nil
}

func (f *LocalRejectionFlush) flush(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()
	if _, err := f.r.FlushLocal(ctx); err != nil {
		f.log.Warn("flushing degraded-mode refusal counts failed; retrying", "err", err)
	}
}
