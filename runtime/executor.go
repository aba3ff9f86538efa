package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"sync"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/wire"
)

// StepRequest is what an executor gets for each step: the task's input and the state
// the agent returned after the previous step (null before the first).
type StepRequest struct {
	TaskID   string          `json:"task_id"`
	TenantID string          `json:"tenant_id"`
	Agent    string          `json:"agent"`
	Step     int             `json:"step"`
	Input    json.RawMessage `json:"input"`
	State    json.RawMessage `json:"state"`
	// Spawned is what became of the spawns of the task's previous step, one entry a
	// spawn: the child's id, or why it was refused (absent when that step spawned
	// nothing).
	Spawned []agentqtype.SpawnOutcome `json:"spawned,omitempty"`
	// Children is, once a wait for its children ended ("wait": "children"), every
	// child the task spawned, in spawn order, each with its end.
	Children []agentqtype.ChildResult `json:"children,omitempty"`
}

// StepUsage is what one step consumed: its tokens and its cost in USD.
type StepUsage = wire.StepUsage

// StepResult is an executor's answer. Output is kept when Done.
type StepResult struct {
	Output json.RawMessage `json:"output"`
	State  json.RawMessage `json:"state"`
	Done   bool            `json:"done"`
	Usage  StepUsage       `json:"usage"`
	// NextStepTokens is the agent's estimate of its next step's tokens (0: none): the
	// next step reserves that much token capacity before it runs.
	NextStepTokens int64 `json:"next_step_tokens,omitempty"`
	// Throttled says the agent's upstream refused the step (its provider answered
	// 429): the step does not count (no step, no usage, budget untouched) and the
	// task waits RetryAfterS before it tries the step again.
	Throttled *Throttle `json:"throttled,omitempty"`
	// Spawn asks for children (at most agentqtype.MaxSpawnsPerStep), made with the
	// step's record, exactly once: sub-agents in the task's tree, under its tree
	// budget. A step that ends the task (Done) spawns nothing.
	Spawn []Spawn `json:"spawn,omitempty"`
	// Wait "children" runs the task's next step only once every child it spawned
	// has ended, without holding a worker meanwhile; "" runs it at once.
	Wait string `json:"wait,omitempty"`
}

// Spawn is one child a step asks for: its agent, its input, and its budget (fields
// left out take the plan's default; all are capped by what the tree has left).
type Spawn struct {
	Agent  string          `json:"agent"`
	Input  json.RawMessage `json:"input"`
	Budget *SpawnBudget    `json:"budget,omitempty"`
}

// SpawnBudget is a child's requested budget.
type SpawnBudget struct {
	MaxSteps      *int     `json:"max_steps,omitempty"`
	MaxWallclockS *float64 `json:"max_wallclock_s,omitempty"`
	MaxCostUSD    *float64 `json:"max_cost_usd,omitempty"`
}

// WaitChildren is StepResult.Wait's value for a wait for the task's children.
const WaitChildren = string(agentqtype.WaitChildren)

// Throttle is a step's throttled answer.
type Throttle struct {
	RetryAfterS float64 `json:"retry_after_s"`
}

// Executor runs one step of an agent. It must return promptly when ctx ends.
type Executor interface {
	Step(ctx context.Context, req StepRequest) (StepResult, error)
}

// InputValidator is implemented by executors that can reject a task's input at
// admission, before anything is written.
type InputValidator interface {
	ValidateInput(input json.RawMessage) error
}

// ErrStepFailed marks an agent-reported failure: the task ends "failed" with the
// error's message.
var ErrStepFailed = errors.New("step failed")

// Registry maps agent names to executors: the built-in sim agent, Go handlers
// registered in process, and HTTP agents registered by the operator (looked up through
// Remote). It is safe for concurrent use.
type Registry struct {
	mu    sync.RWMutex
	execs map[string]Executor
	// Remote finds an agent that is not registered in process (HTTP agents in
	// Postgres); found=false when there is none by that name.
	Remote func(ctx context.Context, name string) (e Executor, found bool, err error)
}

// NewRegistry returns a registry holding the built-in sim agent.
func NewRegistry() *Registry {
	r := &Registry{execs: map[string]Executor{}}
	r.Register("sim", Sim{})
	return r
}

// Register adds or replaces an executor (Go handlers use this for library use).
func (r *Registry) Register(name string, e Executor) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.execs[name] = e
}

// Local reports whether name is registered in process (it cannot be replaced by an
// HTTP agent of the same name).
func (r *Registry) Local(name string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	_, ok := r.execs[name]
	return ok
}

// Lookup returns the executor for name.
func (r *Registry) Lookup(ctx context.Context, name string) (Executor, error) {
	r.mu.RLock()
	e, ok := r.execs[name]
	remote := r.Remote
	r.mu.RUnlock()
	if ok {
		return e, nil
	}
	if remote != nil {
		e, found, err := remote(ctx, name)
		if err != nil {
			return nil, err
		}
		if found {
			return e, nil
		}
	}
	return nil, &agentqtype.UnknownAgentError{Agent: name}
}

// Names lists registered agents.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.execs))
	for n := range r.execs {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// ValidateTask checks that an agent exists and, if its executor can, that the input
// suits it.
func (r *Registry) ValidateTask(ctx context.Context, agent string, input json.RawMessage) error {
	e, err := r.Lookup(ctx, agent)
	if err != nil {
		return err
	}
	if v, ok := e.(InputValidator); ok {
		if err := v.ValidateInput(input); err != nil {
			return agentqtype.Invalid("input", "%v", err)
		}
	}
	return nil
}
