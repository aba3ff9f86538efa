package agentqtype

import "strings"

// WaitReason is why a task parked for token capacity waits, without a worker, until
// its wait_until: stored with the task, shown as the API's wait_reason, and named by
// the usage events of the wait. One of:
//
//   - WaitTokensPerMinute: its tenant's ai_tokens_per_minute bucket;
//   - WaitPool(name), "pool:<name>": the shared model pool its agent draws on;
//   - WaitThrottled(name), throttled[:<pool>]: the retry time after its agent's
//     upstream refused it (the pool's, for an agent bound to one). Such a wait counts
//     toward the task's wall clock: the agent ran, its upstream answered.
type WaitReason string

// WaitTokensPerMinute is the wait of a step for its tenant's ai_tokens_per_minute.
const WaitTokensPerMinute WaitReason = "tokens_per_minute"

const (
	waitPoolPrefix = "pool:"
	waitThrottled  = "throttled"
)

// WaitPool is the wait of a step for the model pool named pool.
func WaitPool(pool string) WaitReason { return WaitReason(waitPoolPrefix + pool) }

// WaitThrottled is the wait of a step after its agent's upstream refused it: for the
// model pool named pool, or, with pool "", for an agent bound to none.
func WaitThrottled(pool string) WaitReason {
	if pool == "" {
		return waitThrottled
	}
	return WaitReason(waitThrottled + ":" + pool)
}

// Pool is the model pool r waits for ("pool:<name>"), and whether r is such a wait.
// A throttled wait is not: the upstream refused, not the pool.
func (r WaitReason) Pool() (name string, ok bool) {
	name, ok = strings.CutPrefix(string(r), waitPoolPrefix)
	if !ok || name == "" {
		return "", false
	}
	return name, true
}

// Throttled reports whether r is a wait after an upstream's refusal, and for which
// model pool ("" for an agent bound to none).
func (r WaitReason) Throttled() (pool string, ok bool) {
	if r == waitThrottled {
		return "", true
	}
	pool, ok = strings.CutPrefix(string(r), waitThrottled+":")
	if !ok || pool == "" {
		return "", false
	}
	return pool, true
}

// WaitChildren is the wait of a task that asked to wait for the tasks it spawned
// ("wait": "children"): it holds no worker and no running slot until every child it
// spawned has ended.
const WaitChildren WaitReason = "children"
