package quotas

import "fmt"

// The limits of a task tree: a spawn they refuse is reported to its parent with one
// of these as its limit_type (and counted once per tree and limit as a
// usage.limit_hit); it stops or pauses nothing.
const (
	TreeMaxTasks   = "tree_max_tasks"
	TreeMaxDepth   = "tree_max_depth"
	TreeMaxSteps   = "tree_max_steps"
	TreeMaxTokens  = "tree_max_tokens"
	TreeMaxCostUSD = "tree_max_cost_usd"
)

// TreeBudget is what a whole task tree (a root and every task it and its
// descendants spawn) may use: how many tasks it may hold (its root included), how
// deep it may go (a root is at depth 0), and the steps, tokens and money its tasks
// may spend together. A zero field takes its plan's default.
type TreeBudget struct {
	MaxTasks   int     `yaml:"max_tasks" json:"max_tasks"`
	MaxDepth   int     `yaml:"max_depth" json:"max_depth"`
	MaxSteps   int     `yaml:"max_steps" json:"max_steps"`
	MaxTokens  int64   `yaml:"max_tokens" json:"max_tokens"`
	MaxCostUSD float64 `yaml:"max_cost_usd" json:"max_cost_usd"`
}

// TreeBudgets are a plan's tree budgets: Default is what a root gets for the fields
// it does not ask for, Ceiling the most it may ask for. In the catalogue a plan
// names max_tasks and max_depth; steps, tokens and cost left out are ten times the
// plan's task budget (default and ceiling), tokens ten times its steps × 10,000.
type TreeBudgets struct {
	Default TreeBudget `yaml:"default" json:"default"`
	Ceiling TreeBudget `yaml:"ceiling" json:"ceiling"`
}

// treeTokensPerStep is what a tree's default max_tokens allows a step: a plan's
// task budget has no tokens of its own.
const treeTokensPerStep = 10_000

// withDefaults fills what a plan's tree entry leaves out from its task budget b.
func (t TreeBudgets) withDefaults(b Budget) TreeBudgets {
	fill := func(tb *TreeBudget, task TaskBudget, tasks, depth int) {
		if tb.MaxTasks == 0 {
			tb.MaxTasks = tasks
		}
		if tb.MaxDepth == 0 {
			tb.MaxDepth = depth
		}
		if tb.MaxSteps == 0 {
			tb.MaxSteps = 10 * task.MaxSteps
		}
		if tb.MaxCostUSD == 0 {
			tb.MaxCostUSD = 10 * task.MaxCostUSD
		}
		if tb.MaxTokens == 0 {
			tb.MaxTokens = int64(tb.MaxSteps) * treeTokensPerStep
		}
	}
	fill(&t.Default, b.Default, 10, 2)
	fill(&t.Ceiling, b.Ceiling, max(t.Default.MaxTasks, 10), max(t.Default.MaxDepth, 2))
	return t
}

func (t TreeBudgets) validate() error {
	d, c := t.Default, t.Ceiling
	if d.MaxTasks < 1 || d.MaxDepth < 0 || d.MaxSteps < 1 || d.MaxTokens < 1 || !(d.MaxCostUSD > 0) {
		return fmt.Errorf("tree: every default must be above 0 (max_depth at least 0)")
	}
	if d.MaxTasks > c.MaxTasks || d.MaxDepth > c.MaxDepth || d.MaxSteps > c.MaxSteps || d.MaxTokens > c.MaxTokens ||
		d.MaxCostUSD > c.MaxCostUSD {
		return fmt.Errorf("tree: a default is above its ceiling")
	}
	return nil
}

// TreeBudgetRequest is the tree budget a submission asks for: nil fields take the
// plan's default, and none may exceed the plan's ceiling.
type TreeBudgetRequest struct {
	MaxTasks   *int
	MaxDepth   *int
	MaxSteps   *int
	MaxTokens  *int64
	MaxCostUSD *float64
}

// ResolveTree fills a requested tree budget from the plan's default and refuses a
// field that is not above 0 (max_depth: below 0) or above the plan's ceiling; field
// names the one refused, max its ceiling.
func (t TreeBudgets) ResolveTree(req *TreeBudgetRequest) (b TreeBudget, field string, ceiling any) {
	b, c := t.Default, t.Ceiling
	if req == nil {
		return b, "", nil
	}
	if v := req.MaxTasks; v != nil {
		if *v < 1 || *v > c.MaxTasks {
			return b, "max_tasks", c.MaxTasks
		}
		b.MaxTasks = *v
	}
	if v := req.MaxDepth; v != nil {
		if *v < 0 || *v > c.MaxDepth {
			return b, "max_depth", c.MaxDepth
		}
		b.MaxDepth = *v
	}
	if v := req.MaxSteps; v != nil {
		if *v < 1 || *v > c.MaxSteps {
			return b, "max_steps", c.MaxSteps
		}
		b.MaxSteps = *v
	}
	if v := req.MaxTokens; v != nil {
		if *v < 1 || *v > c.MaxTokens {
			return b, "max_tokens", c.MaxTokens
		}
		b.MaxTokens = *v
	}
	if v := req.MaxCostUSD; v != nil {
		if !(*v > 0) || *v > c.MaxCostUSD {
			return b, "max_cost_usd", c.MaxCostUSD
		}
		b.MaxCostUSD = *v
	}
	return b, "", nil
}

// DefaultMaxRepeatSteps is a plan's max_repeat_steps when it names none: how many
// steps in a row may answer the same state and output before the task ends failed,
// loop_detected.
const DefaultMaxRepeatSteps = 10
