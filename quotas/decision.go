package quotas

import "time"

// Mode says what an admission call does.
type Mode string

// Modes of the admission script.
const (
	ModeAdmit Mode = "admit" // check every scope, take all or nothing
	ModePeek  Mode = "peek"  // report every scope, take nothing (GET /v1/usage)
	ModeKey   Mode = "key"   // take the key bucket only (reads)
)

// Scope is one limit's state in a decision.
type Scope struct {
	Name       string
	Limit      float64 // rate per window, or a count; -1 (off) only in a peek
	Window     time.Duration
	Used       float64
	Remaining  int64
	Reset      time.Duration // until the limit is fully restored / the window resets
	RetryAfter time.Duration // when Violated: until a retry can pass
	Violated   bool
}

// Decision is the outcome of an admission call.
type Decision struct {
	Allowed    bool
	OutOfScope bool // the key bucket was taken, then the scope check failed
	Scopes     []Scope
	Violated   []string
	Degraded   bool // decided in process because Redis was unreachable
}

// AdmitParams describe one request.
type AdmitParams struct {
	Mode        Mode
	TenantID    string
	Kid         string
	Agent       string
	User        string
	TaskID      string // lease member; required for ModeAdmit
	InScope     bool
	LongRunning bool
	Limits      Limits
	Period      Period
}

// Outcomes of a task admission, the outcome label of agentq.admissions.
const (
	OutcomeAdmitted   = "admitted"     // every limit passed (limit_type "none")
	OutcomeRefused    = "refused"      // refused; limit_type names the limit, once per limit that refused it
	OutcomeOutOfScope = "out_of_scope" // the key may not run this agent or act for this user
	OutcomeError      = "error"        // no decision: the limits could not be checked (a 503)
)
