package agentqtype

import "fmt"

// The reasons a task ends with (its error), one constructor each: whoever ends a
// task, and whatever tells of the end (the task's row, its progress stream, its
// events), writes the same text.

// CancelledByTenant is the reason of a task its tenant cancelled (killed).
func CancelledByTenant() string { return "cancelled by the tenant" }

// NotStartedByDeadline is the reason of a task no worker started by its start
// deadline (expired).
func NotStartedByDeadline() string { return "not started by its start deadline" }

// PauseTimedOut is the reason of a task that stayed paused at limitType longer than
// its plan's pause timeout (budget_exceeded).
func PauseTimedOut(limitType string) string {
	return fmt.Sprintf("budget exceeded: paused at %s longer than the plan's pause timeout", limitType)
}

// BudgetReached is the reason of a task stopped at a field of its budget (max_steps,
// max_cost_usd, max_wallclock_s) whose value it reached (budget_exceeded).
func BudgetReached(field string, value any) string {
	return fmt.Sprintf("budget exceeded: %s %v reached", field, value)
}

// QuotaReached is the reason of a task stopped by a quota of its tenant, refusal the
// quota's own words (budget_exceeded).
func QuotaReached(refusal string) string { return "budget exceeded: tenant " + refusal }

// AgentPanicked is the reason of a task whose agent panicked (failed).
func AgentPanicked(agent string) string {
	return fmt.Sprintf("internal error: agent %q panicked", agent)
}

// AbandonedAfter is the reason of a task whose worker stopped heartbeating on each of
// its attempts starts (abandoned).
func AbandonedAfter(attempts int) string {
	return fmt.Sprintf("abandoned: its worker stopped heartbeating on %d attempts", attempts)
}

// ParentEnded is the reason of a task cancelled because the task that spawned it
// ended while it was still live (killed): nothing in a tree outlives its parent.
func ParentEnded(parentState TaskState) string {
	return fmt.Sprintf("parent_ended: the task that spawned it ended %s", parentState)
}

// LoopDetected is the reason of a task whose agent answered the same state and
// output for steps steps in a row (failed).
func LoopDetected(steps int) string {
	return fmt.Sprintf("loop_detected: the agent answered the same state and output %d steps in a row", steps)
}
