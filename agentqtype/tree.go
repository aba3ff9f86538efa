package agentqtype

import "encoding/json"

// The refusals of a spawn besides a tree budget's limits (quotas.TreeMax*), as the
// parent's next step request reports them (spawned[].refused.limit_type).
const (
	// SpawnLoopDetected refuses a spawn of the same agent with the same input
	// (canonical JSON) as the spawning task or one of its ancestors.
	SpawnLoopDetected = "loop_detected"
	// SpawnAgentNotAllowed refuses a spawn of an agent outside the root's key's
	// scopes.
	SpawnAgentNotAllowed = "agent_not_allowed"
	// SpawnInvalid refuses a spawn of an agent nobody registered, or an input
	// the agent refuses.
	SpawnInvalid = "invalid_spawn"
)

// MaxSpawnsPerStep bounds the spawns one step may ask for.
const MaxSpawnsPerStep = 50

// SpawnRefusal is why a spawn made no child: a tree budget's limit
// (tree_max_tasks, tree_max_depth, tree_max_steps, tree_max_tokens,
// tree_max_cost_usd), the tenant's queue_backlog or a period quota of its used up
// (agent_steps_daily, ai_tokens_monthly, usd_monthly), loop_detected,
// agent_not_allowed or invalid_spawn.
type SpawnRefusal struct {
	LimitType string `json:"limit_type"`
	Message   string `json:"message"`
}

// SpawnOutcome is what became of one spawn of a step: the child's id, or the
// refusal. Index is the spawn's place in the step's list.
type SpawnOutcome struct {
	Index   int           `json:"index"`
	ID      string        `json:"id,omitempty"`
	Refused *SpawnRefusal `json:"refused,omitempty"`
}

// SpawnRecord is what a task's latest spawning step asked for and got, kept with
// the task until its next step: that step's request carries Spawned, and, when Wait,
// runs only once every child has ended.
type SpawnRecord struct {
	Step    int            `json:"step"`
	Wait    bool           `json:"wait,omitempty"`
	Spawned []SpawnOutcome `json:"spawned"`
}

// ChildUsage is what a child used.
type ChildUsage struct {
	Steps   int     `json:"steps"`
	Tokens  int64   `json:"tokens"`
	CostUSD float64 `json:"cost_usd"`
}

// ChildResult is a child as its parent's step request shows it, once the parent's
// wait for its children ended.
type ChildResult struct {
	ID     string          `json:"id"`
	Agent  string          `json:"agent"`
	State  TaskState       `json:"state"`
	Output json.RawMessage `json:"output"`
	Error  *string         `json:"error"`
	Usage  ChildUsage      `json:"usage"`
}
