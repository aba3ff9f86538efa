package quotas

import (
	_ "embed"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Limit types. Override keys are these names, or a rate's name
// followed by "_burst".
const (
	KeyRate             = "key_rate"
	TenantRate          = "tenant_rate"
	KeyAgentRate        = "key_agent_rate"
	UserTasksHourly     = "user_tasks_hourly"
	ConcurrentSessions  = "concurrent_sessions"
	InflightRequests    = "inflight_requests"
	LongRunningInflight = "long_running_inflight"
	QueueBacklog        = "queue_backlog"
	Running             = "running"
	AgentStepsDaily     = "agent_steps_daily"
	AITokensMonthly     = "ai_tokens_monthly"
	USDMonthly          = "usd_monthly"
	// AITokensPerMinute is a token bucket in tokens (burst: one minute's worth unless
	// "ai_tokens_per_minute_burst" says otherwise), reserved before every step; a step
	// that cannot reserve waits instead of failing.
	AITokensPerMinute = "ai_tokens_per_minute"
	// WebhookEndpoints is how many webhook endpoints of its own a tenant may have
	// (POST /v1/webhooks): a count of things it keeps, checked where they are made,
	// not by admission.
	WebhookEndpoints = "webhook_endpoints"
	// PausedTasks is how many tasks of a tenant's may be paused at once: a count of
	// things it keeps, checked where a task pauses. A task that meets a limit while
	// its tenant has that many paused stops there (budget_exceeded) instead.
	PausedTasks = "paused_tasks"
)

// LimitTypes lists every limit type, in the order the usage API reports them.
var LimitTypes = []string{
	KeyRate, TenantRate, KeyAgentRate, UserTasksHourly, ConcurrentSessions, InflightRequests,
	LongRunningInflight, QueueBacklog, Running, AgentStepsDaily, AITokensMonthly, USDMonthly, AITokensPerMinute,
}

// CountLimitTypes are the limits on what a tenant keeps, counted where it is made
// rather than by admission: overridable like the others, absent from admission,
// its metrics and the usage report's admission scopes.
var CountLimitTypes = []string{WebhookEndpoints, PausedTasks}

// bursty are the token-bucket limits that take a "<name>_burst" override.
var bursty = []string{KeyRate, TenantRate, KeyAgentRate, UserTasksHourly, AITokensPerMinute}

//go:embed plans.yaml
var defaultPlans []byte

// BudgetRequest is the budget a submission asks for: nil fields take the plan's
// default, and none may exceed the plan's ceiling. The task service resolves it to a
// TaskBudget; the Go library takes it as it is (agentq.TaskBudget).
type BudgetRequest struct {
	MaxSteps      *int
	MaxWallclockS *float64
	MaxCostUSD    *float64
}

// TaskBudget is one task's budget. Every field is a cap and is above 0: a task
// always runs with all three.
type TaskBudget struct {
	MaxSteps      int     `yaml:"max_steps" json:"max_steps"`
	MaxWallclockS float64 `yaml:"max_wallclock_s" json:"max_wallclock_s"`
	MaxCostUSD    float64 `yaml:"max_cost_usd" json:"max_cost_usd"`
}

// Budget is a plan's per-task budget: Default is what a task gets for the fields it
// does not ask for, Ceiling the most it may ask for.
type Budget struct {
	Default TaskBudget `yaml:"default" json:"default"`
	Ceiling TaskBudget `yaml:"ceiling" json:"ceiling"`
}

// MaxDefaultWallclock bounds a plan's default wall clock: a task that asks for
// nothing is never long-running, so it is stopped at LongRunningThreshold at the
// latest.
const MaxDefaultWallclock = LongRunningThreshold

// UnmarshalYAML reads budget: {default: {...}, ceiling: {...}}; a budget's limits
// written directly under it (budget: {max_steps: ...}) get an error that shows the
// shape, not a bare unknown-field error.
func (b *Budget) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			switch k := n.Content[i].Value; k {
			case "default", "ceiling":
			case "max_steps", "max_wallclock_s", "max_cost_usd":
				return fmt.Errorf("line %d: budget.%s: a budget holds a default and a ceiling: "+
					"budget: {default: {max_steps, max_wallclock_s, max_cost_usd}, ceiling: {...}}", n.Content[i].Line, k)
			default:
				return fmt.Errorf("line %d: budget: unknown field %q (want default and ceiling)", n.Content[i].Line, k)
			}
		}
	}
	type plain Budget
	var p plain
	if err := n.Decode(&p); err != nil {
		return err
	}
	*b = Budget(p)
	return nil
}

// validate checks that every field of the default and the ceiling is set, that the
// default is within the ceiling, and that the default wall clock is not long-running.
func (b Budget) validate() error {
	for _, part := range []struct {
		name string
		tb   TaskBudget
	}{{"default", b.Default}, {"ceiling", b.Ceiling}} {
		switch tb := part.tb; {
		case tb.MaxSteps < 1:
			return fmt.Errorf("budget.%s.max_steps must be at least 1 (every task has a step cap)", part.name)
		case !(tb.MaxWallclockS > 0) || math.IsInf(tb.MaxWallclockS, 0):
			return fmt.Errorf("budget.%s.max_wallclock_s must be a number above 0 (every task has a wall clock cap)", part.name)
		case !(tb.MaxCostUSD > 0) || math.IsInf(tb.MaxCostUSD, 0):
			return fmt.Errorf("budget.%s.max_cost_usd must be a number above 0 (every task has a cost cap)", part.name)
		}
	}
	d, c := b.Default, b.Ceiling
	switch {
	case d.MaxSteps > c.MaxSteps:
		return fmt.Errorf("budget.default.max_steps %d is above the ceiling's %d", d.MaxSteps, c.MaxSteps)
	case d.MaxWallclockS > c.MaxWallclockS:
		return fmt.Errorf("budget.default.max_wallclock_s %g is above the ceiling's %g", d.MaxWallclockS, c.MaxWallclockS)
	case d.MaxCostUSD > c.MaxCostUSD:
		return fmt.Errorf("budget.default.max_cost_usd %g is above the ceiling's %g", d.MaxCostUSD, c.MaxCostUSD)
	case d.MaxWallclockS > MaxDefaultWallclock.Seconds():
		return fmt.Errorf("budget.default.max_wallclock_s %g is above %g: a task that asks for nothing must not be long-running",
			d.MaxWallclockS, MaxDefaultWallclock.Seconds())
	}
	return nil
}

// Fill completes a stored task budget: a field that is not above 0 (a task stored
// before every budget had all three fields) takes the plan's default, so no task runs
// without a cap.
func (b Budget) Fill(tb TaskBudget) TaskBudget {
	if tb.MaxSteps < 1 {
		tb.MaxSteps = b.Default.MaxSteps
	}
	if !(tb.MaxWallclockS > 0) {
		tb.MaxWallclockS = b.Default.MaxWallclockS
	}
	if !(tb.MaxCostUSD > 0) {
		tb.MaxCostUSD = b.Default.MaxCostUSD
	}
	return tb
}

// Plan is one entry of the catalogue.
type Plan struct {
	Name   string           `yaml:"-"`
	Weight int              `yaml:"weight"`
	Limits map[string]Limit `yaml:"limits"`
	Budget Budget           `yaml:"budget"`
	// Tree is the plan's budget of a task tree (a root and what it spawns).
	Tree TreeBudgets `yaml:"tree"`
	// MaxRepeatSteps is how many steps in a row may answer the same state and
	// output before the task ends failed, loop_detected (0: DefaultMaxRepeatSteps).
	MaxRepeatSteps int `yaml:"max_repeat_steps"`
	// SLA is what the plan commits to (nil: nothing); see Commitments.
	SLA *SLA `yaml:"sla"`
	// OnLimit is what a step that would go past its task's budget or its tenant's
	// period quota does to the task, per limit: OnLimitStop ends it
	// budget_exceeded, OnLimitPause pauses it. Unset is OnLimitStop.
	OnLimit OnLimits `yaml:"on_limit"`
	// PauseTimeoutS is how long a task may stay paused before it ends
	// budget_exceeded; 0 is DefaultPauseTimeout.
	PauseTimeoutS float64 `yaml:"pause_timeout_s"`
}

// OnLimit is a plan's answer to a step that would go past a limit of its task's
// budget or its tenant's period quotas.
type OnLimit string

// The answers: stop ends the task budget_exceeded; pause keeps its state and usage,
// gives back its worker, running slot and session, and waits for a resume.
const (
	OnLimitStop  OnLimit = "stop"
	OnLimitPause OnLimit = "pause"
)

// PausableLimits are the limits a plan's on_limit may name: a task's own budget's and
// its tenant's period quotas, which a step meets before it runs.
var PausableLimits = []string{TaskMaxSteps, TaskMaxCostUSD, TaskMaxWallclock, AgentStepsDaily, AITokensMonthly, USDMonthly}

// OnLimits is a plan's answer at each limit: Default for every limit By does not
// name. In the catalogue it is one word (on_limit: pause) or a map
// (on_limit: {default: pause, task_max_steps: stop}).
type OnLimits struct {
	Default OnLimit
	By      map[string]OnLimit
}

// For is the answer at limitType.
func (o OnLimits) For(limitType string) OnLimit {
	if a, ok := o.By[limitType]; ok {
		return a
	}
	if o.Default == "" {
		return OnLimitStop
	}
	return o.Default
}

// UnmarshalYAML reads one word or a map of "default" and limit types to words.
func (o *OnLimits) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		return n.Decode(&o.Default)
	}
	var m map[string]OnLimit
	if err := n.Decode(&m); err != nil {
		return fmt.Errorf("line %d: on_limit: want stop, pause or a map of limit types to them", n.Line)
	}
	o.Default = m["default"]
	delete(m, "default")
	o.By = m
	return nil
}

// MarshalYAML writes what UnmarshalYAML reads: one word when By names no limit, else
// the map.
func (o OnLimits) MarshalYAML() (any, error) {
	if len(o.By) == 0 {
		return o.Default, nil
	}
	m := make(map[string]OnLimit, len(o.By)+1)
	maps.Copy(m, o.By)
	if o.Default != "" {
		m["default"] = o.Default
	}
	return m, nil
}

// DefaultPauseTimeout is how long a task stays paused when its plan does not say.
const DefaultPauseTimeout = 24 * time.Hour

// MaxPauseTimeout bounds a plan's pause_timeout_s: a paused task's approval link
// lives as long as its pause may, and a link valid for more than a month is one
// nobody remembers handing out.
const MaxPauseTimeout = 30 * 24 * time.Hour

// PauseTimeout is how long a task of the plan may stay paused.
func (p Plan) PauseTimeout() time.Duration {
	if p.PauseTimeoutS <= 0 {
		return DefaultPauseTimeout
	}
	return time.Duration(p.PauseTimeoutS * float64(time.Second))
}

// RepeatSteps is how many steps in a row of a task of the plan may answer the same
// state and output: its max_repeat_steps, else DefaultMaxRepeatSteps.
func (p Plan) RepeatSteps() int {
	if p.MaxRepeatSteps <= 0 {
		return DefaultMaxRepeatSteps
	}
	return p.MaxRepeatSteps
}

// validatePause checks on_limit and pause_timeout_s.
func (p Plan) validatePause() error {
	valid := func(a OnLimit) bool { return a == "" || a == OnLimitStop || a == OnLimitPause }
	if !valid(p.OnLimit.Default) {
		return fmt.Errorf("on_limit %q: want stop or pause", p.OnLimit.Default)
	}
	for k, a := range p.OnLimit.By {
		if !slices.Contains(PausableLimits, k) {
			return fmt.Errorf("on_limit.%s: not a limit a task pauses at (want default or one of %s)", k, strings.Join(PausableLimits, ", "))
		}
		if a == "" || !valid(a) {
			return fmt.Errorf("on_limit.%s %q: want stop or pause", k, a)
		}
	}
	if p.PauseTimeoutS < 0 || math.IsNaN(p.PauseTimeoutS) || p.PauseTimeoutS > MaxPauseTimeout.Seconds() {
		return fmt.Errorf("pause_timeout_s %g: want 0 (the default, %s) to %g seconds", p.PauseTimeoutS, DefaultPauseTimeout, MaxPauseTimeout.Seconds())
	}
	return nil
}

// Catalogue is the set of plans a deployment offers.
type Catalogue struct {
	plans map[string]Plan
	// stricter lists, per plan, the limits a global value (ApplyGlobals) made
	// stricter than the plan's own: their refusals are the platform's, not the plan's.
	stricter map[string]map[string]bool
}

// LoadCatalogue reads the plan catalogue from path, or the embedded default when path
// is empty.
func LoadCatalogue(path string) (*Catalogue, error) {
	data := defaultPlans
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("quotas: plans file: %w", err)
		}
		data = b
	}
	return ParseCatalogue(data)
}

// ParseCatalogue parses a YAML plan catalogue.
func ParseCatalogue(data []byte) (*Catalogue, error) {
	var doc struct {
		Plans map[string]Plan `yaml:"plans"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("quotas: plans: %w", err)
	}
	if len(doc.Plans) == 0 {
		return nil, fmt.Errorf("quotas: plans: the catalogue defines no plan")
	}
	c := &Catalogue{plans: make(map[string]Plan, len(doc.Plans))}
	for name, p := range doc.Plans {
		if err := ValidateOverrides(p.Limits); err != nil {
			return nil, fmt.Errorf("quotas: plan %q: %w", name, err)
		}
		for _, k := range SLAKeys {
			if _, ok := p.Limits[k]; ok {
				return nil, fmt.Errorf("quotas: plan %q: %s is a tenant override; a plan's commitments are its sla entry", name, k)
			}
		}
		if p.Weight < 1 {
			p.Weight = 1
		}
		if err := p.Budget.validate(); err != nil {
			return nil, fmt.Errorf("quotas: plan %q: %w", name, err)
		}
		p.Tree = p.Tree.withDefaults(p.Budget)
		if err := p.Tree.validate(); err != nil {
			return nil, fmt.Errorf("quotas: plan %q: %w", name, err)
		}
		if err := p.validatePause(); err != nil {
			return nil, fmt.Errorf("quotas: plan %q: %w", name, err)
		}
		p.Name = name
		c.plans[name] = p
	}
	return c, nil
}

// Plan returns the named plan.
func (c *Catalogue) Plan(name string) (Plan, bool) {
	p, ok := c.plans[name]
	return p, ok
}

// Names lists the plans, sorted.
func (c *Catalogue) Names() []string {
	names := make([]string, 0, len(c.plans))
	for n := range c.plans {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Effective returns a plan's limits with a tenant's overrides applied.
func (c *Catalogue) Effective(plan string, overrides map[string]Limit) (map[string]Limit, error) {
	p, ok := c.plans[plan]
	if !ok {
		return nil, fmt.Errorf("quotas: unknown plan %q", plan)
	}
	out := make(map[string]Limit, len(p.Limits)+len(overrides))
	for k, v := range p.Limits {
		out[k] = v
	}
	for k, v := range overrides {
		out[k] = v
	}
	return out, nil
}

// ValidOverride reports whether name is a limit type, a bursty limit's "_burst" key
// or a commitment (SLAKeys).
func ValidOverride(name string) bool {
	if slices.Contains(LimitTypes, name) || slices.Contains(CountLimitTypes, name) || slices.Contains(SLAKeys, name) {
		return true
	}
	base, ok := strings.CutSuffix(name, "_burst")
	return ok && slices.Contains(bursty, base)
}

// ValidateOverrides checks limit names and values: known names, values >= 0 or
// unlimited. A burst is a number of at least 1 (it is not a limit of its own), and
// running is at least 1: the dispatcher knows no cap of 0, and concurrent_sessions 0
// is the way to admit nothing.
func ValidateOverrides(m map[string]Limit) error {
	for k, v := range m {
		if !ValidOverride(k) {
			return fmt.Errorf("unknown limit %q", k)
		}
		switch {
		case v < 0 && v != Unlimited:
			return fmt.Errorf("limit %q is negative", k)
		case strings.HasSuffix(k, "_burst") && v < 1:
			return fmt.Errorf("%s must be a number of at least 1", k)
		case slices.Contains(SLAKeys, k):
			if err := checkCommitment(k, v); err != nil {
				return err
			}
		case k == Running && v >= 0 && v < 1:
			return fmt.Errorf("running must be at least 1, or unlimited")
		case k == InflightRequests && v >= 0 && v < 1:
			// 0 would refuse every request of the tenant, /v1/usage included
			return fmt.Errorf("inflight_requests must be at least 1, or unlimited")
		case k == AITokensPerMinute && v >= 0 && v < 1:
			// a bucket that never fills would keep every step waiting for good;
			// ai_tokens_monthly 0 is the way to allow no tokens
			return fmt.Errorf("ai_tokens_per_minute must be at least 1, or unlimited")
		}
	}
	return nil
}

// Globals are deployment-wide limit values from the environment
// (AGENTQ_RATE_KEY_RPS, AGENTQ_RATE_KEY_BURST, AGENTQ_RATE_TENANT_RPS,
// AGENTQ_RATE_TENANT_BURST, AGENTQ_TENANT_MAX_INFLIGHT). A set value replaces that
// limit in every plan; tenant overrides still win. nil leaves the plans' values.
// These keep the convention of the gateway they come from: 0 disables the limit (a
// burst of 0 means the default burst), unlike the catalogue, where 0 is a limit.
type Globals struct {
	KeyRPS, KeyBurst, TenantRPS, TenantBurst, TenantMaxInflight *float64
}

// ApplyGlobals sets the global values into every plan and checks the result: a plan
// may not disable key limits while its tenant limit is on (an unlimited key could
// spend the whole tenant's bucket).
func (c *Catalogue) ApplyGlobals(g Globals) error {
	set := map[string]*float64{
		KeyRate: g.KeyRPS, KeyRate + "_burst": g.KeyBurst, TenantRate: g.TenantRPS,
		TenantRate + "_burst": g.TenantBurst, ConcurrentSessions: g.TenantMaxInflight,
	}
	for name, p := range c.plans {
		limits := make(map[string]Limit, len(p.Limits))
		for k, v := range p.Limits {
			limits[k] = v
		}
		for k, v := range set {
			switch {
			case v == nil:
			case *v < 0:
				return fmt.Errorf("quotas: %s must not be negative", k)
			case *v == 0 && strings.HasSuffix(k, "_burst"):
				delete(limits, k) // the default burst
			case *v == 0:
				limits[k] = Unlimited
			default:
				if own, ok := p.Limits[k]; !ok || own.Off() || Limit(*v) < own {
					c.markStricter(name, strings.TrimSuffix(k, "_burst"))
				}
				limits[k] = Limit(*v)
			}
		}
		if KeyLimitsOffAlone(limits) {
			return fmt.Errorf("quotas: plan %q disables key limits (key_rate unlimited) while its tenant limit is on: "+
				"set AGENTQ_RATE_KEY_RPS above 0 or disable tenant limits too", name)
		}
		p.Limits = limits
		c.plans[name] = p
	}
	return nil
}

func (c *Catalogue) markStricter(plan, limit string) {
	if c.stricter == nil {
		c.stricter = map[string]map[string]bool{}
	}
	if c.stricter[plan] == nil {
		c.stricter[plan] = map[string]bool{}
	}
	c.stricter[plan][limit] = true
}

// ByPlatform reports whether a refusal by limit of a tenant on plan with overrides
// is the platform's: a global value (ApplyGlobals) made the limit (or its burst)
// stricter than the plan's own, and the tenant has no override of it (an override is
// the tenant's own limit, whatever the global value).
func (c *Catalogue) ByPlatform(plan string, overrides map[string]Limit, limit string) bool {
	if !c.stricter[plan][limit] {
		return false
	}
	_, own := overrides[limit]
	_, ownBurst := overrides[limit+"_burst"]
	return !own && !ownBurst
}

// RunningCap is the dispatcher's running cap for effective limits: the running limit,
// or 0 (the dispatcher's "no cap") when it is unlimited. A running limit is at least 1.
func RunningCap(eff map[string]Limit) int {
	if v := lookup(eff, Running); !v.Off() {
		return max(1, int(v))
	}
	return 0
}

// KeyLimitsOffAlone reports whether effective limits turn key limits off while the
// tenant limit is on: one unlimited key could then spend the whole tenant's bucket.
func KeyLimitsOffAlone(eff map[string]Limit) bool {
	return lookup(eff, KeyRate).Off() && !lookup(eff, TenantRate).Off()
}

// NextLimit returns the smallest value of limit above current among the plans, for
// "upgrade for N" messages; unlimited is above every number. ok=false when no plan
// offers more.
func (c *Catalogue) NextLimit(limit string, current float64) (Limit, bool) {
	rank := func(v Limit) float64 {
		if v.Off() {
			return math.Inf(1)
		}
		return float64(v)
	}
	var best Limit
	ok := false
	for _, p := range c.plans {
		v := lookup(p.Limits, limit)
		if rank(v) > current && (!ok || rank(v) < rank(best)) {
			best, ok = v, true
		}
	}
	return best, ok
}
