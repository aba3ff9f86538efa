// Package api is agentq's JSON API: the tenant API under /v1, the admin API under
// /v1/admin, its error body, the decoding and validation of what requests carry, and
// the OpenAPI document (GET /openapi.json). Package web mounts it.
package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/billing/rejections"
	"github.com/agentq/agentq/billing/usage"
	"github.com/agentq/agentq/billing/webhooks"
	"github.com/agentq/agentq/internal/agents"
	"github.com/agentq/agentq/internal/apikey"
	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/internal/credentials"
	"github.com/agentq/agentq/internal/keys"
	"github.com/agentq/agentq/internal/pools"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
	"github.com/agentq/agentq/web/internal/adminauth"
	"github.com/agentq/agentq/web/internal/panellink"
)

// Queue is what the usage report needs of the scheduler.
type Queue interface {
	// QueueRunning queues the read of the tenant's running tasks on pipe; the function
	// returned gives the count once pipe was sent.
	QueueRunning(ctx context.Context, pipe redis.Pipeliner, tenantID string) func() (int64, error)
}

// Deps are the API's collaborators. The handlers decode requests, call the domain
// services and encode their answers; the rules are the services'.
type Deps struct {
	Tenants    *tenants.Service
	APIKeys    *keys.Service // also authenticates the tenant API's requests
	Tasks      *tasks.Service
	HTTPAgents *agents.Service
	Pools      *pools.Service // the model pools and their agents (admin API)
	Audit      *audit.Log     // the audit log (admin API)
	Queue      Queue          // the usage report's running count
	Redis      redis.UniversalClient
	Keys       rkeys.Keys
	Plans      *quotas.Catalogue
	Admission  *admission.Guard
	Events     *outbox.Feed // the usage events feeds
	// Rejections reports a tenant's refused admissions per limit (the usage report);
	// nil reports none.
	Rejections *rejections.Rejections
	Webhooks   *webhooks.Webhooks
	Usage      *usage.Rollups // the usage report's rollups and limit hits
	// UsageExport runs the usage export (GET /v1/admin/usage); nil: Usage.
	UsageExport *usage.Rollups
	UpgradeURL  string
	// Credentials manages the admin credentials (/v1/admin/credentials).
	Credentials *credentials.Service
	// AdminAuth resolves the admin API's tokens to credentials; PanelLinks signs the
	// tenant panel's links.
	AdminAuth  *adminauth.Guard
	PanelLinks *panellink.Signer
	Logger     *slog.Logger // where the handlers log; required
	// Closing is closed when the server begins to stop: open event streams end.
	Closing <-chan struct{}
}

// API is the JSON API's handlers.
type API struct {
	Deps
	log *slog.Logger
}

// New builds the API; Mount serves it.
func New(d Deps) *API { return &API{Deps: d, log: d.Logger} }

// Mount registers the API's routes on e.
func (s *API) Mount(e *echo.Echo) {
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
	read(http.MethodGet, "/v1/tasks/:id/tree", s.getTaskTree)
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
	s.mountAdmin(e)
}

// mountAdmin registers the admin API's routes on e.
func (s *API) mountAdmin(e *echo.Echo) {
	// Every admin route is behind the role its entry in the role table (roles.go) names.
	admin := func(method, path string, h echo.HandlerFunc) {
		e.Add(method, "/v1/admin"+path, h, s.authAdmin, s.requireRole)
	}
	admin(http.MethodPost, "/credentials", s.createCredential)
	admin(http.MethodGet, "/credentials", s.listCredentials)
	admin(http.MethodPost, "/credentials/:name/rotate", s.rotateCredential)
	admin(http.MethodDelete, "/credentials/:name", s.revokeCredential)
	admin(http.MethodGet, "/plans", s.listPlans)
	admin(http.MethodGet, "/events", s.adminEvents)
	admin(http.MethodPost, "/webhooks", s.createWebhook)
	admin(http.MethodGet, "/webhooks", s.listWebhooks)
	admin(http.MethodGet, "/webhooks/:id", s.getWebhook)
	admin(http.MethodPatch, "/webhooks/:id", s.updateWebhook)
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
	admin(http.MethodGet, "/audit", s.listAudit)
	admin(http.MethodGet, "/audit/head", s.auditHead)
	admin(http.MethodGet, "/audit/:id", s.getAudit)
	admin(http.MethodPost, "/audit/:id/revert", s.revertAudit)
}

const ctxKeyRecord = "agentq.key"

func bearer(c echo.Context) string {
	return bearerToken(c.Request().Header.Get(echo.HeaderAuthorization))
}

// authTenant authenticates an API key. The tenant always comes from the key.
func (s *API) authTenant(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		tok := bearer(c)
		if tok == "" {
			return Errorf(http.StatusUnauthorized, CodeUnauthorized, "Missing API key: send Authorization: Bearer aq_<kid>_<secret>.")
		}
		rec, err := s.APIKeys.Authenticate(c.Request().Context(), tok)
		if errors.Is(err, keys.ErrInvalidKey) {
			return Errorf(http.StatusUnauthorized, CodeUnauthorized, "Invalid or revoked API key.")
		}
		if err != nil {
			s.log.Error("key lookup failed", "err", err)
			return Unavailable()
		}
		c.Set(ctxKeyRecord, rec)
		withActor(c, agentqtype.Actor{Kind: agentqtype.ActorKey, Name: rec.Kid})
		return next(c)
	}
}

func keyRecord(c echo.Context) apikey.Record { return c.Get(ctxKeyRecord).(apikey.Record) }

// authAdmin resolves the admin token to its credential (package adminauth) and puts
// the credential's actor, its name and role, on the request's context. Wrong tokens are
// limited per client address: past a small burst they, and for a moment the right
// token from the same address, are answered 429.
func (s *API) authAdmin(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		tok := bearer(c)
		if tok == "" { // none sent: nothing guessed, nothing counted
			return Errorf(http.StatusUnauthorized, CodeUnauthorized, "Missing or wrong admin token.")
		}
		ctx := c.Request().Context()
		cred, ok, err := s.AdminAuth.Resolve(ctx, tok)
		if err != nil {
			return err
		}
		a, err := s.AdminAuth.Attempt(ctx, c.Request(), ok)
		if err != nil {
			return AdmissionFailure(err)
		}
		if !a.Allowed {
			return authFailureRefusal(c, a)
		}
		if !ok {
			return Errorf(http.StatusUnauthorized, CodeUnauthorized, "Missing or wrong admin token.")
		}
		withActor(c, cred.Actor())
		return next(c)
	}
}

// withActor puts who acts on the request's context, with what the caller claims
// (X-Agentq-Actor, X-Agentq-Reason, each cut to 200 bytes) and the request's id.
func withActor(c echo.Context, a agentqtype.Actor) {
	h := c.Request().Header
	a.ClaimedActor, a.Reason = clip(h.Get("X-Agentq-Actor"), 200), clip(h.Get("X-Agentq-Reason"), 200)
	a.RequestID = c.Response().Header().Get(echo.HeaderXRequestID)
	c.SetRequest(c.Request().WithContext(agentqtype.WithActor(c.Request().Context(), a)))
}

// clip is s as text a row can keep: invalid UTF-8 and control characters dropped, cut
// to at most n bytes on a character's boundary.
func clip(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if isControl(r) || r == utf8.RuneError {
			return -1
		}
		return r
	}, strings.ToValidUTF8(s, ""))
	for len(s) > n {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	return s
}
