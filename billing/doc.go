// Package billing reads the usage ledger: the per-(task, step, meter) rows in
// Postgres, written in the transaction that records a step, which are the truth of
// what every tenant used. It builds the usage events and writes them into the events
// outbox, reads the outbox for the pull feeds, and delivers it to the webhook endpoints
// (Webhooks, Relay). It knows no HTTP API, no scheduler and no library wiring.
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
// the next). The recount leaves a counter within [ledger, ledger + in flight] alone;
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
// # Threshold crossings on the step's transaction
//
// Crossings.Step runs in the transaction that records a step (the task lifecycle's
// StepRecorded hook) and writes the approaching_limit and limit_hit events of every
// period quota the step crossed, so they commit or roll back with the step. For each
// quota on for the tenant (its plan with its overrides):
//
//   - ai_tokens_monthly, usd_monthly: the period rollup after the step, as the upsert
//     that added the step returned it, and before = after minus the step's own share.
//   - agent_steps_daily: the steps of the 24 UTC hours ending with the step's hour,
//     from the hourly rollups, which is the window admission and the worker count in
//     Redis (the current hour and the 23 before it; only recorded steps, not the
//     reservations in flight). Its events dedupe per UTC day (DaySpan), so the
//     window sliding down and up again within a day writes nothing twice.
//
// Each step's transaction updates (and so locks) its period row first, so concurrent
// steps of one tenant take their totals in turn: every threshold is crossed by exactly
// one step, and the dedupe keys make it one event per period besides. One step may
// cross several thresholds; each is its own event.
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
// that period, from the refusal counts in Postgres (see Refusals below: they arrive
// there within about a second of each refusal); the CSV writes them as rows whose
// meter is "rejections:<limit_type>".
//
// # The events outbox
//
// An event is a row of the events table, written (WriteEvent) on the transaction of
// the change that caused it, so a change that rolls back leaves no event and one that
// commits always has its own. The row holds the event's exact bytes: delivery and the
// feeds send them as they are, so a resend is byte-identical, and no row is ever
// updated (the table refuses it). Delivery state lives in tables of its own.
//
// Once per dedupe key. Every event has a dedupe key, unique in the table; writing an
// event whose key is there writes nothing (written=false) and keeps the first bytes.
// Replicas and retries that build the same event again therefore need no
// coordination, and the event's id, a UUIDv5 of the key in a fixed namespace, is the
// same wherever it is built: it is the consumers' idempotency key. The keys:
//
//   - a period quota (agent_steps_daily, ai_tokens_monthly, usd_monthly) at a
//     threshold: "tenant|limit_type|period start|threshold", one event per threshold
//     per period. A refusal by a period quota uses the 100 key, so the quota reaching
//     100 % and every refusal after it in the period are one limit_hit. The daily steps
//     are a sliding day; their events dedupe per UTC day (DaySpan).
//   - every other limit (rates, concurrency, backlog, a task's budget, the platform's
//     limits): "tenant|limit_type|minute start", one limit_hit per limit per minute.
//     Refusals after it in the minute are to be counted elsewhere, not written.
//   - a refusal the platform made rather than the plan (Refusal.Platform: degraded
//     mode) takes its key above with "|platform" added, so a minute in which both
//     refused has one event of each.
//
// Refusals. Admission writes nothing to Postgres when it refuses: the admission script
// counts each refusal in Redis in the call that refused it (quotas/rejections.go), per
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
// Refusals decided in process while Redis is unreachable (quotas.Guard's degraded
// mode) are not in Redis: the Guard counts them in memory, per tenant, limit and
// minute, at most quotas.MaxLocalRejections entries. Rejections.FlushLocal, run every
// second on each API replica by LocalRejectionFlush and once more when it stops,
// copies them into degraded_rejections, one row per replica (GREATEST again), and
// writes in the same transaction each window's limit_hit with Refusal.Platform:
// eligible_breach, refused_by "platform". The Guard forgets a minute only once it
// ended and was written; while Postgres is down the counts wait for the next flush.
//
// A task ended budget_exceeded writes its limit_hit on the transaction of that end
// (Events.BudgetStop, run by the task lifecycle), enforcement "stopped", with the
// limit_type of the budget field that ended it (task_max_steps, task_max_cost_usd,
// task_max_wallclock_s: one per tenant and field per minute) or, when a period quota
// stopped it, that quota's, sharing the 100 % event of the period (the UTC day, for
// the daily steps) the refused reservation was decided in (quotas.Stop.Period, At),
// even when the end is written after it ended. The worker names the
// limit, its value and the usage that met it (quotas.Stop) when it ends the task, so
// the event never reads them back out of the task's error text.
//
// Feed order. seq, an identity, numbers the rows, but it is taken at insert and its
// transaction may commit after one holding a later seq; a reader that had read past
// the later one would never see the earlier. Each row therefore keeps the id of its
// transaction (xid8, pg_current_xact_id()), and the feeds read only rows whose
// transaction is older than the oldest one still running on the server
// (xid < pg_snapshot_xmin(pg_current_snapshot())), in (xid, seq) order. Behind that
// horizon every transaction has ended and no new one can start, so the order there
// never changes and only grows at its end: a reader resuming from its last cursor
// misses nothing and reads nothing twice while events arrive. The cost is latency: an
// event shows once every transaction older than its own has ended, so a long
// transaction anywhere on the server (or a session idle in one) holds the feeds back,
// though nothing is lost. The cursor is (xid, seq), opaque to readers (EncodeCursor).
//
// # Webhook delivery
//
// The relay (the relay role) pushes the outbox to the endpoints Webhooks manages, in
// two steps that any number of relays share. Fan-out: the relays have one position in
// the feed order; the relay that locks it (the others skip, they do not wait) reads
// the events after it, writes a pending delivery for each endpoint an event is for
// (enabled, of its type, of its tenant or of all, created before it: the event's xid
// above the endpoint's) and moves the position, in one transaction, so each event is
// fanned out once and, being read behind the feed's horizon, none is passed over.
// Sending: a relay claims due deliveries (FOR UPDATE SKIP LOCKED) and leases each,
// the request timeout plus a minute; no other relay claims it while the lease runs,
// and an outcome is written only while the delivery still carries the claim that
// sent it. A relay that dies mid-send leaves the delivery to the next claim once the
// lease lapses: at least once, with the event id as webhook-id for the receiver to
// deduplicate. Each request is the stored bytes, signed with the Standard Webhooks
// library (with the replaced secret too during a rotation's grace); 2xx delivers,
// 410 disables the endpoint and cancels its pending deliveries, anything else is
// retried on StandardSchedule with jitter and given up after its last attempt. Every
// attempt is recorded. The clock and the schedule are RelayConfig's, so the tests run
// the whole schedule without waiting for it.
//
// Isolation: one endpoint's deliveries never wait on another's. A started relay sends
// from a pool of Workers that claims again as soon as a send finishes; a claim takes
// the endpoints in turn (the oldest due of each, then the next of each) and gives no
// endpoint more than PerEndpoint minus its live leases, counted across every relay
// under a lock on the endpoints it claims for, and no more than one to an endpoint
// whose last recorded attempt did not succeed or that has none yet (a slow start). A
// receiver that never answered holds one worker, whatever its backlog; one that stops
// answering holds at most PerEndpoint until its first timeouts are recorded.
//
// Destinations: the relay's client dials through internal/netguard, which refuses
// loopback, link-local, private, CGNAT and unique local addresses (and unspecified,
// multicast and IPv4-mapped forms) when the connection is made, unless AllowNets
// lists them; registration refuses such an address literal. A tenant's own endpoints
// (CreateForTenant and the …ForTenant calls) always name their tenant, so they get
// its events only, and count against its webhook_endpoints limit.
//
// # The event format
//
// Events are CloudEvents 1.0 in structured JSON mode, built with the CloudEvents Go
// SDK: specversion "1.0", id, source (DefaultSource unless the deployment sets one),
// type, subject (the tenant id), time, datacontenttype application/json, and data
// (LimitData): tenant_id, plan, limit_type, limit_value, current_usage, threshold,
// period (period quotas) or window (the others: the refusal's minute), enforcement
// (none, refused, stopped), refused_by ("platform" on the platform's refusals, absent
// otherwise), upgrade_url and sla_classification. Counts are JSON
// numbers; USD amounts, held as integer micro-dollars, are decimal strings of dollars
// with six decimals, so no float rounds them. The bytes of each type are fixed by a
// golden test: a change to them is a change of the contract.
//
// Types and thresholds. usage.approaching_limit when a period quota's use reaches 80
// and 90 % of its limit; usage.limit_hit when it reaches 100 %, and when any limit
// refuses work or a task ends budget_exceeded. The crossing rule is >=: threshold t of
// limit L is reached when use >= L·t/100 (800 of 1000 reaches 80 %; with fractions the
// threshold is the next whole unit), and a change from before to after crosses it when
// before was below and after is at or above it (Crossed). One change may cross several
// thresholds; each is its own event. A limit of 0 or off has no thresholds.
//
// sla_classification: informational at 80 %, at_risk at 90 %, enforced_limit when the
// tenant's own plan limit refused work (its quota at 100 %, its rates, its
// concurrency), eligible_breach when the platform refused it rather than the plan:
// degraded mode, a shared pool, a global limit.
package billing
