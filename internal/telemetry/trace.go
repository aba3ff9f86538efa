package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"
)

// ChildrenOnly wraps tp so that its tracers start a span only inside a sampled one.
// The Redis and Postgres instrumentation use it: their calls are traced as part of a
// request, a dispatch or a step that is traced, while the background polling of the
// workers and services (asynq looks for work every few milliseconds) makes no root
// spans of its own, and the calls of an unsampled request cost no span each (a span
// the sampler drops still takes ids and its attributes).
func ChildrenOnly(tp trace.TracerProvider) trace.TracerProvider { return childrenOnly{tp: tp} }

type childrenOnly struct {
	embedded.TracerProvider
	tp trace.TracerProvider
}

func (c childrenOnly) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return childTracer{t: c.tp.Tracer(name, opts...)}
}

type childTracer struct {
	embedded.Tracer
	t trace.Tracer
}

var noopTracer = noop.NewTracerProvider().Tracer("")

// Start starts a span of the wrapped tracer inside a sampled span. Outside one it
// starts nothing and passes the parent's span context on: under a span that does not
// record (the common case: sampled out), ctx and that span come back as they are (its
// methods do nothing), so that a call allocates nothing; under an unsampled span that
// records, ctx gets a span that does nothing (ending it must not end its parent).
func (c childTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.SpanContext().IsSampled() {
		if !parent.IsRecording() {
			return ctx, parent
		}
		return noopTracer.Start(ctx, name, opts...)
	}
	return c.t.Start(ctx, name, opts...)
}

// TraceParent is the W3C traceparent of the span in ctx ("" without one): what a
// task carries from its submission to its dispatch and from there to its worker.
func TraceParent(ctx context.Context) string {
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c["traceparent"]
}

// WithTraceParent is ctx with the remote span a traceparent names as its parent;
// ctx as it is when tp is empty or malformed.
func WithTraceParent(ctx context.Context, tp string) context.Context {
	if tp == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": tp})
}
