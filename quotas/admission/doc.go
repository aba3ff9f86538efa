// Package admission is agentq's limit store in Redis: the scripts that check and take
// a tenant's limits in one atomic call, and what keeps their state true.
//
// The Store is one process's view of it, in parts with one job each:
//
//   - Admitter: a request's rates, sessions, backlog and period quotas, all or
//     nothing (admit.go; concurrent admissions of a shard share one script call,
//     batcher.go), and the Decision derived from what the script read (decision.go);
//   - Steps: a step's period quotas and its tenant's ai_tokens_per_minute, reserved
//     before it runs and settled after (step.go);
//   - TaskLeases: the leases concurrent_sessions and long_running_inflight count,
//     taken by admission, re-taken by a resume (readmit.go), kept alive and released
//     (leases.go); RequestLeases: the inflight_requests ones (inflight.go);
//   - Seeder: the period counters (agent_steps_daily, ai_tokens_monthly, usd_monthly)
//     rebuilt from a quotas.UsageSource (the usage ledger) when Redis lost them,
//     before anything is decided on them (seed.go), and re-seeded when a billing
//     anchor changes (anchor.go); Recounter: a janitor pass's correction of them
//     against the ledger (recount.go);
//   - RejectionCounts: the refusals the admission script counts, for the flush to
//     Postgres (rejections.go).
//
// The Guard runs admissions and request leases against the Store with a short
// timeout and degrades when Redis is slow or away: rate buckets in process, money and
// token quotas failing closed (quotas.ErrUnavailable), a circuit breaker so a dead
// Redis costs no timeout per request (guard.go, breaker.go).
//
// Its words (Limits, Decision, the params and refusals) are package quotas's, so
// that callers that only name them need no Redis. It is a leaf like quotas: it knows
// no HTTP, no scheduler and no runtime.
package admission
