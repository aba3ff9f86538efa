// Package web is agentq's HTTP API (echo): the tenant API under /v1, the admin API
// under /v1/admin, health endpoints, the OpenAPI document, and the operator view
// (server-rendered HTML under /panel/admin).
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
	"github.com/redis/go-redis/v9"
	"github.com/riverqueue/river/rivershared/startstop"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/billing/rejections"
	"github.com/agentq/agentq/billing/usage"
	"github.com/agentq/agentq/billing/webhooks"
	"github.com/agentq/agentq/internal/agents"
	"github.com/agentq/agentq/internal/apikey"
	"github.com/agentq/agentq/internal/approval"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/keys"
	"github.com/agentq/agentq/internal/operator"
	"github.com/agentq/agentq/internal/pools"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/services"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
)

// Pinger is what readiness needs of Postgres: that it answers.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Queue is what the usage report needs of the scheduler.
type Queue interface {
	Running(ctx context.Context, tenantID string) (int64, error)
}

// Deps are the Server's collaborators. The handlers decode requests, call the domain
// services and encode their answers; the rules are the services'.
type Deps struct {
	Tenants    *tenants.Service
	APIKeys    *keys.Service // also authenticates the tenant API's requests
	Tasks      *tasks.Service
	HTTPAgents *agents.Service
	Pools      *pools.Service // the model pools and their agents (admin API)
	Postgres   Pinger         // readiness
	Queue      Queue          // the usage report's running count
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
	AdminToken string
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

// Server is the HTTP API, a service: Start listens, Stop drains.
type Server struct {
	startstop.BaseStartStop
	Deps
	arch    *baseservice.Archetype // Deps.Archetype with its defaults
	log     *slog.Logger
	e       *echo.Echo
	handler http.Handler // e, traced

	listener *cacheListener
	panel    *PanelSigner
	opAuth   *operatorAuth

	closing  chan struct{} // closed when Stop begins: open streams end
	mu       sync.Mutex
	addr     net.Addr
	shutdown bool
}

// New builds the API.
func New(d Deps) *Server {
	arch := d.Archetype.Defaults()
	s := &Server{Deps: d, arch: arch, log: arch.Logger, closing: make(chan struct{})}
	if s.Plans == nil && s.Tenants != nil {
		s.Plans = s.Tenants.Plans()
	}
	s.listener = &cacheListener{s: s}
	secret, ephemeral := panelSecret(d.PanelSecret, d.AdminToken)
	if ephemeral && d.Tenants != nil {
		s.log.Warn("neither AGENTQ_PANEL_SECRET nor AGENTQ_ADMIN_TOKEN is set: tenant panel links are signed with a random key and stop working when this process restarts")
	}
	panel, err := NewPanelSigner(secret, arch.Clock)
	if err != nil {
		panic(err) // the secret is never empty
	}
	s.panel = panel
	s.opAuth = newOperatorAuth(d.AdminToken, arch.Clock)
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.errorHandler
	e.Use(s.recoverer, s.routeSpan, s.requestLog, s.validateInput)
	s.e = e
	s.routes()
	s.handler = s.traced(e)
	return s
}

// Handler is the API as an http.Handler (tests, embedding).
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
	e.GET("/openapi.json", s.openapi)

	// Middleware is attached per route, not per group: echo groups with middleware add
	// catch-all routes that would turn 405s into 404s.
	// Every tenant request holds an inflight_requests slot while it runs.
	tenant := func(method, path string, h echo.HandlerFunc) { e.Add(method, path, h, s.authTenant, s.inflight) }
	read := func(method, path string, h echo.HandlerFunc) { e.Add(method, path, h, s.authTenant, s.readLimits) }
	tenant(http.MethodPost, "/v1/tasks", s.submitTask) // runs the full admission itself
	read(http.MethodGet, "/v1/usage", s.usage)         // spends the key bucket, then peeks
	read(http.MethodGet, "/v1/tasks", s.listTasks)
	read(http.MethodGet, "/v1/tasks/:id", s.getTask)
	read(http.MethodPost, "/v1/tasks/:id/cancel", s.cancelTask)
	read(http.MethodPost, "/v1/tasks/:id/resume", s.resumeTask)
	read(http.MethodGet, "/v1/tasks/:id/events", s.taskEvents)
	read(http.MethodGet, "/v1/events", s.tenantEvents)
	read(http.MethodPost, "/v1/webhooks", s.createTenantWebhook)
	read(http.MethodGet, "/v1/webhooks", s.listTenantWebhooks)
	read(http.MethodGet, "/v1/webhooks/:id", s.getTenantWebhook)
	read(http.MethodDelete, "/v1/webhooks/:id", s.deleteTenantWebhook)
	read(http.MethodPost, "/v1/webhooks/:id/rotate", s.rotateTenantWebhookSecret)
	read(http.MethodGet, "/v1/webhooks/:id/attempts", s.listTenantWebhookAttempts)

	// The tenant panel: authorized by its signed link, not by a key.
	e.GET("/panel/t", s.panelPage, s.panelGuard(true))
	e.GET("/panel/t/usage", s.panelUsage, s.panelGuard(false))
	e.GET("/panel/t/assets/:file", s.panelAsset)
	// A paused task's approval page: authorized by its signed link, not by a key.
	e.GET(approval.Path, s.approvalPage)
	e.POST(approval.Path, s.approve)

	admin := func(method, path string, h echo.HandlerFunc) { e.Add(method, "/v1/admin"+path, h, s.authAdmin) }
	admin(http.MethodGet, "/plans", s.listPlans)
	admin(http.MethodGet, "/events", s.adminEvents)
	admin(http.MethodPost, "/webhooks", s.createWebhook)
	admin(http.MethodGet, "/webhooks", s.listWebhooks)
	admin(http.MethodGet, "/webhooks/:id", s.getWebhook)
	admin(http.MethodDelete, "/webhooks/:id", s.deleteWebhook)
	admin(http.MethodPost, "/webhooks/:id/rotate", s.rotateWebhookSecret)
	admin(http.MethodGet, "/webhooks/:id/attempts", s.listWebhookAttempts)
	admin(http.MethodGet, "/usage", s.adminUsage)
	admin(http.MethodPost, "/tenants", s.createTenant)
	admin(http.MethodGet, "/tenants", s.listTenants)
	admin(http.MethodGet, "/tenants/:id", s.getTenant)
	admin(http.MethodPatch, "/tenants/:id", s.updateTenant)
	admin(http.MethodPost, "/tenants/:id/keys", s.createKey)
	admin(http.MethodGet, "/tenants/:id/keys", s.listKeys)
	admin(http.MethodPost, "/tenants/:id/panel-links", s.createPanelLink)
	admin(http.MethodPost, "/tenants/:id/panel-links/revoke", s.revokePanelLinks)
	admin(http.MethodPost, "/keys/:kid/rotate", s.rotateKey)
	admin(http.MethodDelete, "/keys/:kid", s.revokeKey)
	admin(http.MethodPut, "/agents/:name", s.putAgent)
	admin(http.MethodGet, "/agents", s.listAgents)
	admin(http.MethodGet, "/agents/:name", s.getAgent)
	admin(http.MethodDelete, "/agents/:name", s.deleteAgent)
	admin(http.MethodPost, "/agents/:name/rotate-secret", s.rotateAgentSecret)
	admin(http.MethodPut, "/agents/:name/pool", s.putAgentPool)
	admin(http.MethodGet, "/agents/:name/pool", s.getAgentPool)
	admin(http.MethodDelete, "/agents/:name/pool", s.deleteAgentPool)
	admin(http.MethodPut, "/pools/:name", s.putPool)
	admin(http.MethodGet, "/pools", s.listPools)
	admin(http.MethodGet, "/pools/:name", s.getPool)
	admin(http.MethodDelete, "/pools/:name", s.deletePool)

	s.operatorRoutes()
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

// CacheListener is the service that drops this replica's cached keys and tenants when
// another replica changes them (the Redis pub/sub invalidation channel). Without it a
// change reaches this replica within the cache TTL.
func (s *Server) CacheListener() startstop.Service { return s.listener }

// cacheListener listens for key and tenant changes made by other replicas.
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

// ReloadKeys drops every cached key and tenant (SIGHUP), so the next request reads
// them from Postgres. Limit windows live in Redis under each key's kid, so keys that
// remain keep their live windows; revoked keys' state was dropped at revocation.
func (s *Server) ReloadKeys() {
	s.APIKeys.ForgetAll()
	s.Tenants.ForgetAll()
}

// invalidateLocal applies another process's change message to this one's caches.
func (s *Server) invalidateLocal(msg string) {
	switch what, id := services.ParseChange(msg); what {
	case services.KeyChanged:
		s.APIKeys.Forget(id)
	case services.TenantChanged:
		s.Tenants.Forget(id)
	}
}

const ctxKeyRecord = "agentq.key"

func bearer(c echo.Context) string {
	return bearerToken(c.Request().Header.Get(echo.HeaderAuthorization))
}

// authTenant authenticates an API key. The tenant always comes from the key.
func (s *Server) authTenant(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		tok := bearer(c)
		if tok == "" {
			return apiErr(http.StatusUnauthorized, CodeUnauthorized, "Missing API key: send Authorization: Bearer aq_<kid>_<secret>.")
		}
		rec, err := s.APIKeys.Authenticate(c.Request().Context(), tok)
		if errors.Is(err, keys.ErrInvalidKey) {
			return apiErr(http.StatusUnauthorized, CodeUnauthorized, "Invalid or revoked API key.")
		}
		if err != nil {
			s.log.Error("key lookup failed", "err", err)
			return unavailable()
		}
		c.Set(ctxKeyRecord, rec)
		return next(c)
	}
}

func keyRecord(c echo.Context) apikey.Record { return c.Get(ctxKeyRecord).(apikey.Record) }

// authAdmin checks the admin token in constant time. Wrong tokens are limited per
// client address (authlimit.go): past a small burst they, and for a moment the right
// token from the same address, are answered 429.
func (s *Server) authAdmin(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		tok := bearer(c)
		if s.AdminToken == "" || tok == "" {
			return apiErr(http.StatusUnauthorized, CodeUnauthorized, "Missing or wrong admin token.")
		}
		ok := len(tok) <= maxAdminTokenBytes && s.opAuth.tokenOK(s.AdminToken, tok)
		a, err := s.adminAttempt(c.Request().Context(), c.Request(), ok)
		if err != nil {
			return admissionFailure(err)
		}
		if !a.Allowed {
			return authFailureRefusal(c, a)
		}
		if !ok {
			return apiErr(http.StatusUnauthorized, CodeUnauthorized, "Missing or wrong admin token.")
		}
		return next(c)
	}
}

func unavailable() *APIError {
	e := apiErr(http.StatusServiceUnavailable, CodeUnavailable, "A backing service is unavailable. Retry in 1 second.")
	e.Extra = map[string]any{"retry_after_seconds": 1}
	return e
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
		s.log.DebugContext(c.Request().Context(), "http", "method", c.Request().Method, "route", c.Path(),
			"status", c.Response().Status, "ms", time.Since(start).Milliseconds())
		return nil
	}
}
