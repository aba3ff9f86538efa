package telemetry

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func TestExportOnlyWhenAsked(t *testing.T) {
	cases := []struct {
		env            map[string]string
		traces, metric bool
	}{
		{nil, false, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, true, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1"}, true, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_METRICS_EXPORTER": "none"}, true, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"}, false, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console"}, true, false},
	}
	for _, c := range cases {
		tel, err := Setup(context.Background(), Config{Getenv: func(k string) string { return c.env[k] }})
		if err != nil {
			t.Fatalf("%v: %v", c.env, err)
		}
		if tel.TracesExported != c.traces || tel.MetricsExported != c.metric {
			t.Errorf("%v: traces %v metrics %v, want %v %v", c.env, tel.TracesExported, tel.MetricsExported, c.traces, c.metric)
		}
		if tel.MetricsHandler() == nil {
			t.Errorf("%v: no /metrics handler", c.env)
		}
		_ = tel.Shutdown(context.Background())
	}
}

func TestChildrenOnlyAndTraceParent(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	calls := ChildrenOnly(tp).Tracer("calls")
	_, s := calls.Start(context.Background(), "root call")
	s.End()
	if n := len(exp.GetSpans()); n != 0 {
		t.Fatalf("a call outside any span made %d spans", n)
	}
	ctx, parent := tp.Tracer("t").Start(context.Background(), "request")
	_, s = calls.Start(ctx, "call")
	s.End()
	tpHeader := TraceParent(ctx)
	parent.End()
	if n := len(exp.GetSpans()); n != 2 {
		t.Fatalf("want the request and its call, got %d spans", n)
	}
	// The carried traceparent makes the next hop a child of the request.
	_, child := tp.Tracer("t").Start(WithTraceParent(context.Background(), tpHeader), "dispatch")
	child.End()
	got := exp.GetSpans()[2]
	if got.Parent.SpanID() != parent.SpanContext().SpanID() || got.SpanContext.TraceID() != parent.SpanContext().TraceID() {
		t.Errorf("dispatch span's parent %v, want %v", got.Parent, parent.SpanContext())
	}
}

// Inside a span the sampler dropped, a call makes no span at all: it passes the
// request's context on (its trace id) and costs no ids or attributes.
func TestChildrenOnlyMakesNoSpanInsideAnUnsampledOne(t *testing.T) {
	ids := &countingIDs{}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()), sdktrace.WithIDGenerator(ids))
	ctx, req := tp.Tracer("t").Start(context.Background(), "request")
	defer req.End()
	if !req.SpanContext().IsValid() || req.SpanContext().IsSampled() {
		t.Fatalf("the request's span context %v, want valid and not sampled", req.SpanContext())
	}
	_, call := ChildrenOnly(tp).Tracer("calls").Start(ctx, "call")
	call.End()
	if call.SpanContext().SpanID() != req.SpanContext().SpanID() {
		t.Errorf("the call's span %v, want the request's context passed on (%v)", call.SpanContext(), req.SpanContext())
	}
	if n := ids.spans.Load(); n != 1 {
		t.Errorf("%d span ids made, want the request's alone", n)
	}
}

// countingIDs counts the span ids the SDK makes, for spans sampled or not.
type countingIDs struct{ spans atomic.Int64 }

func (c *countingIDs) NewIDs(context.Context) (trace.TraceID, trace.SpanID) {
	c.spans.Add(1)
	return trace.TraceID{1}, trace.SpanID{byte(c.spans.Load())}
}

func (c *countingIDs) NewSpanID(context.Context, trace.TraceID) trace.SpanID {
	c.spans.Add(1)
	return trace.SpanID{byte(c.spans.Load())}
}

func TestPprofListensUntilStopped(t *testing.T) {
	p := &Pprof{Addr: "127.0.0.1:0"}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	url := "http://" + p.ListenAddr().String() + "/debug/pprof/"
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /debug/pprof/: %d", resp.StatusCode)
	}
	p.Stop()
	if resp, err := http.Get(url); err == nil {
		resp.Body.Close()
		t.Fatal("pprof still answers after Stop")
	}
}

// Under a span that records without being sampled, a call's span does nothing:
// ending it leaves its parent recording.
func TestChildrenOnlyLeavesARecordingParentOpen(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(recordOnly{}), sdktrace.WithSyncer(exp))
	ctx, req := tp.Tracer("t").Start(context.Background(), "request")
	if !req.IsRecording() || req.SpanContext().IsSampled() {
		t.Fatalf("the request's span records %v, sampled %v; want recording, not sampled", req.IsRecording(), req.SpanContext().IsSampled())
	}
	cctx, call := ChildrenOnly(tp).Tracer("calls").Start(ctx, "call")
	call.End()
	if !req.IsRecording() || !trace.SpanFromContext(ctx).IsRecording() {
		t.Fatal("ending the call's span ended the request's")
	}
	if trace.SpanFromContext(cctx).IsRecording() {
		t.Error("the call's context holds a recording span")
	}
	req.End()
}

type recordOnly struct{}

func (recordOnly) ShouldSample(sdktrace.SamplingParameters) sdktrace.SamplingResult {
	return sdktrace.SamplingResult{Decision: sdktrace.RecordOnly}
}
func (recordOnly) Description() string { return "record only" }
