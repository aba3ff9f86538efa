// Package telemetry sets up OpenTelemetry for an agentq process from the standard
// OTEL_* environment variables: a tracer provider, a meter provider whose metrics are
// served in the Prometheus text format (GET /metrics) and, when asked for, exported
// over OTLP; the W3C propagator that carries a trace from the API into the workers;
// and a log/slog handler that stamps each line with the trace and span ids of its
// context.
//
// Nothing is exported unless the environment asks for it: a signal is exported when
// OTEL_<SIGNAL>_EXPORTER names an exporter other than "none", or when an OTLP
// endpoint is set for it (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT); OTEL_SDK_DISABLED=true exports nothing. The
// exporters themselves (OTLP over http/protobuf or gRPC, their endpoints, headers,
// intervals) are configured by those variables as the OpenTelemetry specification
// defines them (go.opentelemetry.io/contrib/exporters/autoexport).
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	otelruntime "go.opentelemetry.io/contrib/instrumentation/runtime"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Propagator is the context propagation agentq uses on every hop it makes: W3C trace
// context and baggage.
var Propagator propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(
	propagation.TraceContext{}, propagation.Baggage{})

// Config configures Setup.
type Config struct {
	// ServiceName is service.name unless OTEL_SERVICE_NAME or
	// OTEL_RESOURCE_ATTRIBUTES set it; default "agentq".
	ServiceName string
	// Getenv reads the environment; nil is os.Getenv.
	Getenv func(string) string
	// TracerProvider, when set, is used instead of one built from the environment
	// (the caller owns it: Shutdown leaves it alone).
	TracerProvider trace.TracerProvider
	// MeterProvider, when set, is used instead of one built from the environment (the
	// caller owns it). There is then no Prometheus handler: the caller's provider
	// decides where metrics go.
	MeterProvider metric.MeterProvider
}

// Telemetry is a process's providers.
type Telemetry struct {
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// TracesExported and MetricsExported say whether the environment asked for
	// OTLP (or another exporter) for the signal.
	TracesExported, MetricsExported bool

	metrics  http.Handler
	shutdown []func(context.Context) error
}

// Setup builds the providers. Without an exporter the tracer provider still makes
// spans with real trace and span ids, sampled out (not recorded, cheap): log lines
// and the traceparent sent to HTTP agents then carry ids an upstream caller's trace,
// or a later exporter, can be matched with.
func Setup(ctx context.Context, cfg Config) (*Telemetry, error) {
	getenv := cfg.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if cfg.ServiceName == "" {
		cfg.ServiceName = "agentq"
	}
	t := &Telemetry{TracerProvider: cfg.TracerProvider, MeterProvider: cfg.MeterProvider}
	disabled := strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true")
	t.TracesExported = !disabled && exported(getenv, "TRACES")
	t.MetricsExported = !disabled && exported(getenv, "METRICS")
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", cfg.ServiceName)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
	)
	if err != nil && res == nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	fail := func(err error) (*Telemetry, error) {
		_ = t.Shutdown(context.WithoutCancel(ctx))
		return nil, err
	}
	if t.TracerProvider == nil {
		opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
		if t.TracesExported {
			exp, err := autoexport.NewSpanExporter(ctx)
			if err != nil {
				return fail(fmt.Errorf("telemetry: trace exporter: %w", err))
			}
			opts = append(opts, sdktrace.WithBatcher(exp)) // OTEL_BSP_* apply
		} else {
			opts = append(opts, sdktrace.WithSampler(sdktrace.NeverSample()))
		}
		tp := sdktrace.NewTracerProvider(opts...)
		t.TracerProvider = tp
		t.shutdown = append(t.shutdown, tp.Shutdown)
	}
	if t.MeterProvider == nil {
		reg := prometheus.NewRegistry()
		prom, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
		if err != nil {
			return fail(fmt.Errorf("telemetry: prometheus exporter: %w", err))
		}
		opts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(prom)}
		if t.MetricsExported {
			r, err := autoexport.NewMetricReader(ctx) // OTEL_METRIC_EXPORT_INTERVAL applies
			if err != nil {
				return fail(fmt.Errorf("telemetry: metric exporter: %w", err))
			}
			opts = append(opts, sdkmetric.WithReader(r))
		}
		mp := sdkmetric.NewMeterProvider(opts...)
		t.MeterProvider = mp
		t.shutdown = append(t.shutdown, mp.Shutdown)
		t.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
		if err := otelruntime.Start(otelruntime.WithMeterProvider(mp), otelruntime.WithMinimumReadMemStatsInterval(5*time.Second)); err != nil {
			return fail(fmt.Errorf("telemetry: runtime metrics: %w", err))
		}
	}
	return t, nil
}

// exported tells whether the environment asks to export the signal ("TRACES",
// "METRICS").
func exported(getenv func(string) string, signal string) bool {
	if v := strings.TrimSpace(getenv("OTEL_" + signal + "_EXPORTER")); v != "" {
		return v != "none"
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT") != ""
}

// MetricsHandler serves the metrics in the Prometheus text format; nil when the
// caller supplied the meter provider.
func (t *Telemetry) MetricsHandler() http.Handler { return t.metrics }

// Shutdown flushes what is buffered to the exporters and stops the providers Setup
// built (not the caller's).
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for i := len(t.shutdown) - 1; i >= 0; i-- {
		errs = append(errs, t.shutdown[i](ctx))
	}
	t.shutdown = nil
	return errors.Join(errs...)
}
