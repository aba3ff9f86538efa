// Package usage reads the usage ledger: the per-(task, step, meter) rows in
// Postgres, written in the transaction that records a step, which are the truth of
// what every tenant used. It rebuilds and recounts the quota counters from it
// (Ledger), keeps and rebuilds its rollups, and reads them for the usage report and
// the monthly export (Rollups).
//
// # Quota counters that survive a Redis data loss
//
// Admission and the workers enforce agent_steps_daily, ai_tokens_monthly and
// usd_monthly on counters in Redis (package quotas): the steps per hour of the sliding
// day, and the billing period's tokens and micro-dollars. Redis can lose them (FLUSHDB,
// a restart without persistence, an evicted or expired key); were they simply
// recreated at zero, a tenant that used up a quota would get it back. The ledger is what
// they are rebuilt from and recounted against.
//
// Rebuilding before anything is decided. The counters live in the tenant's admission
// state hash, which carries a mark ("sd") set only by the script that writes counters
// rebuilt from the ledger, together with them. The admission script (for a tenant with
// any period quota on, and for the usage report) and the worker's step reservation
// check the mark in a read they make anyway; without it they answer "unseeded"
// instead of deciding, and take nothing. The caller (quotas/admission: the Store, the Guard) then
// reads the tenant's use with Ledger.PeriodUsage — one query: steps per hour over the
// last 25 h, tokens and micro-dollars in the current billing period as quotas computes
// it — writes it with the seed script, and asks again. So no admission is decided on
// lost counters: there is no window in which a tenant at its quota is admitted.
//
//   - The seed script writes only if the mark is still missing, in one atomic step: two
//     replicas (or two callers) rebuilding at once write once; the loser's read of the
//     ledger is discarded. Within a process, concurrent callers for a tenant share one
//     rebuild.
//   - A settlement (the worker booking a step's actual use against its reservation)
//     leaves unmarked counters alone. Its step is already in the ledger, so the
//     rebuild reads it there; a settlement that created counters before the seed
//     would be overwritten, and one that added to them would count the step twice.
//   - A rebuild is a Postgres read, bounded by its own timeout, not the admission's
//     Redis timeout. If it fails the admission fails closed (503, as when Redis is
//     down) and does not count as a Redis failure for the degraded-mode breaker.
//   - A tenant without ledger rows seeds to zero in one rebuild. A tenant with no
//     period quota is admitted without one (nothing to check), and seeded by its first
//     step reservation or usage report.
//   - The mark lives in the hash that holds the counters, so a restart with Redis
//     intact rebuilds nothing, and a marked tenant's admissions cost what they cost
//     before. Counters found without the mark are rebuilt once.
//
// What the rebuild cannot see. A step reserved before the loss and recorded in the
// ledger after the rebuild's read is in neither: its reservation went with Redis, and
// its settlement only books the difference between its use and its estimate. So for
// every step in flight at the moment of the loss (at most one per running task) the
// rebuilt counters can come out short by that step and its estimate, and a step
// recorded before the read whose settlement lands after the seed adds its
// difference once more. The ledger stays exact; the counters are corrected by the
// recount.
//
// # The recount
//
// A janitor pass (internal/maintenance, QuotaRecount) walks the tenants from a cursor,
// within a time budget, on the leader only. For a page of tenants it reads their
// counters to find the seeded ones (tenants whose counters are unseeded are skipped:
// admission rebuilds them, and creating them here would keep idle tenants' state from
// expiring), then holds their ledger still (Ledger.RecountHeld: the page's rollups are
// held exclusively, so no step of theirs is recorded until the correction is made),
// takes a snapshot of the counters, reads what the ledger says, and corrects, in one
// script per tenant, the drift the snapshot shows, keeping what moved since on top.
// Steps reserved or settled after the snapshot are not in the ledger read (no record
// lands while it is held) and are kept as they are, so they commute with the
// correction: they are never mistaken for drift, a task that starts during the recount
// keeps its reservation, and a tenant that always has a step in flight is corrected
// all the same. A
// page that cannot be held within HoldWait is left for the next run and counted
// (agentq.quotas.recount_skipped).
//
// In-flight reservations: a step reserved and not yet recorded is in the counters and
// not in the ledger. The ledger bounds them: each running task holds at most one step
// reserved, with at most what its last recorded step used (the worker's estimate for
// the next); a task that has recorded no step yet reserves from what its tenant's
// steps used before (the worker's running average), so it counts the largest of its
// running siblings' last steps and the tenant's latest step. The recount leaves a counter within [ledger, ledger + in flight] alone;
// one below is raised to the ledger, one above is lowered to ledger + in flight —
// never below what may be reserved, so a running step's settlement cannot take it
// under the truth. An over-count within the bound lasts at most until the tenant's
// running tasks end; the next run then brings it down to the ledger. Steps are
// rewritten from the ledger's hours (the in-flight share in the current hour); tokens
// and micro-dollars only when Redis's newest billing period is the ledger's, so the
// recount never acts across a period boundary.
//
// # Billing periods
//
// A tenant's billing period is monthly and starts at 00:00, in the tenant's time zone
// (UTC unless it set an IANA zone), on its billing day of the month (1 to 31; a month
// without that day starts the period on its last day; default: the UTC day of the
// tenant's creation). quotas.Anchor computes it, for the quota counters and for the
// rollups alike, so the ai_tokens_monthly and usd_monthly counters and the period
// rollups are one period. A period's id is its start date in the tenant's zone
// (yyyymmdd). In a zone with daylight saving time a period is an hour shorter or
// longer; days cut at the zone's midnight are 23 or 25 hours long.
//
// # Rollups
//
// The ledger stays the truth; three tables sum it per tenant: per UTC hour, per day of
// the tenant's zone, and per billing period, each with steps, tokens and
// cost_micro_usd. The transaction that records a step (store.UnscopedRecordStep) adds
// the step to its hour, day and period rows, and only when its ledger rows were
// inserted: the ledger is idempotent on (task, step, meter), so a retried step, which
// inserts nothing, adds nothing. The rows are keyed by the ledger's own recorded_at
// (the transaction's clock), which a rebuild reads back, so the two always cut time
// at the same instants.
//
// Rebuild (Rollups.Rebuild) recomputes a tenant's rollups from the ledger over a
// range, widened to whole billing periods, or all of them. It reads the ledger summed
// per quarter hour (every zone in use has its midnights on one) and assigns each sum
// to its hour, day and period with the same anchor. A rebuild holds an exclusive
// advisory lock on the tenant's rollups, each step's transaction a shared one, so a
// rebuild never replaces rows that a step it did not read is adding to. Changing a
// tenant's billing day or zone rewrites all its rollups under the new anchor, in the
// transaction of the change. The Redis quota counters follow the new period at its
// first step (or the recount).
//
// # The usage export
//
// Export("YYYY-MM") gives, for every tenant that existed before the end of its
// billing period starting in that month (in its zone, on its billing day: every month
// holds exactly one period start of every tenant), that period's steps, tokens and
// cost_micro_usd (and the cost as a decimal string of dollars), from the period
// rollups: the ledger's sums over exactly [period start, period end). The month
// names billing periods, not calendar months, so the export of a month is the
// tenants' invoices for the periods that began in it. Tenants without use are listed
// with zeros. Each tenant also carries its refused submissions per limit_type in
// that period, from the refusal counts in Postgres (package billing/rejections copies
// them there within about a second of each refusal); the CSV writes them as rows
// whose meter is "rejections:<limit_type>".
package usage
