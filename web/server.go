// Package web is agentq's HTTP server (echo): the listener and its lifecycle, the
// middleware every request goes through, the health endpoints and the cache
// invalidation listener. It mounts the JSON API (package api), the tenant panel
// (package panel) and the operator view (package operator).
package web

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/redis/go-redis/v9"
	"github.com/riverqueue/river/rivershared/startstop"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/billing/rejections"
	"github.com/agentq/agentq/billing/usage"
	"github.com/agentq/agentq/billing/webhooks"
	"github.com/agentq/agentq/internal/agents"
	"github.com/agentq/agentq/internal/approval"
	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/credentials"
	"github.com/agentq/agentq/internal/keys"
	"github.com/agentq/agentq/internal/operator"
	"github.com/agentq/agentq/internal/pools"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/services"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
	"github.com/agentq/agentq/web/api"
	"github.com/agentq/agentq/web/internal/adminauth"
	"github.com/agentq/agentq/web/internal/panellink"
	operatorview "github.com/agentq/agentq/web/operator"
	"github.com/agentq/agentq/web/panel"
)

// Pinger is what readiness needs of Postgres: that it answers.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Deps are the Server's collaborators, and those of the API, the panel and the
// operator view it mounts. The handlers decode requests, call the domain services and
// encode their answers; the rules are the services'.
type Deps struct {
	Tenants    *tenants.Service
	APIKeys    *keys.Service // also authenticates the tenant API's requests
	Tasks      *tasks.Service
	HTTPAgents *agents.Service
	Pools      *pools.Service // the model pools and their agents (admin API)
	Audit      *audit.Log     // the audit log (admin API, operator view, tenant panel)
	Postgres   Pinger         // readiness
	Queue      api.Queue      // the usage report's running count
	Redis      redis.UniversalClient
	Keys       rkeys.Keys
	Plans      *quotas.Catalogue // nil: the tenant service's
	Admission  *admission.Guard
	// Approvals checks the approval links of paused tasks (GET/POST /approve); nil
	// serves no approvals.
	Approvals *approval.Signer
	Events    *outbox.Feed // the usage events feeds
	// Rejections reports a tenant's refused admissions per limit (the usage report);
	// nil reports none.
	Rejections *rejections.Rejections
	Webhooks   *webhooks.Webhooks
	Usage      *usage.Rollups // the usage report's rollups and limit hits
	// UsageExport runs the usage export (GET /v1/admin/usage), a long read that may go
	// to a read replica; nil: Usage.
	UsageExport *usage.Rollups
	// Operator reads the operator view (/panel/admin); nil: the view answers 503.
	Operator   *operator.Service
	UpgradeURL string
	// Credentials resolves the admin API's and the operator view's tokens and manages
	// the stored credentials; nil: AdminToken is the only credential (tests, tools).
	Credentials *credentials.Service
	AdminToken  string
	// PanelSecret signs the tenant panel's links; "" derives the key from AdminToken,
	// or, without one, from random bytes (links then end with the process).
	PanelSecret string
	// PanelFrameAncestors is the panel's CSP frame-ancestors ("" is "*").
	PanelFrameAncestors string
	// Archetype is where the API logs, traces and meters its requests, and the clock
	// of the panel links and the operator view's sign-ins (tests expire links); nil: the
	// defaults.
	Archetype *baseservice.Archetype
	// ListenAddr is where Start listens ("host:port"; port 0 picks a free one).
	ListenAddr string
	// ShutdownTimeout bounds how long Stop waits for in-flight requests (default 10s).
	ShutdownTimeout time.Duration
	// Telemetry: the request spans and metrics, GET /metrics and the schema check
	// of GET /readyz (health.go).
	Telemetry Telemetry
	// OpsOnly serves GET /healthz, /readyz and /metrics and nothing else: the HTTP
	// side of a process without the api role.
	OpsOnly bool
}

// Server is the HTTP server, a service: Start listens, Stop drains.
type Server struct {
	startstop.BaseStartStop
	Deps
	arch    *baseservice.Archetype // Deps.Archetype with its defaults
	log     *slog.Logger
	e       *echo.Echo
	handler http.Handler // e, traced

	listener *cacheListener
	api      *api.API
	panel    *panel.Panel
	operator *operatorview.View

	closing  chan struct{} // closed when Stop begins: open streams end
	mu       sync.Mutex
	addr     net.Addr
	shutdown bool
}

// New builds the server and what it mounts.
func New(d Deps) *Server {
	arch := d.Archetype.Defaults()
	s := &Server{Deps: d, arch: arch, log: arch.Logger, closing: make(chan struct{})}
	if s.Plans == nil && s.Tenants != nil {
		s.Plans = s.Tenants.Plans()
	}
	s.listener = &cacheListener{s: s}
	s.buildParts(d)
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = api.ErrorHandler(s.log)
	// Every request has an id (the caller's X-Request-Id, or a new one), answered in
	// X-Request-Id and recorded with the changes it makes (the audit log).
	e.Use(middleware.RequestID(), s.recoverer, s.routeSpan, s.requestLog, api.ValidateInput)
	s.e = e
	s.routes()
	s.handler = s.traced(e)
	return s
}

// buildParts builds the API, the panel and the operator view from d. The admin API and
// the operator view's sign-in share one admin credential guard, so wrong tokens sent
// to either count in one bucket per address.
func (s *Server) buildParts(d Deps) {
	secret, ephemeral := panellink.Secret(d.PanelSecret, d.AdminToken)
	if ephemeral && d.Tenants != nil {
		s.log.Warn("neither AGENTQ_PANEL_SECRET nor AGENTQ_ADMIN_TOKEN is set: tenant panel links are signed with a random key and stop working when this process restarts")
	}
	links, err := panellink.New(secret, s.arch.Clock)
	if err != nil {
		panic(err) // the secret is never empty
	}
	if s.Credentials == nil {
		s.Credentials = credentials.New(nil, credentials.Options{Bootstrap: d.AdminToken})
	}
	admin := adminauth.New(s.Credentials, d.Admission)
	s.api = api.New(api.Deps{
		Tenants: d.Tenants, APIKeys: d.APIKeys, Tasks: d.Tasks, HTTPAgents: d.HTTPAgents, Pools: d.Pools, Audit: d.Audit,
		Queue: d.Queue, Redis: d.Redis, Keys: d.Keys, Plans: s.Plans, Admission: d.Admission, Events: d.Events,
		Rejections: d.Rejections, Webhooks: d.Webhooks, Usage: d.Usage, UsageExport: d.UsageExport,
		UpgradeURL: d.UpgradeURL, Credentials: s.Credentials, AdminAuth: admin, PanelLinks: links, Logger: s.log, Closing: s.closing,
	})
	s.panel = panel.New(panel.Deps{
		API: s.api, Tenants: d.Tenants, Tasks: d.Tasks, Admission: d.Admission, Links: links,
		Approvals: d.Approvals, FrameAncestors: d.PanelFrameAncestors, Logger: s.log,
	})
	s.operator = operatorview.New(operatorview.Deps{AdminAuth: admin, Operator: d.Operator, Tenants: d.Tenants, Now: s.arch.Clock})
}

// Handler is the server as an http.Handler (tests, embedding).
func (s *Server) Handler() http.Handler { return s.handler }

// Echo exposes the router (the OpenAPI test walks its routes).
func (s *Server) Echo() *echo.Echo { return s.e }

func (s *Server) routes() {
	e := s.e
	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", s.metrics)
	if s.OpsOnly {
		return
	}
	s.api.Mount(e)
	s.panel.Mount(e)
	s.operator.Mount(e)
}

// Start listens on ListenAddr and serves until Stop. It returns once the listener is
// bound (Addr then says where). A Server serves once: after Stop it does not start
// again, since its open streams were told to end.
func (s *Server) Start(ctx context.Context) error {
	ctx, shouldStart, started, stopped := s.StartInit(ctx)
	if !shouldStart {
		return nil
	}
	s.mu.Lock()
	done := s.shutdown
	s.mu.Unlock()
	if done {
		stopped()
		return errors.New("web: a stopped server does not start again")
	}
	ln, err := net.Listen("tcp", s.ListenAddr)
	if err != nil {
		stopped()
		return fmt.Errorf("web: listen %s: %w", s.ListenAddr, err)
	}
	srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second}
	s.mu.Lock()
	s.addr = ln.Addr()
	s.mu.Unlock()
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("http server stopped", "err", err)
		}
	}()
	go func() {
		started()
		defer stopped()
		<-ctx.Done()
		s.drain(srv)
		<-served
	}()
	return nil
}

// drain stops accepting requests, ends open event streams and waits for in-flight
// requests up to ShutdownTimeout, then closes the connections still open.
func (s *Server) drain(srv *http.Server) {
	s.mu.Lock()
	if !s.shutdown {
		close(s.closing)
	}
	s.shutdown = true
	s.mu.Unlock()
	timeout := s.ShutdownTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		s.log.Warn("http server: requests still running at the shutdown timeout were cut off", "err", err)
		_ = srv.Close()
	}
}

// Addr is the address the server listens on, once started (nil before).
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// CacheListener is the service that drops this replica's cached keys, tenants and
// admin credentials when another replica changes them (the Redis pub/sub invalidation channel). Without it a
// change reaches this replica within the cache TTL.
func (s *Server) CacheListener() startstop.Service { return s.listener }

// cacheListener listens for key, tenant and credential changes made by other replicas.
type cacheListener struct {
	startstop.BaseStartStop
	s *Server
}

func (l *cacheListener) Start(ctx context.Context) error {
	ctx, shouldStart, started, stopped := l.StartInit(ctx)
	if !shouldStart {
		return nil
	}
	if l.s.Redis == nil {
		stopped()
		return nil
	}
	sub := l.s.Redis.Subscribe(ctx, l.s.Keys.KeysChangedChannel())
	go func() {
		started()
		defer stopped()
		defer sub.Close()
		ch := sub.Channel()
		for {
			select {
			case <-ctx.Done():
				return
			case m, ok := <-ch:
				if !ok {
					return
				}
				l.s.invalidateLocal(m.Payload)
			}
		}
	}()
	return nil
}

// ReloadKeys drops every cached key, tenant and admin credential (SIGHUP), so the next
// request reads them from Postgres. Limit windows live in Redis under each key's kid, so keys that
// remain keep their live windows; revoked keys' state was dropped at revocation.
func (s *Server) ReloadKeys() {
	s.APIKeys.ForgetAll()
	s.Tenants.ForgetAll()
	s.Credentials.Forget()
}

// invalidateLocal applies another process's change message to this one's caches.
func (s *Server) invalidateLocal(msg string) {
	switch what, id := services.ParseChange(msg); what {
	case services.KeyChanged:
		s.APIKeys.Forget(id)
	case services.TenantChanged:
		s.Tenants.Forget(id)
	case services.CredentialChanged:
		s.Credentials.Forget() // few and cached by token hash: drop them all
	}
}

func (s *Server) recoverer(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		return next(c)
	}
}

// requestLog logs method, route, status and latency; never headers, so never a key.
func (s *Server) requestLog(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		if err != nil {
			c.Error(err)
		}
		// The arguments are built only for a logger that writes the line (boxed,
		// they cost every request allocations).
		if ctx := c.Request().Context(); s.log.Enabled(ctx, slog.LevelDebug) {
			s.log.DebugContext(ctx, "http", "method", c.Request().Method, "route", c.Path(),
				"status", c.Response().Status, "ms", time.Since(start).Milliseconds())
		}
		return nil
	}
}
