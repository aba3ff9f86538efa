package quotas

import (
	"errors"
	"fmt"
	"time"
)

// ErrHandOff refuses a re-admission while the task is still in its tenant's running
// set: the delivery that paused it is handing it off. Retry shortly.
var ErrHandOff = errors.New("quotas: the task's pausing delivery still holds its dispatch slot")

// ReAdmitParams re-admit a stored task against its tenant's sessions.
type ReAdmitParams struct {
	TenantID, TaskID string
	Limits           Limits
	LongRunning      bool // the task asked for more than LongRunningThreshold of wall clock
	// Spawned: a sub-agent's task, which holds no session of its own (its tree holds
	// its root's): only the hand-off is checked, and no lease is taken.
	Spawned bool
}

// ReAdmitRefusal is a re-admission refused by a full session limit.
type ReAdmitRefusal struct {
	LimitType string // concurrent_sessions or long_running_inflight
	Limit     int64
	Held      int64
}

func (e *ReAdmitRefusal) Error() string {
	return fmt.Sprintf("%s limit of %d reached (%d held)", e.LimitType, e.Limit, e.Held)
}

// DefaultInflightRequests is the inflight_requests limit of a plan that does not name
// one (every default plan has 32).
const DefaultInflightRequests = 32

// InflightLeaseTTL bounds a request's inflight_requests lease between refreshes: a
// replica that dies with requests open frees their slots within it. Requests that run
// longer (event streams) refresh their lease.
const InflightLeaseTTL = 30 * time.Second

// InflightLimit is a tenant's inflight_requests limit from its effective limits; 0
// means not enforced (the limit is unlimited). A limit of 0 cannot be configured
// (ValidateOverrides): it would shut the tenant out of its own API.
func InflightLimit(eff map[string]Limit) int64 {
	v, ok := eff[InflightRequests]
	switch {
	case !ok:
		return DefaultInflightRequests
	case v.Off():
		return 0
	}
	return int64(v)
}

// InflightSlot is one request's inflight_requests lease, as the admission guard (admission.Guard) took it.
type InflightSlot struct {
	TenantID string
	ID       string
	Limit    int64 // 0: not enforced
	Held     int64 // leases of the tenant, this one included (0 when unknown)
	Allowed  bool
	Degraded bool // Redis was not asked or did not answer: the limit was not enforced
	// Leased: a lease is, or may be, in Redis; the Guard releases it when the
	// request ends.
	Leased bool
}
