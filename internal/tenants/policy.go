// Package tenants is the tenant domain service: the rules a tenant must satisfy
// (id, name, plan, weight, limit overrides, status), the writes that create and change
// tenants, and the Policy that turns a tenant row and the plan catalogue into what the
// rest of agentq enforces (fair-share weight, limits, running cap, task budget). The
// HTTP API, the CLI and the runtime all go through it, so they apply the same rules.
package tenants

import (
	"maps"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/quotas"
)

// Policy is what a tenant is held to: its plan with the tenant's own weight and limit
// overrides applied.
type Policy struct {
	// Weight is the tenant's fair-share weight: its own when set, else its plan's.
	Weight int
	// Effective is the plan's limits with the tenant's overrides applied, by name.
	Effective map[string]quotas.Limit
	// Limits is Effective in the form admission enforces.
	Limits quotas.Limits
	// RunningCap is the dispatcher's cap on the tenant's running tasks; 0 is no cap.
	RunningCap int
	// Budget is the plan's per-task budget: the default a task gets, the ceiling it
	// may ask for.
	Budget quotas.Budget
	// Tree is the plan's budget of a task tree: the default a root gets, the
	// ceiling it may ask for.
	Tree quotas.TreeBudgets
	// MaxRepeatSteps bounds the steps in a row that may answer the same state and
	// output (the plan's, or quotas.DefaultMaxRepeatSteps).
	MaxRepeatSteps int
	// OnLimit is the plan's answer to a step that would go past a budget or a period
	// quota (stop or pause), and PauseTimeout how long a paused task waits.
	OnLimit      quotas.OnLimits
	PauseTimeout time.Duration
	// SLA is what the plan commits to, with the tenant's sla_* overrides applied.
	SLA quotas.SLA
}

// PolicyOf computes t's policy from the catalogue (with the deployment's global
// limits already applied). When the catalogue lacks t's plan it returns the error of
// quotas.Catalogue.Effective and a Policy whose only field set is Weight (the
// tenant's own, or 1), so a tenant whose plan was removed can still be shown.
func PolicyOf(plans *quotas.Catalogue, t Tenant) (Policy, error) {
	w := 1
	p, ok := plans.Plan(t.Plan)
	if ok {
		w = p.Weight
	}
	if t.Weight != nil {
		w = *t.Weight
	}
	eff, err := plans.Effective(t.Plan, t.Overrides)
	if err != nil {
		return Policy{Weight: w, SLA: quotas.NoSLA}, err
	}
	return Policy{
		Weight:         w,
		Effective:      eff,
		Limits:         quotas.LimitsOf(eff),
		RunningCap:     quotas.RunningCap(eff),
		Budget:         p.Budget,
		Tree:           p.Tree,
		MaxRepeatSteps: p.RepeatSteps(),
		OnLimit:        p.OnLimit,
		// PauseTimeout is the plan's, or the default when the plan is missing.
		PauseTimeout: p.PauseTimeout(),
		SLA:          plans.SLAOf(t.Plan, t.Overrides),
	}, nil
}

// Policies gives tenants' policies as PolicyOf does, remembering each tenant's last
// one: a submission, its request's limits and each of its task's steps all need the
// policy, and working it out builds the limits anew each time (under load, the
// largest allocation of agentq's own code). A remembered policy is used while the
// tenant's plan, weight and overrides are those it was worked out from; a tenant value
// without an id is worked out each time.
//
// The policies it returns are shared: their Effective maps must not be written to.
type Policies struct {
	plans *quotas.Catalogue
	memo  *lru.Cache[string, memoPolicy]
}

// memoPolicy is a policy and what it was worked out from.
type memoPolicy struct {
	plan      string
	weight    *int
	overrides map[string]quotas.Limit // a copy: the caller's map may change later
	policy    Policy
	err       error
}

// NewPolicies returns a Policies over plans remembering up to size tenants (at least
// one), the least recently used forgotten first.
func NewPolicies(plans *quotas.Catalogue, size int) *Policies {
	memo, _ := lru.New[string, memoPolicy](max(size, 1)) // errs only for size < 1
	return &Policies{plans: plans, memo: memo}
}

// Policy is PolicyOf(plans, t), remembered for t.
func (p *Policies) Policy(t Tenant) (Policy, error) {
	if t.ID == "" {
		return PolicyOf(p.plans, t)
	}
	if m, ok := p.memo.Get(t.ID); ok && m.plan == t.Plan && sameWeight(m.weight, t.Weight) && maps.Equal(m.overrides, t.Overrides) {
		return m.policy, m.err
	}
	pol, err := PolicyOf(p.plans, t)
	var weight *int
	if t.Weight != nil {
		weight = new(*t.Weight)
	}
	p.memo.Add(t.ID, memoPolicy{plan: t.Plan, weight: weight, overrides: maps.Clone(t.Overrides), policy: pol, err: err})
	return pol, err
}

func sameWeight(a, b *int) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }

// LoadCatalogue loads the deployment's plan catalogue (cfg.PlansFile, or the built-in
// one) and applies the global limit values of cfg, as the server does: every process
// that judges tenants must see the same plans.
func LoadCatalogue(cfg config.Config) (*quotas.Catalogue, error) {
	plans, err := quotas.LoadCatalogue(cfg.PlansFile)
	if err != nil {
		return nil, err
	}
	if err := plans.ApplyGlobals(quotas.Globals{
		KeyRPS: cfg.RateKeyRPS, KeyBurst: cfg.RateKeyBurst, TenantRPS: cfg.RateTenantRPS,
		TenantBurst: cfg.RateTenantBurst, TenantMaxInflight: cfg.TenantMaxInflight,
	}); err != nil {
		return nil, err
	}
	return plans, nil
}
