package wire

import (
	"encoding/json"
	"time"
)

// Progress is one message of a task's progress stream (GET /v1/tasks/{id}/events),
// as it is published on the task's channel. Every publisher encodes it with Encode.
type Progress struct {
	Type   string          `json:"type"` // "state" or "step"
	TaskID string          `json:"task_id"`
	State  string          `json:"state,omitempty"`
	Error  string          `json:"error,omitempty"`
	Step   int             `json:"step,omitempty"`
	Usage  *StepUsage      `json:"usage,omitempty"`
	Done   bool            `json:"done,omitempty"`
	Output json.RawMessage `json:"output,omitempty"`
	// WaitReason and WaitUntil: a task parked for token capacity (state "queued").
	WaitReason string     `json:"wait_reason,omitempty"`
	WaitUntil  *time.Time `json:"wait_until,omitempty"`
	Time       time.Time  `json:"time"`
}

// StepUsage is what one step used: its tokens and its cost.
type StepUsage struct {
	Tokens  int64   `json:"tokens"`
	CostUSD float64 `json:"cost_usd"`
}

// StateProgress is the message of a task's new state; errText is the reason it
// ended with, when it ended.
func StateProgress(taskID, state, errText string) Progress {
	return Progress{Type: "state", TaskID: taskID, State: state, Error: errText}
}

// Encode is the message's bytes, stamped now when its Time is not set.
func (p Progress) Encode() []byte {
	if p.Time.IsZero() {
		p.Time = time.Now().UTC()
	}
	b, _ := json.Marshal(p) // nothing in it fails to encode
	return b
}
