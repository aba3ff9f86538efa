// Package quotas holds agentq's limits: the plan catalogue and the Redis scripts that
// check and take every limit in one atomic call.
//
// The period quota counters (agent_steps_daily, ai_tokens_monthly, usd_monthly) are
// rebuilt from a UsageSource (the usage ledger) when Redis lost them, before anything
// is decided on them (seed.go), and a janitor pass recounts them (recount.go).
//
// quotas is a leaf: it knows no HTTP, no scheduler and no runtime; what it reads of
// the ledger comes through the UsageSource interface.
package quotas
