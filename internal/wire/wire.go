// Package wire holds the message shapes shared by the scheduler (which sends them
// through asynq) and the runtime (which receives them).
package wire

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// TaskType is the asynq task type agentq workers handle.
const TaskType = "agentq:run"

// Payload is the body of an asynq task.
type Payload struct {
	TaskID   string `json:"task_id"`
	TenantID string `json:"tenant_id"`
	// Priority is the task's exact priority. The scheduler needs it, with EstimateMs,
	// to release the task's dispatch slot when the task ends.
	Priority int `json:"priority"`
	// EstimateMs is the worker time its tenant's pass was charged at dispatch; the
	// completion corrects the charge to the time the task really took.
	EstimateMs int64 `json:"estimate_ms"`
	// TraceParent is the W3C traceparent of the dispatch span, itself a child of
	// the submission's: the worker's task span continues that trace. Empty when the
	// task carried none (a re-send, or a task re-pushed from Postgres).
	TraceParent string `json:"traceparent,omitempty"`
	// Gen counts the task's parks before this dispatch: with TaskID it makes the
	// dispatch's asynq message id (rkeys.AsynqTaskID).
	Gen int `json:"gen,omitempty"`
}

// UnmarshalJSON decodes a payload, including one written before the priority was a
// number: such a payload has only "band":"pN" (N the priority), and tasks sent
// before an upgrade are still in asynq after it. "priority" wins when both are set.
func (p *Payload) UnmarshalJSON(b []byte) error {
	type plain Payload // no methods: no recursion
	var v struct {
		plain
		Priority *int    `json:"priority"`
		Band     *string `json:"band"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*p = Payload(v.plain)
	switch {
	case v.Priority != nil:
		p.Priority = *v.Priority
	case v.Band != nil:
		n, err := strconv.Atoi(strings.TrimPrefix(*v.Band, "p"))
		if err != nil || !strings.HasPrefix(*v.Band, "p") {
			return fmt.Errorf("wire: payload band %q is not a priority", *v.Band)
		}
		p.Priority = n
	}
	return nil
}
