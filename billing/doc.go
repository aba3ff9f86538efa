// Package billing reads the usage ledger: the per-(task, step, meter) rows in
// Postgres, written in the transaction that records a step, which are the truth of
// what every tenant used. It knows no HTTP, no scheduler and no library wiring.
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
// instead of deciding, and take nothing. The caller (quotas.Quotas, quotas.Guard) then
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
//     before. Counters left without the mark by an earlier version are rebuilt once.
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
// counters (tenants whose counters are unseeded are skipped: admission rebuilds them,
// and creating them here would keep idle tenants' state from expiring), then what the
// ledger says (Ledger.RecountBasis), then corrects, in one script per tenant that
// first checks the counters did not move since it read them: a step reserved or
// settled during the recount leaves that tenant to the next run, so it is never
// mistaken for drift.
//
// In-flight reservations: a step reserved and not yet recorded is in the counters and
// not in the ledger. The ledger bounds them: each running task holds at most one step
// reserved, with at most what its last recorded step used (the worker's estimate for
// the next). The recount leaves a counter within [ledger, ledger + in flight] alone;
// one below is raised to the ledger, one above is lowered to ledger + in flight —
// never below what may be reserved, so a running step's settlement cannot take it
// under the truth. An over-count within the bound lasts at most until the tenant's
// running tasks end; the next run then brings it down to the ledger. Steps are
// rewritten from the ledger's hours (the in-flight share in the current hour); tokens
// and micro-dollars only when Redis's newest billing period is the ledger's, so the
// recount never acts across a period boundary.
package billing
