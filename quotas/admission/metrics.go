package admission

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/agentq/agentq/quotas"
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
	for _, o := range []string{quotas.OutcomeAdmitted, quotas.OutcomeOutOfScope, quotas.OutcomeError} {
		c.Add(ctx, 0, a.attrs(o, "none"))
	}
	for _, lt := range quotas.LimitTypes {
		if lt == quotas.AITokensPerMinute { // reserved by the worker per step: admission never refuses by it
			continue
		}
		c.Add(ctx, 0, a.attrs(quotas.OutcomeRefused, lt))
	}
	return a
}

func (admissionCounter) attrs(outcome, limitType string) metric.AddOption {
	return metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", outcome), attribute.String("limit_type", limitType)))
}

func (a admissionCounter) record(ctx context.Context, d quotas.Decision, err error) {
	ctx = context.WithoutCancel(ctx)
	switch {
	case err != nil:
		a.c.Add(ctx, 1, a.attrs(quotas.OutcomeError, "none"))
	case d.OutOfScope:
		a.c.Add(ctx, 1, a.attrs(quotas.OutcomeOutOfScope, "none"))
	case d.Allowed:
		a.c.Add(ctx, 1, a.attrs(quotas.OutcomeAdmitted, "none"))
	case len(d.Violated) == 0:
		a.c.Add(ctx, 1, a.attrs(quotas.OutcomeRefused, "unknown"))
	default:
		for _, lt := range d.Violated {
			a.c.Add(ctx, 1, a.attrs(quotas.OutcomeRefused, lt))
		}
	}
}
