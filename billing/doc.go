// Package billing holds no code: its subpackages are what the platform knows of
// what tenants used and of the limits they met, one job each.
//
//   - billing/usage reads the usage ledger, the truth of what every tenant used: the
//     quota counters are rebuilt and recounted from it (Ledger), and its rollups
//     serve the usage report and the monthly export (Rollups). Billing periods are
//     described there.
//   - billing/outbox builds the usage events (CloudEvents: approaching_limit,
//     limit_hit) and writes them into the events outbox on the transaction of the
//     change that caused them: a step's threshold crossings (Crossings), a task's
//     budget stop (Events.BudgetStop). It reads the outbox in a stable order for the
//     pull feeds (Feed).
//   - billing/rejections copies admission's refusal counts into Postgres, from Redis
//     and from each replica's degraded-mode counts, and writes their limit_hit
//     events.
//   - billing/webhooks manages the webhook endpoints and delivers the outbox to them
//     (Relay).
//
// usage, rejections and webhooks build on outbox (its events, amounts and spans) and
// on none of one another. None of them depends on the HTTP API, the scheduler or the
// library that wires them (internal/archtest checks it).
package billing
