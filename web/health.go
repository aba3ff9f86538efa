package web

import (
	"context"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentq/agentq/internal/telemetry"
	"github.com/agentq/agentq/web/api"
)

// Telemetry is what the API needs for its observability besides the providers its
// request spans and metrics go to (Deps.Archetype's): the Prometheus handler of GET
// /metrics, and the schema check of GET /readyz.
type Telemetry struct {
	// Metrics serves GET /metrics (the Prometheus text format); nil answers 404.
	Metrics http.Handler
	// Migrations reports whether schema migrations are pending; nil is not checked.
	Migrations func(ctx context.Context) (pending bool, err error)
}

// traced wraps the API in the OpenTelemetry HTTP server instrumentation: a server
// span per request, continuing the caller's traceparent, and the HTTP server
// metrics. The probes and the scrapes make none.
func (s *Server) traced(h http.Handler) http.Handler {
	opts := []otelhttp.Option{
		otelhttp.WithPropagators(telemetry.Propagator),
		otelhttp.WithFilter(func(r *http.Request) bool {
			switch r.URL.Path {
			case "/healthz", "/readyz", "/metrics":
				return false
			}
			return true
		}),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method }),
		otelhttp.WithTracerProvider(s.arch.TracerProvider),
		otelhttp.WithMeterProvider(s.arch.MeterProvider),
	}
	return otelhttp.NewHandler(h, "http.server", opts...)
}

// routeSpan names the request's span by its route ("POST /v1/tasks"), known once
// echo routed it: a name per route, not per URL, keeps span names few.
func (s *Server) routeSpan(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if span := trace.SpanFromContext(c.Request().Context()); span.IsRecording() {
			route := c.Path()
			span.SetName(c.Request().Method + " " + route)
			span.SetAttributes(attribute.String("http.route", route))
		}
		return next(c)
	}
}

// healthz answers while the process runs: liveness, nothing else checked.
func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

// readyz answers 200 when this replica can serve: Postgres and Redis answer and the
// schema has every migration this build embeds; else 503 with what failed.
func (s *Server) readyz(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
	defer cancel()
	checks := map[string]string{"postgres": "ok", "redis": "ok"}
	ready := true
	if err := s.Postgres.Ping(ctx); err != nil {
		checks["postgres"], ready = "unreachable", false
	}
	if err := s.Redis.Ping(ctx).Err(); err != nil {
		checks["redis"], ready = "unreachable", false
	}
	if m := s.Telemetry.Migrations; m != nil {
		checks["migrations"] = "ok"
		if checks["postgres"] != "ok" {
			checks["migrations"], ready = "unknown", false
		} else if pending, err := m(ctx); err != nil {
			checks["migrations"], ready = "unknown", false
		} else if pending {
			checks["migrations"], ready = "pending", false
		}
	}
	s.mu.Lock()
	if s.shutdown {
		checks["server"], ready = "shutting down", false
	}
	s.mu.Unlock()
	status := http.StatusOK
	if !ready {
		status = http.StatusServiceUnavailable
	}
	return c.JSON(status, map[string]any{"ready": ready, "checks": checks})
}

// metrics serves the process's metrics in the Prometheus text format.
func (s *Server) metrics(c echo.Context) error {
	if s.Telemetry.Metrics == nil {
		return api.Errorf(http.StatusNotFound, api.CodeNotFound, "This process exports no metrics here.")
	}
	s.Telemetry.Metrics.ServeHTTP(c.Response(), c.Request())
	return nil
}
