package quotas

import (
	"testing"
	"time"
)

// The room a resume is judged by is the worker's rule before a step: one step under
// max_steps, the step's estimated cost under max_cost_usd (a cost cap met stops even
// a step estimated at nothing), wall clock left; a quota's room is ReserveStep's.
func TestRoomForTheNextStep(t *testing.T) {
	b := TaskBudget{MaxSteps: 20, MaxWallclockS: 60, MaxCostUSD: 0.035}
	for _, c := range []struct {
		name string
		u    TaskUse
		next NextStep
		want *Shortfall
	}{
		{"room", TaskUse{Steps: 2, CostMicro: 20_000}, NextStep{CostMicro: 10_000}, nil},
		{"exact room", TaskUse{Steps: 2, CostMicro: 25_000}, NextStep{CostMicro: 10_000}, nil},
		{"cost", TaskUse{Steps: 3, CostMicro: 30_000}, NextStep{CostMicro: 10_000},
			&Shortfall{LimitType: TaskMaxCostUSD, Limit: 35_000, Used: 30_000, Need: 10_000, AtLeast: 40_000}},
		{"cost met, step of unknown cost", TaskUse{Steps: 3, CostMicro: 35_000}, NextStep{},
			&Shortfall{LimitType: TaskMaxCostUSD, Limit: 35_000, Used: 35_000, Need: 1, AtLeast: 35_001}},
		{"steps", TaskUse{Steps: 20}, NextStep{},
			&Shortfall{LimitType: TaskMaxSteps, Limit: 20, Used: 20, Need: 1, AtLeast: 21}},
		{"wall clock", TaskUse{Steps: 1, Wall: 61500 * time.Millisecond}, NextStep{},
			&Shortfall{LimitType: TaskMaxWallclock, Limit: 60, Used: 62, Need: 1, AtLeast: 62}},
	} {
		got := BudgetRoom(b, c.u, c.next)
		if (got == nil) != (c.want == nil) || got != nil && *got != *c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	for _, c := range []struct {
		limitType   string
		limit, used int64
		next        NextStep
		fits        bool
	}{
		{USDMonthly, 50_000, 35_000, NextStep{CostMicro: 20_000}, false}, // a refund of cents is not room
		{USDMonthly, 50_000, 30_000, NextStep{CostMicro: 20_000}, true},
		{USDMonthly, 50_000, 49_999, NextStep{}, true}, // unknown cost: runs until used up
		{USDMonthly, 50_000, 50_000, NextStep{}, false},
		{USDMonthly, 0, 0, NextStep{}, true}, // nothing billable: a step estimated at 0 runs
		{USDMonthly, -1, 1 << 40, NextStep{CostMicro: 1}, true},
		{AITokensMonthly, 1000, 900, NextStep{Tokens: 200}, false},
		{AgentStepsDaily, 3, 3, NextStep{}, false},
		{AgentStepsDaily, 3, 2, NextStep{}, true},
	} {
		if got := QuotaRoom(c.limitType, c.limit, c.used, c.next) == nil; got != c.fits {
			t.Errorf("%s %d of %d, next %+v: fits %v, want %v", c.limitType, c.used, c.limit, c.next, got, c.fits)
		}
	}
}

func TestShortfallInWords(t *testing.T) {
	sf := ShortfallAt(Stop{LimitType: TaskMaxCostUSD, Limit: 50_000, Used: 40_000}, NextStep{CostMicro: 20_000})
	if got, want := sf.Explain(), "its cost budget: $0.04 of $0.05 spent; the next step is expected to cost about $0.02"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	for v, want := range map[float64]string{0.035: "$0.035", 1: "$1.00", 0.1: "$0.10", 12.5: "$12.50", 0.000001: "$0.000001"} {
		if got := FormatUSD(v); got != want {
			t.Errorf("FormatUSD(%g) = %q, want %q", v, got, want)
		}
	}
}

// QuotaRoom says what ReserveStep's script does: for each use, limit and estimate,
// the room rule refuses exactly the steps Redis refuses.
