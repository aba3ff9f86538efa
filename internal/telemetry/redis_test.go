package telemetry

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/agentq/agentq/internal/testenv"
)

// A pipeline inside a span gets a child span naming its distinct commands and
// counting them; one outside any span, none. A failing command marks the span.
func TestRedisPipelinesSpans(t *testing.T) {
	rdb, keys := testenv.Redis(t, 1)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	rdb.AddHook(RedisPipelines(ChildrenOnly(tp), rdb))
	ctx := context.Background()
	k := keys.Prefix() + "pipe"
	run := func(ctx context.Context) error {
		_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, k, "1", 0)
			p.Incr(ctx, k)
			p.Set(ctx, k, "2", 0)
			return nil
		})
		return err
	}
	if err := run(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(exp.GetSpans()); n != 0 {
		t.Fatalf("a pipeline outside any span made %d spans", n)
	}
	parent, span := tp.Tracer("test").Start(ctx, "parent")
	if err := run(parent); err != nil {
		t.Fatal(err)
	}
	_, err := rdb.Pipelined(parent, func(p redis.Pipeliner) error {
		p.HSet(parent, k, "f", "v") // a string key: WRONGTYPE
		return nil
	})
	if err == nil {
		t.Fatal("HSET on a string key succeeded")
	}
	span.End()
	spans := exp.GetSpans()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want the two pipelines' and their parent's", len(spans))
	}
	got := spans[0]
	if got.Name != "redis.pipeline set incr" || got.Parent.SpanID() != span.SpanContext().SpanID() {
		t.Fatalf("span %q, parent %v", got.Name, got.Parent.SpanID())
	}
	if !hasAttr(got.Attributes, attribute.Int("db.redis.num_cmd", 3)) || !hasAttr(got.Attributes, attribute.String("db.system", "redis")) {
		t.Fatalf("attributes %v", got.Attributes)
	}
	if spans[1].Name != "redis.pipeline hset" || spans[1].Status.Code.String() != "Error" {
		t.Fatalf("failed pipeline's span: %q, status %v", spans[1].Name, spans[1].Status)
	}
}

func hasAttr(attrs []attribute.KeyValue, want attribute.KeyValue) bool {
	for _, a := range attrs {
		if a == want {
			return true
		}
	}
	return false
}

// A command inside a sampled span gets a child span named after it with redisotel's
// scope and attributes; one outside any span, or inside an unsampled one, none. A
// failing command marks its span; redis.Nil does not.
func TestRedisCommandsSpans(t *testing.T) {
	rdb, keys := testenv.Redis(t, 1)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	RedisCommands(ChildrenOnly(tp), rdb)
	ctx := context.Background()
	k := keys.Prefix() + "cmd"
	if err := rdb.Set(ctx, k, "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	never := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	unsampled, req := never.Tracer("t").Start(ctx, "request")
	if err := rdb.Incr(unsampled, k).Err(); err != nil {
		t.Fatal(err)
	}
	req.End()
	if n := len(exp.GetSpans()); n != 0 {
		t.Fatalf("commands outside a sampled span made %d spans", n)
	}
	parent, span := tp.Tracer("test").Start(ctx, "parent")
	if err := rdb.Incr(parent, k).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(parent, k, "f", "v").Err(); err == nil {
		t.Fatal("HSET on a string key succeeded")
	}
	if err := rdb.Get(parent, k+":none").Err(); err != redis.Nil {
		t.Fatalf("GET of a missing key: %v", err)
	}
	span.End()
	spans := exp.GetSpans()
	if len(spans) != 4 {
		t.Fatalf("%d spans, want the three commands' and their parent's", len(spans))
	}
	got := spans[0]
	if got.Name != "incr" || got.Parent.SpanID() != span.SpanContext().SpanID() || got.SpanKind.String() != "client" {
		t.Fatalf("span %q kind %v, parent %v", got.Name, got.SpanKind, got.Parent.SpanID())
	}
	if got.InstrumentationScope.Name != "github.com/redis/go-redis/extra/redisotel" {
		t.Errorf("scope %q", got.InstrumentationScope.Name)
	}
	addr := rdb.Options().Addr
	for _, want := range []attribute.KeyValue{attribute.String("db.system", "redis"),
		attribute.String("db.connection_string", "redis://"+addr)} {
		if !hasAttr(got.Attributes, want) {
			t.Errorf("attributes %v lack %v", got.Attributes, want)
		}
	}
	if spans[1].Name != "hset" || spans[1].Status.Code.String() != "Error" {
		t.Errorf("failed command's span: %q, status %v", spans[1].Name, spans[1].Status)
	}
	if spans[2].Name != "get" || spans[2].Status.Code.String() == "Error" {
		t.Errorf("missing key's span: %q, status %v", spans[2].Name, spans[2].Status)
	}
}
