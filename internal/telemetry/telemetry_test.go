package telemetry

import (
	"context"
	"net/http"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
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
