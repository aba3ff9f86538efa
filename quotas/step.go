package quotas

import (
	"fmt"
	"math"
	"time"

	"github.com/agentq/agentq/agentqtype"
)

// ErrUnavailable means a limit could not be checked (Redis is unreachable, or the
// ledger its lost counters are rebuilt from) and the limit class fails closed: money
// and token quotas, and the usage report. Callers answer 503 with Retry-After. It is
// agentqtype's: one failure of a backing service, whichever layer reports it.
var ErrUnavailable = agentqtype.ErrUnavailable

// StepParams describe a step's quota reservation or settlement.
type StepParams struct {
	TenantID string
	Period   Period
	Limits   Limits
	// Reserve: the estimate. Settle: what the step used minus what was reserved.
	Tokens, CostMicro int64
	// Settle only: -1 gives the reserved step back (the step did not complete).
	Steps int64
}

// QuotaExceeded names the quota that refused a step.
type QuotaExceeded struct {
	LimitType   string
	Used, Limit float64
	// Period is the billing period the refused reservation was decided in: the one
	// whose counters refused it, whatever the time when its refusal is reported.
	Period Period
	// At is when it was refused (the daily steps quota's events dedupe per UTC day).
	At time.Time
}

// Stop is e as the limit that ended a task.
func (e *QuotaExceeded) Stop() Stop {
	return Stop{LimitType: e.LimitType, Limit: int64(math.Round(e.Limit)), Used: int64(math.Round(e.Used)), Period: e.Period, At: e.At}
}

// Stop is the limit that ended a task budget_exceeded: its type, its value and the
// usage that met it, in the limit's unit (micro-dollars for money, whole seconds for
// wall clock). The worker hands it to the task's end, so what reports the stop (the
// usage.limit_hit event) never has to read it back out of the task's error text.
type Stop struct {
	LimitType   string
	Limit, Used int64
	// Period is the billing period a tenant's quota stopped the task in, and At when
	// (both zero for a task's own budget): its limit_hit is that period's (that UTC
	// day's for the daily steps), even when the task's end is written after it ended.
	Period Period
	At     time.Time
}

// The limit types of a task's own budget, as a Stop names them.
const (
	TaskMaxSteps     = "task_max_steps"
	TaskMaxCostUSD   = "task_max_cost_usd"
	TaskMaxWallclock = "task_max_wallclock_s"
)

func (e *QuotaExceeded) Error() string {
	if e.LimitType == USDMonthly { // micro-dollars inside, dollars outside
		return fmt.Sprintf("%s limit of $%.2f reached (used $%.6f)", e.LimitType, e.Limit/1e6, e.Used/1e6)
	}
	return fmt.Sprintf("%s limit of %.0f reached (used %.0f)", e.LimitType, e.Limit, e.Used)
}

// CapacityWait says a step cannot get its token capacity now: it waits Wait, without
// holding a worker, for Reason (agentqtype.WaitTokensPerMinute or a model pool's
// agentqtype.WaitPool). Nothing was taken.
type CapacityWait struct {
	Reason agentqtype.WaitReason
	Wait   time.Duration
}

func (e *CapacityWait) Error() string {
	return fmt.Sprintf("waiting %v for %s", e.Wait.Round(time.Millisecond), e.Reason)
}
