// Package quotas holds agentq's limits: the plan catalogue and, as the admission issue
// lands, the Redis scripts that check and take every limit in one atomic call.
//
// quotas is a leaf: it knows no HTTP, no scheduler and no runtime.
package quotas
