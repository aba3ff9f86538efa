package api

import (
	"errors"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/billing/webhooks"
	"github.com/agentq/agentq/quotas"
)

// WebhookRequest is the body of POST /v1/admin/webhooks.
type WebhookRequest struct {
	URL    string   `json:"url"`
	Types  []string `json:"types"`
	Tenant string   `json:"tenant"` // "" or absent: every tenant's events
}

// WebhookJSON is a webhook endpoint as the admin API shows it, never with a secret.
type WebhookJSON struct {
	ID     string   `json:"id"`
	URL    string   `json:"url"`
	Types  []string `json:"types"`
	Tenant *string  `json:"tenant"` // null: every tenant
	// Owner is who registered it: "operator" (the admin API) or "tenant" (the
	// tenant's own, for its own events).
	Owner string `json:"owner"`
	// Disabled is set when the endpoint stopped receiving (it answered 410 Gone).
	DisabledAt     *time.Time `json:"disabled_at"`
	DisabledReason *string    `json:"disabled_reason"`
	// PreviousSecretExpiresAt: after a rotation, until when the replaced secret
	// signs too; null before the first rotation.
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
	CreatedAt               time.Time  `json:"created_at"`
	UpdatedAt               time.Time  `json:"updated_at"`
}

// WebhookWithSecret is an endpoint with its new secret: the answer of create and
// rotate, the only ones that carry it.
type WebhookWithSecret struct {
	WebhookJSON
	Secret string `json:"secret"`
}

// WebhookAttemptJSON is one attempt to deliver an event to an endpoint.
type WebhookAttemptJSON struct {
	ID          string    `json:"id"`
	EventID     string    `json:"event_id"`
	Attempt     int       `json:"attempt"`
	AttemptedAt time.Time `json:"attempted_at"`
	StatusCode  *int      `json:"status_code"` // null: no answer
	Error       *string   `json:"error"`       // why there was no answer
	DurationMS  int64     `json:"duration_ms"`
	Result      string    `json:"result"` // succeeded, retrying, failed, gone
}

// NewWebhookJSON is an endpoint as the API shows it (the CLI prints the same).
func NewWebhookJSON(w webhooks.Webhook) WebhookJSON {
	out := WebhookJSON{
		ID: w.ID.String(), URL: w.URL, Types: w.Types, DisabledAt: w.DisabledAt,
		PreviousSecretExpiresAt: w.PreviousSecretExpiresAt, CreatedAt: w.CreatedAt, UpdatedAt: w.UpdatedAt,
		Owner: "operator",
	}
	if w.TenantOwned {
		out.Owner = "tenant"
	}
	if out.Types == nil {
		out.Types = []string{}
	}
	if w.TenantID != "" {
		out.Tenant = &w.TenantID
	}
	if w.DisabledReason != "" {
		out.DisabledReason = &w.DisabledReason
	}
	return out
}

// NewWebhooksJSON is the API's JSON of a list of endpoints (the admin and tenant
// listings, and the CLI's).
func NewWebhooksJSON(ws []webhooks.Webhook) []WebhookJSON {
	out := make([]WebhookJSON, 0, len(ws))
	for _, w := range ws {
		out = append(out, NewWebhookJSON(w))
	}
	return out
}

// NewWebhookAttemptJSON is an attempt as the API shows it.
func NewWebhookAttemptJSON(a webhooks.WebhookAttempt) WebhookAttemptJSON {
	out := WebhookAttemptJSON{
		ID: strconv.FormatInt(a.ID, 10), EventID: a.EventID, Attempt: a.Attempt, AttemptedAt: a.AttemptedAt,
		DurationMS: a.Duration.Milliseconds(), Result: a.Result,
	}
	if a.StatusCode != 0 {
		out.StatusCode = &a.StatusCode
	}
	if a.Error != "" {
		out.Error = &a.Error
	}
	return out
}

// webhookErr turns the webhook service's errors into the API's.
func webhookErr(err error, upgradeURL string) error {
	var inv *agentqtype.InvalidError
	var nf *agentqtype.NotFoundError
	var over *webhooks.WebhookLimitError
	switch {
	case errors.As(err, &over):
		e := Errorf(http.StatusPaymentRequired, "QUOTA_EXCEEDED", "%s Upgrade your plan to continue.", over.Error())
		e.Extra = map[string]any{"limit_type": quotas.WebhookEndpoints, "current_usage": over.Used,
			"limit_value": over.Limit, "upgrade_url": upgradeURL, "tenant_id": over.TenantID,
			"violated": []string{quotas.WebhookEndpoints}}
		return e
	case errors.As(err, &inv):
		return Errorf(http.StatusBadRequest, CodeInvalidRequest, "%s", inv.Message)
	case errors.As(err, &nf):
		return Errorf(http.StatusNotFound, CodeNotFound, "%s", nf.Message)
	}
	return err
}

func (s *API) createWebhook(c echo.Context) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	var r WebhookRequest
	if err := decodeStrict(body, &r, false); err != nil {
		return err
	}
	w, err := s.Webhooks.Create(c.Request().Context(), webhooks.CreateWebhookParams{URL: r.URL, Types: r.Types, TenantID: r.Tenant})
	if err != nil {
		return webhookErr(err, s.UpgradeURL)
	}
	return c.JSON(http.StatusCreated, WebhookWithSecret{WebhookJSON: NewWebhookJSON(w.Webhook), Secret: w.Secret})
}

func (s *API) listWebhooks(c echo.Context) error {
	ws, err := s.Webhooks.List(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"webhooks": NewWebhooksJSON(ws)})
}

func (s *API) getWebhook(c echo.Context) error {
	w, err := s.Webhooks.Get(c.Request().Context(), c.Param("id"))
	if err != nil {
		return webhookErr(err, s.UpgradeURL)
	}
	return c.JSON(http.StatusOK, NewWebhookJSON(w))
}

// WebhookUpdate is the body of PATCH /v1/admin/webhooks/{id}.
type WebhookUpdate struct {
	Enabled *bool `json:"enabled"`
}

// updateWebhook is PATCH /v1/admin/webhooks/{id}: enables or disables an endpoint.
func (s *API) updateWebhook(c echo.Context) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	var r WebhookUpdate
	if err := decodeStrict(body, &r, false); err != nil {
		return err
	}
	if r.Enabled == nil {
		return Errorf(http.StatusBadRequest, CodeInvalidRequest, "enabled is required: true or false.")
	}
	w, err := s.Webhooks.SetEnabled(c.Request().Context(), c.Param("id"), *r.Enabled)
	if err != nil {
		return webhookErr(err, s.UpgradeURL)
	}
	return c.JSON(http.StatusOK, NewWebhookJSON(w))
}

func (s *API) deleteWebhook(c echo.Context) error {
	if err := s.Webhooks.Delete(c.Request().Context(), c.Param("id")); err != nil {
		return webhookErr(err, s.UpgradeURL)
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *API) rotateWebhookSecret(c echo.Context) error {
	w, err := s.Webhooks.RotateSecret(c.Request().Context(), c.Param("id"))
	if err != nil {
		return webhookErr(err, s.UpgradeURL)
	}
	return c.JSON(http.StatusOK, WebhookWithSecret{WebhookJSON: NewWebhookJSON(w.Webhook), Secret: w.Secret})
}

// listWebhookAttempts is GET /v1/admin/webhooks/{id}/attempts: newest first, paged by
// after (a next_cursor) and limit.
func (s *API) listWebhookAttempts(c echo.Context) error {
	p, err := attemptsParams(c)
	if err != nil {
		return err
	}
	page, err := s.Webhooks.Attempts(c.Request().Context(), c.Param("id"), p)
	if err != nil {
		return webhookErr(err, s.UpgradeURL)
	}
	return attemptsJSON(c, page)
}

// listTenantWebhookAttempts is GET /v1/webhooks/{id}/attempts: the attempts of one
// of the caller tenant's own endpoints.
func (s *API) listTenantWebhookAttempts(c echo.Context) error {
	p, err := attemptsParams(c)
	if err != nil {
		return err
	}
	page, err := s.Webhooks.AttemptsForTenant(c.Request().Context(), keyRecord(c).TenantID, c.Param("id"), p)
	if err != nil {
		return webhookErr(err, s.UpgradeURL)
	}
	return attemptsJSON(c, page)
}

// attemptsParams reads a page of attempts' query: after and limit, nothing else.
func attemptsParams(c echo.Context) (webhooks.AttemptsParams, error) {
	q := c.QueryParams()
	for k := range q {
		if k != "after" && k != "limit" {
			return webhooks.AttemptsParams{}, Errorf(http.StatusBadRequest, CodeInvalidRequest, "Unknown query parameter %q.", k)
		}
	}
	p := webhooks.AttemptsParams{After: q.Get("after")}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > webhooks.MaxAttemptsLimit {
			return p, Errorf(http.StatusBadRequest, CodeInvalidRequest, "limit must be between 1 and %d.", webhooks.MaxAttemptsLimit)
		}
		p.Limit = n
	}
	return p, nil
}

func attemptsJSON(c echo.Context, page webhooks.AttemptsPage) error {
	out := make([]WebhookAttemptJSON, 0, len(page.Attempts))
	for _, a := range page.Attempts {
		out = append(out, NewWebhookAttemptJSON(a))
	}
	var next *string
	if page.Next != "" {
		next = &page.Next
	}
	return c.JSON(http.StatusOK, map[string]any{"attempts": out, "next_cursor": next})
}

// TenantWebhookRequest is the body of POST /v1/webhooks: an endpoint of the caller
// tenant's own, for its own events.
type TenantWebhookRequest struct {
	URL   string   `json:"url"`
	Types []string `json:"types"`
}

// createTenantWebhook is POST /v1/webhooks: 201 with the secret, shown once; 402
// QUOTA_EXCEEDED past the plan's webhook_endpoints.
func (s *API) createTenantWebhook(c echo.Context) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	var r TenantWebhookRequest
	if err := decodeStrict(body, &r, false); err != nil {
		return err
	}
	w, err := s.Webhooks.CreateForTenant(c.Request().Context(), webhooks.TenantWebhookParams{
		TenantID: keyRecord(c).TenantID, URL: r.URL, Types: r.Types,
	})
	if err != nil {
		return webhookErr(err, s.UpgradeURL)
	}
	return c.JSON(http.StatusCreated, WebhookWithSecret{WebhookJSON: NewWebhookJSON(w.Webhook), Secret: w.Secret})
}

func (s *API) listTenantWebhooks(c echo.Context) error {
	if q := c.QueryParams(); len(q) > 0 {
		return Errorf(http.StatusBadRequest, CodeInvalidRequest, "Unknown query parameter %q.", slices.Sorted(maps.Keys(q))[0])
	}
	ws, err := s.Webhooks.ListForTenant(c.Request().Context(), keyRecord(c).TenantID)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"webhooks": NewWebhooksJSON(ws)})
}

func (s *API) getTenantWebhook(c echo.Context) error {
	w, err := s.Webhooks.GetForTenant(c.Request().Context(), keyRecord(c).TenantID, c.Param("id"))
	if err != nil {
		return webhookErr(err, s.UpgradeURL)
	}
	return c.JSON(http.StatusOK, NewWebhookJSON(w))
}

func (s *API) deleteTenantWebhook(c echo.Context) error {
	if err := s.Webhooks.DeleteForTenant(c.Request().Context(), keyRecord(c).TenantID, c.Param("id")); err != nil {
		return webhookErr(err, s.UpgradeURL)
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *API) rotateTenantWebhookSecret(c echo.Context) error {
	w, err := s.Webhooks.RotateSecretForTenant(c.Request().Context(), keyRecord(c).TenantID, c.Param("id"))
	if err != nil {
		return webhookErr(err, s.UpgradeURL)
	}
	return c.JSON(http.StatusOK, WebhookWithSecret{WebhookJSON: NewWebhookJSON(w.Webhook), Secret: w.Secret})
}
