package rejections

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// RejectionCounts is where admission counts its refusals (*admission.RejectionCounts).
// QueueRejections queues the read of one tenant's counts on a pipe, for a caller that
// sends it with other reads.
type RejectionCounts interface {
	RejectingTenants(ctx context.Context, shard int) ([]string, error)
	Rejections(ctx context.Context, tenants []string) ([]quotas.TenantRejections, error)
	QueueRejections(ctx context.Context, pipe redis.Pipeliner, tenant string) func() (quotas.TenantRejections, error)
	PruneRejections(ctx context.Context, tenantID string, fields map[string]int64) (int, error)
}

// Rejections copies the refusal counts admission keeps in Redis into Postgres, writes
// the limit_hit of each limit's first refusal in its window, and reports a tenant's
// refusals per window. Admission itself writes nothing to Postgres when it refuses
// (quotas/admission/rejections.go): however often a tenant is refused, the flush writes one
// row per limit per minute and at most one event per limit per dedupe window.
type Rejections struct {
	Store  *store.Store
	Counts RejectionCounts
	Shards int               // the key builder's shard count
	Plans  *quotas.Catalogue // the limit values the events report
	Events outbox.Events     // builds the events
	// Archetype holds the flush's clock; nil: the defaults.
	Archetype *baseservice.Archetype
	Page      int // tenants read from Redis per round trip; 100 when 0
	// Local, when set, holds this replica's refusals decided in process while Redis
	// was unreachable (FlushLocal).
	Local LocalRejectionCounts

	mu     sync.Mutex
	cursor flushCursor // where the last flush stopped
}

// FlushResult is what one flush did.
type FlushResult struct {
	Tenants int // tenants with counts in Redis
	Rows    int // (tenant, limit, minute) counts copied
	Events  int // limit_hit events written
	Pruned  int // Redis counts deleted once copied
}

// Flush copies every shard's refusal counts into Postgres, writes the limit_hit of
// each limit's first refusal in its dedupe window, and deletes from Redis the counts
// of minutes that have ended and were copied as they still are.
//
// It walks the tenants with counts in (shard, tenant id) order from where the last
// flush stopped, a Page per round trip, once round, and stops early when ctx ends
// (the pass's budget): the next flush resumes at the first page not committed, so
// under a spike of refused tenants every one is flushed in turn, none starved by a
// walk that restarts at the first tenant each time.
//
// A minute's count only grows, so the copy keeps the larger of the stored count and
// Redis's (store.UnscopedAddRejections): flushing twice, or two flushes at once, add
// nothing twice. A minute is pruned only once it is over by a minute (Redis's clock
// and this one's may differ) and only if its count did not move since it was read.
// What Redis loses before a flush (at most the counts since the last one) is lost.
func (r *Rejections) Flush(ctx context.Context) (FlushResult, error) {
	var res FlushResult
	pruneBefore := r.now().Truncate(time.Minute).Add(-time.Minute)
	page := r.Page
	if page <= 0 {
		page = 100
	}
	shards := max(r.Shards, 1)
	from := r.position()
	// The cursor's shard is walked twice: after the cursor first, up to it last.
	for i := 0; i <= shards; i++ {
		if i == shards && from.after == "" {
			break // the walk began at the start: nothing lies before it
		}
		shard := (from.shard + i) % shards
		ids, err := r.Counts.RejectingTenants(ctx, shard)
		if err != nil {
			return res, err
		}
		ids = from.slice(i, shards, ids)
		for start := 0; start < len(ids); start += page {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			batch := ids[start:min(start+page, len(ids))]
			trs, err := r.Counts.Rejections(ctx, batch)
			if err != nil {
				return res, err
			}
			if err := r.flushPage(ctx, trs, pruneBefore, &res); err != nil {
				return res, err
			}
			r.advance(flushCursor{shard: shard, after: batch[len(batch)-1]})
		}
	}
	return res, nil
}

// flushCursor is where a flush stopped: the last tenant of the last page it
// committed, and that tenant's shard.
type flushCursor struct {
	shard int
	after string
}

// slice is the part of a shard's sorted tenant ids that the i-th step of a walk from
// the cursor covers: those after the cursor first (i 0), those up to it last (i
// shards), every id of the shards between.
func (c flushCursor) slice(i, shards int, ids []string) []string {
	cut, _ := slices.BinarySearch(ids, c.after)
	if cut < len(ids) && ids[cut] == c.after {
		cut++
	}
	switch i {
	case 0:
		return ids[cut:]
	case shards:
		return ids[:cut]
	}
	return ids
}

func (r *Rejections) position() flushCursor {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cursor
}

func (r *Rejections) advance(c flushCursor) {
	r.mu.Lock()
	r.cursor = c
	r.mu.Unlock()
}

// flushPage copies a page of tenants' counts and writes their events in one
// transaction: a flush stopped anywhere (its budget, a lost leadership, a Postgres
// error) leaves neither, and the next flush finds the same counts still first and
// writes their events then. Redis is pruned only after the commit.
func (r *Rejections) flushPage(ctx context.Context, trs []quotas.TenantRejections, pruneBefore time.Time, res *FlushResult) error {
	var rows []store.RejectionRow
	periods := decidedIn{}
	for _, tr := range trs {
		for _, c := range tr.Counts() {
			row := store.RejectionRow{TenantID: tr.TenantID, LimitType: c.LimitType, Minute: c.Minute, Count: c.Count}
			rows = append(rows, row)
			if c.Period != "" {
				periods[periodKey(row)] = c.Period
			}
		}
	}
	var events int
	err := r.Store.InTx(ctx, func(tx *store.Store) error {
		first, err := tx.UnscopedAddRejections(ctx, rows)
		if err != nil {
			return fmt.Errorf("billing: copy refusal counts: %w", err)
		}
		events, err = r.writeEvents(ctx, tx, first, periods)
		return err
	})
	if err != nil {
		return err
	}
	res.Tenants += len(trs)
	res.Rows += len(rows)
	res.Events += events
	// Only now, with the counts and their events in Postgres, may Redis forget them.
	for _, tr := range trs {
		done := map[string]int64{}
		for f, n := range tr.Fields {
			if _, minute, _, err := rkeys.ParseRejectionField(f); err == nil && minute*60 < pruneBefore.Unix() {
				done[f] = n
			}
		}
		if len(done) == 0 {
			continue
		}
		n, err := r.Counts.PruneRejections(ctx, tr.TenantID, done)
		if err != nil {
			return err
		}
		res.Pruned += n
	}
	return nil
}

// decidedIn maps a monthly quota's refusal count (periodKey) to the id of the billing
// period its refusals were decided in. A nil one marks the platform's refusals
// (degraded mode), which no monthly quota makes: those fail closed.
type decidedIn map[string]string

func periodKey(row store.RejectionRow) string {
	return row.TenantID + "|" + row.LimitType + "|" + strconv.FormatInt(row.Minute.Unix(), 10)
}

// writeEvents writes, on tx, the limit_hit of each count stored for the first time,
// and returns how many it wrote; periods nil: refused by the platform, not the plan.
// A tenant deleted since has nothing to be told.
func (r *Rejections) writeEvents(ctx context.Context, tx *store.Store, first []store.RejectionRow, periods decidedIn) (int, error) {
	if len(first) == 0 {
		return 0, nil
	}
	var ids []string
	for _, row := range first {
		if len(ids) == 0 || ids[len(ids)-1] != row.TenantID {
			ids = append(ids, row.TenantID)
		}
	}
	tenants, err := tx.UnscopedGetTenants(ctx, ids)
	if err != nil {
		return 0, err
	}
	var evs []store.InsertEventParams
	seen := map[string]bool{} // a period's refusals in several minutes share one key
	for _, row := range first {
		t, ok := tenants[row.TenantID]
		if !ok {
			continue
		}
		ref := r.refusal(t, row, periods[periodKey(row)])
		// The platform's: degraded mode (no periods), or a global limit stricter
		// than the tenant's plan (ByPlatform, set by refusal).
		ref.Platform = ref.Platform || periods == nil
		ev, err := r.Events.LimitHit(ref)
		if err != nil {
			return 0, err
		}
		if !seen[ev.DedupeKey] {
			seen[ev.DedupeKey] = true
			evs = append(evs, store.InsertEventParams{ID: ev.ID, TenantID: ev.TenantID, Type: ev.Type, DedupeKey: ev.DedupeKey, Payload: ev.Payload})
		}
	}
	// One statement for the page: the flush's time does not grow with its events.
	return tx.UnscopedInsertEvents(ctx, evs)
}

// refusal is the limit_hit of a limit's first refusals in a minute. It reports the
// tenant's plan value of the limit (an API key's own lower key_rate is not known
// here) and, as the usage, that value: the limit was reached. A period quota's refusal
// shares its period's 100 % event, which the step that used the quota up has usually
// written already: for a monthly quota the period of periodID, the one the admission
// was decided in (its counters refused it), not the one the minute counted falls in,
// so a refusal at a period's end never takes the next period's 100 % event.
func (r *Rejections) refusal(t store.Tenant, row store.RejectionRow, periodID string) outbox.Refusal {
	ref := outbox.Refusal{TenantID: t.ID, Plan: t.Plan, LimitType: row.LimitType, At: row.Minute, Enforcement: outbox.EnforcementRefused,
		Platform: r.Plans.ByPlatform(t.Plan, t.Overrides, row.LimitType)}
	if eff, err := r.Plans.Effective(t.Plan, t.Overrides); err == nil {
		if v, ok := eff[row.LimitType]; ok && !v.Off() {
			n := float64(v)
			if row.LimitType == quotas.USDMonthly {
				n *= 1e6
			}
			ref.Limit = int64(math.Round(n))
			ref.Used = ref.Limit
		}
	}
	if outbox.IsPeriodQuota(row.LimitType) {
		period, ok := t.Anchor().PeriodOf(periodID)
		if !ok {
			period = t.Anchor().PeriodAt(row.Minute)
		}
		span := windowOf(row.LimitType, row.Minute, period)
		ref.Period = &span
	}
	return ref
}

// windowOf is the dedupe window holding at of a limit: the UTC day for the daily
// steps, period (the tenant's billing period holding at) for the monthly quotas, the
// minute for the others.
func windowOf(limitType string, at time.Time, period quotas.Period) outbox.Span {
	switch limitType {
	case quotas.AgentStepsDaily:
		return outbox.DaySpan(at)
	case quotas.AITokensMonthly, quotas.USDMonthly:
		return outbox.Span{Start: period.Start, End: period.End}
	}
	start := outbox.WindowStart(at)
	return outbox.Span{Start: start, End: start.Add(outbox.DedupeWindow)}
}

func (r *Rejections) now() time.Time { return r.Archetype.Now() }

// Current returns how many of the tenant's admissions each limit refused in the
// limit's current window, the one its limit_hit is deduplicated over: the minute for
// rates, concurrency and the backlog, the UTC day for the daily steps, the billing
// period for the monthly quotas. It adds the counts already in Postgres to those
// still only in Redis; a minute in both counts once, as the larger. period is the
// tenant's billing period holding now (the caller has the tenant).
func (r *Rejections) Current(ctx context.Context, tenantID string, period quotas.Period, now time.Time) (map[string]int64, error) {
	trs, err := r.Counts.Rejections(ctx, []string{tenantID})
	if err != nil {
		return nil, err
	}
	return r.current(ctx, trs[0], tenantID, period, now)
}

// QueueCurrent is Current in two halves, for a caller that sends the Redis read with
// its other reads in one round trip: it queues the read of the counts still in Redis
// on pipe, and the function returned, called once pipe was sent, adds the counts in
// Postgres as Current does. When the queued read failed, the function reads Redis on
// its own (on its ctx, as Current does).
func (r *Rejections) QueueCurrent(ctx context.Context, pipe redis.Pipeliner, tenantID string, period quotas.Period,
	now time.Time) func(context.Context) (map[string]int64, error) {
	read := r.Counts.QueueRejections(ctx, pipe, tenantID)
	return func(ctx context.Context) (map[string]int64, error) {
		tr, err := read()
		if err != nil {
			return r.Current(ctx, tenantID, period, now)
		}
		return r.current(ctx, tr, tenantID, period, now)
	}
}

// current is Current once the counts still in Redis (tr) were read.
func (r *Rejections) current(ctx context.Context, tr quotas.TenantRejections, tenantID string, period quotas.Period,
	now time.Time) (map[string]int64, error) {
	type key struct {
		limit  string
		minute int64
	}
	counts := map[key]int64{}
	cutoff := now.UTC().Truncate(time.Minute)
	for _, c := range tr.Counts() {
		counts[key{c.LimitType, c.Minute.Unix()}] = c.Count
		if c.Minute.Before(cutoff) {
			cutoff = c.Minute
		}
	}
	// Minutes from the cutoff on may be in Redis: read them one by one. Before it,
	// Postgres alone has them: sum them there, per window. One statement for both.
	var spans []outbox.Span
	var from []time.Time
	for _, w := range []outbox.Span{outbox.DaySpan(now), windowOf(quotas.AITokensMonthly, now, period)} {
		if w.Start.Before(cutoff) {
			spans, from = append(spans, w), append(from, w.Start)
		}
	}
	stored, err := r.Store.RejectionCounts(ctx, store.RejectionCountsParams{TenantID: tenantID, Since: cutoff,
		Until: now.Add(time.Hour), TotalsFrom: from})
	if err != nil {
		return nil, err
	}
	for _, row := range stored.Minutes {
		k := key{row.LimitType, row.Minute.Unix()}
		counts[k] = max(counts[k], row.Count)
	}
	before := map[outbox.Span]map[string]int64{}
	for i, w := range spans {
		before[w] = stored.Totals[i]
	}
	out := map[string]int64{}
	for k, n := range counts {
		w := windowOf(k.limit, now, period)
		if m := time.Unix(k.minute, 0); !m.Before(w.Start) && m.Before(w.End) {
			out[k.limit] += n
		}
	}
	for _, limit := range []string{quotas.AgentStepsDaily, quotas.AITokensMonthly, quotas.USDMonthly} {
		out[limit] += before[windowOf(limit, now, period)][limit]
	}
	for limit, n := range out {
		if n == 0 {
			delete(out, limit)
		}
	}
	return out, nil
}

// FlushRejections is Flush for the janitor's pass.
func (r *Rejections) FlushRejections(ctx context.Context) (rows, events int, err error) {
	res, err := r.Flush(ctx)
	return res.Rows, res.Events, err
}
