package outbox

// The sla_classification of every event comes from one rule table, Rules, whose
// inputs are what happened: the threshold reached, who limited the work (the tenant's
// own limit or the platform) and how. docs/limits.md has the same table, and a golden
// test (testdata/classification.golden) fixes it: a change to it is a change of the
// contract finance credits by.

// Limiter is who limited the work.
type Limiter string

// The limiters.
const (
	// LimitedByTenant: the tenant's own limit, its plan with its overrides (a quota,
	// a rate, its concurrency, its running cap, its token rate, a task's budget).
	LimitedByTenant Limiter = "tenant"
	// LimitedByPlatform: the platform, not the plan: degraded mode, a global limit
	// (AGENTQ_RATE_*, AGENTQ_TENANT_MAX_INFLIGHT) stricter than the plan, a worker or
	// model pool too busy to keep the plan's commitments.
	LimitedByPlatform Limiter = "platform"
)

// How is what happened to the work.
type How string

// The hows.
const (
	HowNone    How = "none"    // nothing yet: a warning
	HowRefused How = "refused" // an admission or a step refused
	HowDelayed How = "delayed" // a step waited for capacity
	HowPaused  How = "paused"  // a task paused until its tenant has room again
	HowStopped How = "stopped" // a running task ended
	// HowCommitmentMissed: a first start or a pool wait took longer than the plan
	// commits to (quotas.SLA).
	HowCommitmentMissed How = "commitment_missed"
)

// Cause is what an event reports: the inputs of the classification.
type Cause struct {
	Threshold int // 80 or 90 (a period quota's warning), or 100 (the rest)
	By        Limiter
	How       How
}

// Rule is one row of the classification table.
type Rule struct {
	Cause
	Class Classification
	// When says in words which events the row covers (docs/limits.md).
	When string
}

// Rules is the classification table, one row per cause an event can report.
var Rules = []Rule{
	{Cause{80, LimitedByTenant, HowNone}, Informational, "a period quota reached 80 %"},
	{Cause{90, LimitedByTenant, HowNone}, AtRisk, "a period quota reached 90 %"},
	{Cause{100, LimitedByTenant, HowRefused}, EnforcedLimit,
		"the tenant's own limit refused work: a period quota at 100 %, a rate, its concurrency, its backlog"},
	{Cause{100, LimitedByTenant, HowDelayed}, EnforcedLimit, "a step waited for the tenant's own ai_tokens_per_minute"},
	{Cause{100, LimitedByTenant, HowPaused}, EnforcedLimit, "the tenant's own limit paused a task"},
	{Cause{100, LimitedByTenant, HowStopped}, EnforcedLimit, "a task's budget, or a period quota, ended it"},
	{Cause{100, LimitedByPlatform, HowRefused}, EligibleBreach,
		"the platform refused work: degraded mode, or a global limit stricter than the tenant's plan"},
	{Cause{100, LimitedByPlatform, HowCommitmentMissed}, EligibleBreach,
		"a first start or a shared model pool wait took longer than the plan commits to, while the tenant was within its own limits and share"},
}

// Classify returns the classification of an event of cause c: the class of its row
// in Rules. A cause no row names is classified as its nearest row would be: the
// platform's is an eligible_breach, the tenant's follows its threshold.
func Classify(c Cause) Classification {
	c = normalize(c)
	for _, r := range Rules {
		if r.Cause == c {
			return r.Class
		}
	}
	switch {
	case c.By == LimitedByPlatform:
		return EligibleBreach
	case c.Threshold >= 100:
		return EnforcedLimit
	case c.Threshold >= 90:
		return AtRisk
	default:
		return Informational
	}
}

// normalize rounds a threshold down to the table's (80, 90, 100) and gives a warning
// (below 100) its only limiter and how: a warning limits nothing yet.
func normalize(c Cause) Cause {
	switch {
	case c.Threshold >= 100:
		c.Threshold = 100
	case c.Threshold >= 90:
		return Cause{90, LimitedByTenant, HowNone}
	default:
		return Cause{80, LimitedByTenant, HowNone}
	}
	if c.By == "" {
		c.By = LimitedByTenant
	}
	if c.How == "" {
		c.How = HowRefused
	}
	return c
}

// causeOf is the cause of a refusal's limit_hit.
func causeOf(r Refusal) Cause {
	c := Cause{Threshold: 100, By: LimitedByTenant, How: How(r.Enforcement)}
	if r.Enforcement == "" {
		c.How = HowRefused
	}
	if r.Platform {
		c.By = LimitedByPlatform
	}
	return c
}
