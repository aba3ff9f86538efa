package quotas

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// NextStep is what a task's next step is expected to take, the estimate its
// reservation asks for: tokens, and cost in micro-dollars (what its previous step
// cost). A paused task keeps it, so that the step it resumes with is judged, and
// reserved, as it would have been had it not paused.
type NextStep struct {
	Tokens    int64
	CostMicro int64
}

// TaskUse is what a task has used of its own budget: its steps, its cost in
// micro-dollars and its wall clock (time parked or paused not counted).
type TaskUse struct {
	Steps     int
	CostMicro int64
	Wall      time.Duration
}

// Shortfall is a limit whose room does not cover a task's next step, in the limit's
// unit (steps, tokens, micro-dollars, whole seconds of wall clock): Limit is its
// value and Used the use, Need the room the next step needs and AtLeast the least
// value of the limit that gives it (Used + Need).
type Shortfall struct {
	LimitType                  string
	Limit, Used, Need, AtLeast int64
}

// Stop is s as the limit a task stops or pauses at.
func (s Shortfall) Stop() Stop { return Stop{LimitType: s.LimitType, Limit: s.Limit, Used: s.Used} }

// BudgetRoom is the first field of budget b whose room does not cover a task's next
// step, nil when every field's does; it is the rule the worker applies before each
// step, so a resume that passes it runs that step. The step needs one step of room
// under max_steps, its estimated cost under max_cost_usd (a cost left at 0 or below
// stops even a step estimated at nothing) and some wall clock left.
func BudgetRoom(b TaskBudget, u TaskUse, next NextStep) *Shortfall {
	if b.MaxSteps > 0 && u.Steps+1 > b.MaxSteps {
		return &Shortfall{LimitType: TaskMaxSteps, Limit: int64(b.MaxSteps), Used: int64(u.Steps), Need: 1, AtLeast: int64(u.Steps) + 1}
	}
	maxCost := int64(math.Round(b.MaxCostUSD * 1e6))
	if maxCost > 0 && (u.CostMicro >= maxCost || u.CostMicro+next.CostMicro > maxCost) {
		need := max(next.CostMicro, 1)
		return &Shortfall{LimitType: TaskMaxCostUSD, Limit: maxCost, Used: u.CostMicro, Need: need, AtLeast: u.CostMicro + need}
	}
	wall := time.Duration(b.MaxWallclockS * float64(time.Second))
	if wall > 0 && u.Wall >= wall {
		used := int64(math.Round(u.Wall.Seconds()))
		return &Shortfall{LimitType: TaskMaxWallclock, Limit: int64(math.Round(b.MaxWallclockS)), Used: used,
			Need: 1, AtLeast: int64(math.Floor(u.Wall.Seconds())) + 1}
	}
	return nil
}

// QuotaRoom is the room a tenant's period quota limitType (agent_steps_daily,
// ai_tokens_monthly or usd_monthly; limit below 0: off) leaves for a task's next
// step, nil when the step fits. It is the rule the step reservation's script
// applies (admission.Steps.ReserveStep): the daily steps need one step; tokens and
// money need the step's estimate, and a step estimated at nothing fits until a
// positive quota is used up.
func QuotaRoom(limitType string, limit, used int64, next NextStep) *Shortfall {
	if limit < 0 {
		return nil
	}
	var est int64
	switch limitType {
	case AgentStepsDaily:
		est = 1
	case AITokensMonthly:
		est = next.Tokens
	case USDMonthly:
		est = next.CostMicro
	default:
		return nil
	}
	need := est
	switch {
	case est > 0 && used+est <= limit:
		return nil
	case est <= 0 && (limit == 0 || used < limit):
		return nil
	case est <= 0:
		need = 1
	}
	return &Shortfall{LimitType: limitType, Limit: limit, Used: used, Need: need, AtLeast: used + need}
}

// PeriodQuotas are the quotas a step reserves against, in the order the step
// reservation checks them.
var PeriodQuotas = []string{AgentStepsDaily, AITokensMonthly, USDMonthly}

// ShortfallAt is the shortfall of a task stopped at stop (its limit's value and the
// use that met it) whose next step is next: the room the step needs in the limit's
// unit (one step, one second of wall clock, its estimated tokens or cost, at least
// one unit).
func ShortfallAt(stop Stop, next NextStep) Shortfall {
	need := int64(1)
	switch stop.LimitType {
	case TaskMaxCostUSD, USDMonthly:
		need = max(next.CostMicro, 1)
	case AITokensMonthly:
		need = max(next.Tokens, 1)
	}
	return Shortfall{LimitType: stop.LimitType, Limit: stop.Limit, Used: stop.Used, Need: need, AtLeast: stop.Used + need}
}

// IsBudgetLimit reports whether limitType is a field of a task's own budget (which a
// resume may raise), not one of its tenant's quotas.
func IsBudgetLimit(limitType string) bool {
	switch limitType {
	case TaskMaxSteps, TaskMaxCostUSD, TaskMaxWallclock:
		return true
	}
	return false
}

// AmountValue is n, an amount of limitType in the limit's unit, as the API shows it:
// dollars for money (micro-dollars inside), n itself otherwise.
func AmountValue(limitType string, n int64) float64 {
	if limitType == TaskMaxCostUSD || limitType == USDMonthly {
		return float64(n) / 1e6
	}
	return float64(n)
}

// FormatAmount is n, an amount of limitType in the limit's unit, in words: "$0.035",
// "20 steps", "61 s", "1200 tokens".
func FormatAmount(limitType string, n int64) string {
	switch limitType {
	case TaskMaxCostUSD, USDMonthly:
		return FormatUSD(float64(n) / 1e6)
	case TaskMaxSteps, AgentStepsDaily:
		if n == 1 {
			return "1 step"
		}
		return strconv.FormatInt(n, 10) + " steps"
	case TaskMaxWallclock:
		return strconv.FormatInt(n, 10) + " s"
	case AITokensMonthly:
		return strconv.FormatInt(n, 10) + " tokens"
	}
	return strconv.FormatInt(n, 10)
}

// FormatUSD is a dollar amount with at least two decimals and no more than it
// needs, to the micro-dollar: $0.04, $0.035, $1.00.
func FormatUSD(v float64) string {
	s := strconv.FormatFloat(math.Round(v*1e6)/1e6, 'f', -1, 64)
	switch i := strings.IndexByte(s, '.'); {
	case i < 0:
		s += ".00"
	case len(s)-i == 2:
		s += "0"
	}
	return "$" + s
}

// Explain says, in words, why a task cannot run its next step under the limit s
// names: "its cost budget: $0.03 of $0.035 spent; the next step is expected to cost
// about $0.01".
func (s Shortfall) Explain() string {
	f := func(n int64) string { return FormatAmount(s.LimitType, n) }
	switch s.LimitType {
	case TaskMaxCostUSD:
		return fmt.Sprintf("its cost budget: %s of %s spent; the next step is expected to cost about %s", f(s.Used), f(s.Limit), f(s.Need))
	case TaskMaxSteps:
		return fmt.Sprintf("its step budget: %s of %d taken", f(s.Used), s.Limit)
	case TaskMaxWallclock:
		return fmt.Sprintf("its wall-clock budget: %s of %s used", f(s.Used), f(s.Limit))
	case USDMonthly:
		return fmt.Sprintf("its tenant's monthly spend: %s of %s spent; the next step is expected to cost about %s", f(s.Used), f(s.Limit), f(s.Need))
	case AITokensMonthly:
		return fmt.Sprintf("its tenant's monthly AI tokens: %d of %s used; the next step is expected to take about %s", s.Used, f(s.Limit), f(s.Need))
	case AgentStepsDaily:
		return fmt.Sprintf("its tenant's daily agent steps: %s of %d taken", f(s.Used), s.Limit)
	}
	return fmt.Sprintf("%s: %d of %d used", s.LimitType, s.Used, s.Limit)
}

// Field is the budget field (max_steps, max_cost_usd, max_wallclock_s) of a budget
// limit type; "" for a quota.
func Field(limitType string) string {
	switch limitType {
	case TaskMaxSteps:
		return "max_steps"
	case TaskMaxCostUSD:
		return "max_cost_usd"
	case TaskMaxWallclock:
		return "max_wallclock_s"
	}
	return ""
}
