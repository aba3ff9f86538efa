package quotas

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Outcomes of a task admission, the outcome label of agentq.admissions.
const (
	OutcomeAdmitted   = "admitted"     // every limit passed (limit_type "none")
	OutcomeRefused    = "refused"      // refused; limit_type names the limit, once per limit that refused it
	OutcomeOutOfScope = "out_of_scope" // the key may not run this agent or act for this user
	OutcomeError      = "error"        // no decision: the limits could not be checked (a 503)
)

// admissionCounter counts task admissions (agentq.admissions, Prometheus
// agentq_admissions_total) by outcome and limit_type.
type admissionCounter struct{ c metric.Int64Counter }

func newAdmissionCounter(mp metric.MeterProvider) admissionCounter {
	c, _ := mp.Meter("github.com/agentq/agentq/quotas").Int64Counter("agentq.admissions",
		metric.WithUnit("{admission}"),
		metric.WithDescription("Task admissions by outcome (admitted, refused, out_of_scope, error) and, for a refusal, the limit_type that refused it; a submission refused by several limits counts once per limit"))
	a := admissionCounter{c: c}
	// Every series a dashboard or an alert may ask for exists from the start, at 0.
	ctx := context.Background()
	for _, o := range []string{OutcomeAdmitted, OutcomeOutOfScope, OutcomeError} {
		c.Add(ctx, 0, a.attrs(o, "none"))
	}
	for _, lt := range LimitTypes {
		if lt == AITokensPerMinute { // reserved by the worker per step: admission never refuses by it
			continue
		}
		c.Add(ctx, 0, a.attrs(OutcomeRefused, lt))
	}
	return a
}

func (admissionCounter) attrs(outcome, limitType string) metric.AddOption {
	return metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", outcome), attribute.String("limit_type", limitType)))
}

func (a admissionCounter) record(ctx context.Context, d Decision, err error) {
	ctx = context.WithoutCancel(ctx)
	switch {
	case err != nil:
		a.c.Add(ctx, 1, a.attrs(OutcomeError, "none"))
	case d.OutOfScope:
		a.c.Add(ctx, 1, a.attrs(OutcomeOutOfScope, "none"))
	case d.Allowed:
		a.c.Add(ctx, 1, a.attrs(OutcomeAdmitted, "none"))
	case len(d.Violated) == 0:
		a.c.Add(ctx, 1, a.attrs(OutcomeRefused, "unknown"))
	default:
		for _, lt := range d.Violated {
			a.c.Add(ctx, 1, a.attrs(OutcomeRefused, lt))
		}
	}
}
