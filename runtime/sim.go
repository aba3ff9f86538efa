package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/agentq/agentq/agentqtype"
)

// SimInput configures the built-in sim agent.
type SimInput struct {
	Steps          int     `json:"steps"`
	StepMs         int     `json:"step_ms"`
	TokensPerStep  int64   `json:"tokens_per_step"`
	CostUSDPerStep float64 `json:"cost_usd_per_step"`
	FailAtStep     int     `json:"fail_at_step"` // 0 = never
	// Spawn are children its first step spawns (a task tree), and WaitChildren has
	// that step wait for them; its output then counts the children that completed.
	Spawn        []Spawn `json:"spawn"`
	WaitChildren bool    `json:"wait_children"`
}

// Sim is the built-in simulated agent: it sleeps step_ms per step, reports
// tokens_per_step and cost_usd_per_step, and fails at fail_at_step if set.
type Sim struct{}

const (
	simMaxSteps  = 100000
	simMaxStepMs = 10 * 60 * 1000
)

func parseSimInput(raw json.RawMessage) (SimInput, error) {
	in := SimInput{Steps: 1}
	if len(bytes.TrimSpace(raw)) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return in, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return in, fmt.Errorf("sim input: %w", err)
	}
	switch {
	case in.Steps < 1 || in.Steps > simMaxSteps:
		return in, fmt.Errorf("sim input: steps must be between 1 and %d", simMaxSteps)
	case in.StepMs < 0 || in.StepMs > simMaxStepMs:
		return in, fmt.Errorf("sim input: step_ms must be between 0 and %d", simMaxStepMs)
	case in.TokensPerStep < 0 || in.CostUSDPerStep < 0:
		return in, fmt.Errorf("sim input: tokens_per_step and cost_usd_per_step must not be negative")
	case in.FailAtStep < 0:
		return in, fmt.Errorf("sim input: fail_at_step must not be negative")
	case len(in.Spawn) > 0 && in.Steps < 2:
		return in, fmt.Errorf("sim input: spawn needs steps of at least 2 (a step that ends the task spawns nothing)")
	case len(in.Spawn) > agentqtype.MaxSpawnsPerStep:
		return in, fmt.Errorf("sim input: at most %d spawns", agentqtype.MaxSpawnsPerStep)
	case in.WaitChildren && len(in.Spawn) == 0:
		return in, fmt.Errorf("sim input: wait_children needs spawn")
	}
	return in, nil
}

// ValidateInput rejects sim input the agent could not run.
func (Sim) ValidateInput(input json.RawMessage) error {
	_, err := parseSimInput(input)
	return err
}

type simState struct {
	Done int `json:"done"`
}

// Step runs one simulated step.
func (Sim) Step(ctx context.Context, req StepRequest) (StepResult, error) {
	in, err := parseSimInput(req.Input)
	if err != nil {
		return StepResult{}, fmt.Errorf("%w: %v", ErrStepFailed, err)
	}
	if in.StepMs > 0 {
		t := time.NewTimer(time.Duration(in.StepMs) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return StepResult{}, ctx.Err()
		case <-t.C:
		}
	}
	if in.FailAtStep > 0 && req.Step == in.FailAtStep {
		return StepResult{}, fmt.Errorf("%w: sim agent failed at step %d as asked (fail_at_step)", ErrStepFailed, req.Step)
	}
	state, _ := json.Marshal(simState{Done: req.Step})
	res := StepResult{
		State: state,
		Done:  req.Step >= in.Steps,
		Usage: StepUsage{Tokens: in.TokensPerStep, CostUSD: in.CostUSDPerStep},
	}
	if req.Step == 1 && len(in.Spawn) > 0 {
		res.Spawn = in.Spawn
		if in.WaitChildren {
			res.Wait = WaitChildren
		}
	}
	if res.Done {
		out := map[string]any{"steps": req.Step, "tokens": in.TokensPerStep * int64(req.Step)}
		if len(in.Spawn) > 0 && in.WaitChildren {
			done := 0
			for _, c := range req.Children {
				if c.State == agentqtype.TaskStateCompleted {
					done++
				}
			}
			out["children_completed"] = done
		}
		res.Output, _ = json.Marshal(out)
	} else {
		res.NextStepTokens = in.TokensPerStep // its steps are alike: the estimate is exact
	}
	return res, nil
}
