// Package outbox builds the events (CloudEvents: the usage events and
// tenant.limits_changed) and keeps the events outbox:
// each event is written on the transaction of the change that caused it (a step's
// threshold crossings, a task's budget stop, a refusal count's flush), and read back
// in a stable order by the pull feeds and the webhook relay (package
// billing/webhooks). It knows no HTTP API, no scheduler and no library wiring.
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
//     Refusals after it in the minute are to be counted elsewhere (package
//     billing/rejections), not written.
//   - a refusal the platform made rather than the plan (Refusal.Platform: degraded
//     mode) takes its key above with "|platform" added, so a minute in which both
//     refused has one event of each.
//
// A task ended budget_exceeded writes its limit_hit on the transaction of that end
// (Events.BudgetStop, run by Subscriber), enforcement "stopped", with the
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
// # Threshold crossings on the step's transaction
//
// Crossings.Step runs in the transaction that records a step (Subscriber, the
// outbox's subscriber to the task lifecycle) and writes the approaching_limit and limit_hit events of every
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
// # The event format
//
// Events are CloudEvents 1.0 in structured JSON mode, built with the CloudEvents Go
// SDK: specversion "1.0", id, source (DefaultSource unless the deployment sets one),
// type, subject (the tenant id), time, datacontenttype application/json, and data
// (LimitData): tenant_id, plan, limit_type, limit_value, current_usage, threshold,
// period (period quotas) or window (the others: the refusal's minute), enforcement
// (none, refused, stopped, delayed), committed_ms and measured_ms (a missed
// commitment only), refused_by ("platform" on the platform's refusals and missed
// commitments, absent otherwise), upgrade_url and sla_classification. Counts are JSON
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
// sla_classification comes from one rule table (Rules, classify.go; the same table in
// docs/limits.md, fixed by testdata/classification.golden) whose inputs are what
// happened: the threshold reached, who limited the work (the tenant's own limit or
// the platform) and how (refused, delayed, paused, stopped, a commitment missed).
// informational at 80 %, at_risk at 90 %, enforced_limit when the tenant's own limit
// refused, delayed, paused or stopped work, eligible_breach when the platform did:
// degraded mode, a global limit stricter than the plan, a missed commitment.
//
// # Changes of a tenant's limits
//
// tenant.limits_changed (LimitsChanged) is written by the tenant service in the
// transaction of a change of a tenant's plan, weight, status, overrides or billing
// anchor, after the change's audit row, whose id and hash it carries. It is written
// twice, each copy for one audience (the events' audience column): the operators'
// copy names the actor, the claimed actor and the reason, and only the admin feed and
// the operator's endpoints get it; the tenant's copy leaves them out, and only the
// tenant's feed and its own endpoints get it. Each copy's dedupe key is the audit
// row's id and its audience.
//
// # Missed commitments
//
// A plan's commitments (quotas.SLA) are checked at a task's start, right after it
// committed (Commitments.Started, run by Subscriber after the commit, for a start
// alone and for one of a group commit alike: a late start's judgment reads Redis,
// which no transaction waits on): a first start later
// than start_within_s after the task's creation, and a resume after a wait for a
// shared model pool longer than pool_wait_within_s, write a usage.limit_hit of
// limit_type sla_start_within_s or sla_pool_wait_within_s, enforcement "delayed",
// refused_by "platform", eligible_breach, with committed_ms and measured_ms besides
// limit_value and current_usage (whole seconds, rounded up). They are keyed as the
// platform's per window, the minute the commitment lapsed: one per tenant, commitment
// and minute. Commitments.Waiting, a janitor pass, reports tasks still waiting for
// their first start the same way, so a lapse is one event whichever sees it first. A wait the tenant's
// own running cap, demand above its share of the worker slots, or draw above its share
// of the model pool caused is not the platform's and writes nothing (the judges are
// StartHolds and PoolShares); each event written counts in agentq.sla_breaches.
package outbox
