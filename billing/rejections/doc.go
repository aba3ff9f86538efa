// Package rejections copies admission's refusal counts into Postgres and writes
// the limit_hit event (package billing/outbox) of each limit's first refusal in its
// window: the counts kept in Redis (Rejections.Flush, the janitor's pass), and those
// an API replica decided in process while Redis was unreachable
// (Rejections.FlushLocal, LocalRejectionFlush). It also reports a tenant's refusals in
// each limit's current window (Rejections.Current).
//
// Admission writes nothing to Postgres when it refuses: the admission script
// counts each refusal in Redis in the call that refused it (quotas/admission/rejections.go), per
// tenant, minute and set of limits that refused. Rejections.Flush, a janitor pass
// every second, copies the counts per (tenant, limit, minute) into Postgres, keeping
// the larger of the stored and the read count (a minute's count only grows, so a copy
// made twice or by two flushers at once adds nothing twice), writes the limit_hit of
// every (tenant, limit, minute) it sees first, which the dedupe key collapses to one
// per window, and only then lets Redis forget counts of minutes that ended. A page of
// tenants' counts and their events are one transaction: a flush cut anywhere leaves
// neither, and the next one finds the counts still first and writes both, so each
// window's event is written exactly once. The flush keeps a cursor (shard, tenant) and
// resumes after the last page it committed, so tenants late in the order are flushed
// in turn under a spike, not starved by a walk that restarts each second. A period
// quota's refusal uses its period's 100 % key, so it adds nothing when the quota's
// crossing wrote the event; a monthly quota's is the period the admission was decided
// in (the script counts it under that period's id), not the one the minute counted
// falls in. Rejections.Current reports a tenant's refusals in each
// limit's current window from both stores.
//
// Refusals decided in process while Redis is unreachable (admission.Guard's degraded
// mode) are not in Redis: the Guard counts them in memory, per tenant, limit and
// minute, at most quotas.MaxLocalRejections entries. Rejections.FlushLocal, run every
// second on each API replica by LocalRejectionFlush and once more when it stops,
// copies them into degraded_rejections, one row per replica (GREATEST again), and
// writes in the same transaction each window's limit_hit with outbox.Refusal.Platform:
// eligible_breach, refused_by "platform". The Guard forgets a minute only once it
// ended and was written; while Postgres is down the counts wait for the next flush.
package rejections
