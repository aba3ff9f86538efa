package quotas

import (
	"fmt"
	"time"

	"gopkg.in/yaml.v3"
)

// The override keys of a plan's commitments (SLA): a number of seconds above 0, or
// unlimited (no commitment).
const (
	SLAStartWithin    = "sla_start_within_s"
	SLAPoolWaitWithin = "sla_pool_wait_within_s"
)

// SLAKeys are the commitments' override keys, in the order they are listed.
var SLAKeys = []string{SLAStartWithin, SLAPoolWaitWithin}

// SLA is what a plan commits to, in seconds; an Off (unlimited) field is no
// commitment. StartWithinS: a task's first start comes at most this long after its
// creation. PoolWaitWithinS: a step waits at most this long for a shared model pool.
// Either holds only while the tenant is within its own limits and share: a wait its
// own running cap, flood or token rate caused is not the platform's (docs/limits.md).
type SLA struct {
	StartWithinS    Limit `yaml:"start_within_s" json:"start_within_s"`
	PoolWaitWithinS Limit `yaml:"pool_wait_within_s" json:"pool_wait_within_s"`
}

// NoSLA commits to nothing: a plan without an sla entry.
var NoSLA = SLA{StartWithinS: Unlimited, PoolWaitWithinS: Unlimited}

// UnmarshalYAML reads sla: {start_within_s, pool_wait_within_s}; a field left out is
// no commitment.
func (s *SLA) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k := n.Content[i].Value; k != "start_within_s" && k != "pool_wait_within_s" {
				return fmt.Errorf("line %d: sla: unknown field %q (want start_within_s and pool_wait_within_s)", n.Content[i].Line, k)
			}
		}
	}
	type plain SLA
	p := plain(NoSLA)
	if err := n.Decode(&p); err != nil {
		return err
	}
	*s = SLA(p)
	return s.validate()
}

func (s SLA) validate() error {
	for k, v := range map[string]Limit{"start_within_s": s.StartWithinS, "pool_wait_within_s": s.PoolWaitWithinS} {
		if err := checkCommitment(k, v); err != nil {
			return err
		}
	}
	return nil
}

// checkCommitment: a commitment is a number of seconds above 0, or unlimited. 0 would
// promise a start (or a pool grant) before any dispatch can happen.
func checkCommitment(name string, v Limit) error {
	if v.Off() && v != Unlimited || !v.Off() && !(v > 0) {
		return fmt.Errorf("%s must be a number of seconds above 0, or unlimited", name)
	}
	return nil
}

// Within returns the commitment as a duration; ok=false when there is none.
func Within(v Limit) (d time.Duration, ok bool) {
	if v.Off() {
		return 0, false
	}
	return time.Duration(float64(v) * float64(time.Second)), true
}

// Commitments returns the plan's commitments: NoSLA when it has none.
func (p Plan) Commitments() SLA {
	if p.SLA == nil {
		return NoSLA
	}
	return *p.SLA
}

// SLAOf returns a plan's commitments with a tenant's sla_* overrides applied; NoSLA
// for an unknown plan.
func (c *Catalogue) SLAOf(plan string, overrides map[string]Limit) SLA {
	p, ok := c.plans[plan]
	if !ok {
		return NoSLA
	}
	s := p.Commitments()
	if v, ok := overrides[SLAStartWithin]; ok {
		s.StartWithinS = v
	}
	if v, ok := overrides[SLAPoolWaitWithin]; ok {
		s.PoolWaitWithinS = v
	}
	return s
}
