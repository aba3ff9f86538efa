// Package quotas holds the words of agentq's limits: every limit's name, the plan
// catalogue (plans.yaml) with its budgets, commitments (SLA) and answers at a limit
// (OnLimit), billing periods and their anchors, the effective Limits of a request,
// and the plain values the limit machinery is asked with and answers with (the
// params, Decision, Stop, the refusals and waits such as QuotaExceeded and
// CapacityWait, the token capacity's pools and buckets as configured).
//
// It knows no Redis: the machinery that checks and takes the limits lives in
// quotas/admission (admission, step reservations, leases, the degraded mode, the
// period counters' seeding and recount, refusal counts) and quotas/capacity (token
// buckets and model pools). So a package that only names limits (the store, the
// tenant service, the usage events, the API's answers) depends on their words, not
// on Redis scripts.
//
// quotas is a leaf: it knows no HTTP, no scheduler and no runtime.
package quotas
