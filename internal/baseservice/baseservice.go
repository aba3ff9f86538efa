// Package baseservice holds the plumbing every service shares: where it logs, traces
// and meters, and which clock it reads. The App builds one Archetype and hands the
// same one to every service, so a test that swaps the clock or the meter provider
// swaps it everywhere, and no service has its own nil-default for any of them.
package baseservice

import (
	"io"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Archetype is the shared plumbing of a service. Its zero value works: Defaults fills
// what is unset.
type Archetype struct {
	// Logger receives the service's logs; nil discards them.
	Logger *slog.Logger
	// TracerProvider and MeterProvider receive its spans and instruments; nil: the
	// OpenTelemetry globals.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// Clock is the service's "now" for decisions made in process; nil: time.Now.
	// Decisions made in Redis scripts take Redis's TIME instead.
	Clock func() time.Time
}

// Defaults returns a copy of a with every unset field filled. A nil a gives the
// defaults, so a service may hold a *Archetype that its caller never set.
func (a *Archetype) Defaults() *Archetype {
	var out Archetype
	if a != nil {
		out = *a
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if out.TracerProvider == nil {
		out.TracerProvider = otel.GetTracerProvider()
	}
	if out.MeterProvider == nil {
		out.MeterProvider = otel.GetMeterProvider()
	}
	if out.Clock == nil {
		out.Clock = time.Now
	}
	return &out
}

// Now is the archetype's clock.
func (a *Archetype) Now() time.Time {
	if a == nil || a.Clock == nil {
		return time.Now()
	}
	return a.Clock()
}

// Tracer is the named tracer of the archetype's provider.
func (a *Archetype) Tracer(name string) trace.Tracer {
	return a.Defaults().TracerProvider.Tracer(name)
}

// Meter is the named meter of the archetype's provider.
func (a *Archetype) Meter(name string) metric.Meter {
	return a.Defaults().MeterProvider.Meter(name)
}

// WithLogger returns a copy of a whose logger carries the given attributes, for a
// service that names itself in every line.
func (a *Archetype) WithLogger(args ...any) *Archetype {
	out := a.Defaults()
	out.Logger = out.Logger.With(args...)
	return out
}
