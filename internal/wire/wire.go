// Package wire holds the message shapes shared by the scheduler (which sends them
// through asynq) and the runtime (which receives them).
package wire

// TaskType is the asynq task type agentq workers handle.
const TaskType = "agentq:run"

// Payload is the body of an asynq task. Band carries the task's exact priority
// ("p5"), which the scheduler needs to release the task's dispatch slot.
type Payload struct {
	TaskID   string `json:"task_id"`
	TenantID string `json:"tenant_id"`
	Band     string `json:"band"`
	// EstimateMs is the worker time its tenant's pass was charged at dispatch; the
	// completion corrects the charge to the time the task really took.
	EstimateMs int64 `json:"estimate_ms"`
}
