package webhooks

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/netguard"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// Webhook is a webhook endpoint. Its secrets are for the relay alone: the service's
// reads leave them empty, and only Create and RotateSecret return the new one.
type Webhook = store.WebhookEndpoint

// WebhookAttempt is one recorded attempt to deliver an event to an endpoint.
type WebhookAttempt = store.WebhookAttempt

// noWebhook is an id naming no endpoint.
func noWebhook(id string) *agentqtype.NotFoundError {
	return &agentqtype.NotFoundError{What: "webhook endpoint", Name: id, Message: fmt.Sprintf("No webhook endpoint %s.", strconv.Quote(id))}
}

// invalidWebhook is a refused field of a webhook request: url, types, tenant, limit
// or after.
func invalidWebhook(field, format string, args ...any) *agentqtype.InvalidError {
	return agentqtype.Invalid(field, format, args...)
}

// Bounds of an endpoint.
const (
	MaxWebhookURL = 2048 // bytes
	// DefaultRotationGrace is how long the secret an endpoint had before a rotation
	// keeps signing its deliveries (next to the new one).
	DefaultRotationGrace = 24 * time.Hour
	// The pages of attempts.
	DefaultAttemptsLimit = 100
	MaxAttemptsLimit     = store.MaxWebhookAttemptsPage
)

// secretPrefix starts every webhook secret, as the Standard Webhooks spec has it.
const secretPrefix = "whsec_"

// WebhooksOptions configure the webhook endpoint service.
type WebhooksOptions struct {
	// RotationGrace is how long a replaced secret keeps signing (DefaultRotationGrace
	// when 0).
	RotationGrace time.Duration
	// Archetype holds the clock a rotation's grace is counted from; nil: the
	// defaults.
	Archetype *baseservice.Archetype
	// AllowNets are the networks an endpoint's address literal may be in although
	// they are loopback, link-local, private, CGNAT or unique local (refused
	// otherwise); the relay's own allow-list judges every address it dials.
	AllowNets []netip.Prefix
	// EndpointLimit is a tenant's webhook_endpoints limit: how many endpoints of its
	// own it may have (quotas.Unlimited for no cap). Nil refuses every tenant
	// endpoint.
	EndpointLimit func(ctx context.Context, tenantID string) (quotas.Limit, error)
}

// Webhooks manages the webhook endpoints the relay delivers the events to: the rules
// of an endpoint, its secret and its rotation, and its attempts. The admin API and
// the CLI go through it.
type Webhooks struct {
	st    *store.Store
	grace time.Duration
	arch  *baseservice.Archetype
	guard netguard.Guard
	limit func(ctx context.Context, tenantID string) (quotas.Limit, error)
}

// NewWebhooks returns the endpoint service on st.
func NewWebhooks(st *store.Store, o WebhooksOptions) *Webhooks {
	w := &Webhooks{st: st, grace: o.RotationGrace, arch: o.Archetype, guard: netguard.Guard{Allow: o.AllowNets}, limit: o.EndpointLimit}
	if w.limit == nil {
		w.limit = func(context.Context, string) (quotas.Limit, error) { return 0, nil }
	}
	if w.grace <= 0 {
		w.grace = DefaultRotationGrace
	}
	return w
}

// CreateWebhookParams are a new endpoint.
type CreateWebhookParams struct {
	URL   string   // absolute http or https
	Types []string // event types, at least one (KnownType)
	// TenantID limits the endpoint to one tenant's events; "" takes every tenant's.
	TenantID string
}

// WebhookWithSecret is an endpoint with its newly made secret: the answer of Create
// and RotateSecret, the only ones that carry it.
type WebhookWithSecret struct {
	Webhook Webhook
	Secret  string
}

// Create checks and stores an endpoint with a fresh secret. It receives the events
// written after it, of its types and tenant. A URL whose host is an address literal
// in a refused network (netguard) is refused; a name is judged by the relay each time
// it is dialled.
func (w *Webhooks) Create(ctx context.Context, p CreateWebhookParams) (WebhookWithSecret, error) {
	types, err := w.check(p.URL, p.Types)
	if err != nil {
		return WebhookWithSecret{}, err
	}
	secret, err := newWebhookSecret()
	if err != nil {
		return WebhookWithSecret{}, err
	}
	if p.TenantID != "" {
		if _, err := w.st.GetTenant(ctx, p.TenantID); errors.Is(err, agentqtype.ErrNotFound) {
			return WebhookWithSecret{}, invalidWebhook("tenant", "No tenant %s.", strconv.Quote(p.TenantID))
		} else if err != nil {
			return WebhookWithSecret{}, err
		}
	}
	var ep Webhook
	err = w.st.InTx(ctx, func(tx *store.Store) error {
		var err error
		ep, err = tx.UnscopedCreateWebhook(ctx, store.CreateWebhookParams{
			ID: uuid.New(), URL: p.URL, Types: types, TenantID: p.TenantID, Secret: secret,
		})
		if err != nil {
			return err
		}
		return record(ctx, tx, "webhook.create", nil, &ep)
	})
	if errors.Is(err, agentqtype.ErrNotFound) { // the tenant went meanwhile
		return WebhookWithSecret{}, invalidWebhook("tenant", "No tenant %s.", strconv.Quote(p.TenantID))
	}
	if err != nil {
		return WebhookWithSecret{}, err
	}
	return WebhookWithSecret{Webhook: hideSecrets(ep), Secret: secret}, nil
}

// check applies the rules of an endpoint's URL and types and returns the types
// without repeats.
func (w *Webhooks) check(rawURL string, given []string) ([]string, error) {
	if len(rawURL) > MaxWebhookURL || strings.ContainsFunc(rawURL, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
		return nil, invalidWebhook("url", "url must be printable ASCII of at most %d bytes.", MaxWebhookURL)
	}
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, invalidWebhook("url", "url must be an absolute http or https URL.")
	}
	var refused *netguard.RefusedError
	if errors.As(w.guard.CheckHost(u.Hostname()), &refused) {
		return nil, invalidWebhook("url",
			"Destination refused: url's host is %s; webhooks are delivered to public addresses only.", refused.Class)
	}
	if len(given) == 0 {
		return nil, invalidWebhook("types", "types must name at least one event type (%s).", strings.Join(outbox.Types, ", "))
	}
	var types []string
	for _, t := range given {
		if !outbox.KnownType(t) {
			return nil, invalidWebhook("types", "Unknown event type %s: use %s.", strconv.Quote(t), strings.Join(outbox.Types, ", "))
		}
		if !slices.Contains(types, t) {
			types = append(types, t)
		}
	}
	return types, nil
}

// newWebhookSecret is "whsec_" and the base64 of 32 random bytes, the form the
// Standard Webhooks libraries take.
func newWebhookSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return secretPrefix + base64.StdEncoding.EncodeToString(b), nil
}

func hideSecrets(ep Webhook) Webhook {
	ep.Secret, ep.PreviousSecret = "", ""
	return ep
}

// ParseWebhookID reads an endpoint id, a UUID in its 36-character form; anything else
// names no endpoint (a *agentqtype.NotFoundError), as does a UUID no endpoint has.
func ParseWebhookID(id string) (uuid.UUID, error) {
	u, err := uuid.Parse(id)
	if err != nil || len(id) != 36 {
		return uuid.Nil, noWebhook(id)
	}
	return u, nil
}

func (w *Webhooks) notFound(err error, id string) error {
	if errors.Is(err, agentqtype.ErrNotFound) {
		return noWebhook(id)
	}
	return err
}

// Get returns an endpoint, without its secrets.
func (w *Webhooks) Get(ctx context.Context, id string) (Webhook, error) {
	u, err := ParseWebhookID(id)
	if err != nil {
		return Webhook{}, err
	}
	ep, err := w.st.UnscopedGetWebhook(ctx, u)
	if err != nil {
		return Webhook{}, w.notFound(err, id)
	}
	return hideSecrets(ep), nil
}

// List returns every endpoint, disabled ones included, oldest first, without their
// secrets.
func (w *Webhooks) List(ctx context.Context) ([]Webhook, error) {
	eps, err := w.st.UnscopedListWebhooks(ctx)
	for i := range eps {
		eps[i] = hideSecrets(eps[i])
	}
	return eps, err
}

// WebhookHealth is an endpoint with the state of its deliveries: pending, retrying
// and failed counts and its newest failed attempt (the operator view).
type WebhookHealth = store.WebhookHealth

// Health lists every endpoint, oldest first, with the state of its deliveries.
func (w *Webhooks) Health(ctx context.Context) ([]WebhookHealth, error) {
	return w.st.UnscopedWebhookHealth(ctx)
}

// Delete removes an endpoint, its pending deliveries and its attempts. A send in
// flight to it finishes; nothing is sent to it after that.
func (w *Webhooks) Delete(ctx context.Context, id string) error {
	u, err := ParseWebhookID(id)
	if err != nil {
		return err
	}
	err = w.st.InTx(ctx, func(tx *store.Store) error {
		old, err := tx.UnscopedLockWebhook(ctx, u)
		if err != nil {
			return err
		}
		if err := tx.UnscopedDeleteWebhook(ctx, u); err != nil {
			return err
		}
		return record(ctx, tx, "webhook.delete", &old, nil)
	})
	return w.notFound(err, id)
}

// RotateSecret gives an endpoint a new secret and returns it. For the rotation grace
// every delivery carries a signature with the new secret and one with the replaced
// one, so the receiver can switch at its own pace; after it, only the new one. A
// second rotation within the grace ends the first one's: the secret before it no
// longer signs.
func (w *Webhooks) RotateSecret(ctx context.Context, id string) (WebhookWithSecret, error) {
	u, err := ParseWebhookID(id)
	if err != nil {
		return WebhookWithSecret{}, err
	}
	secret, err := newWebhookSecret()
	if err != nil {
		return WebhookWithSecret{}, err
	}
	var ep Webhook
	err = w.st.InTx(ctx, func(tx *store.Store) error {
		old, err := tx.UnscopedLockWebhook(ctx, u)
		if err != nil {
			return err
		}
		ep, err = tx.UnscopedRotateWebhookSecret(ctx, store.RotateWebhookParams{
			ID: u, Secret: secret, PreviousExpiresAt: w.arch.Now().Add(w.grace),
		})
		if err != nil {
			return err
		}
		return record(ctx, tx, actionRotate, &old, &ep)
	})
	if err != nil {
		return WebhookWithSecret{}, w.notFound(err, id)
	}
	return WebhookWithSecret{Webhook: hideSecrets(ep), Secret: secret}, nil
}

// AttemptsParams select a page of an endpoint's attempts, newest first: after the
// cursor After ("" from the newest), at most Limit (DefaultAttemptsLimit when 0).
type AttemptsParams struct {
	After string
	Limit int
}

// AttemptsPage is a page of attempts. Next is the cursor of the page after it, ""
// when this one is the last.
type AttemptsPage struct {
	Attempts []WebhookAttempt
	Next     string
}

// Attempts returns a page of an endpoint's delivery attempts, newest first.
func (w *Webhooks) Attempts(ctx context.Context, id string, p AttemptsParams) (AttemptsPage, error) {
	return w.attempts(ctx, id, p, func(u uuid.UUID) error {
		_, err := w.st.UnscopedGetWebhook(ctx, u)
		return err
	})
}

// AttemptsForTenant is Attempts for one of the tenant's own endpoints; any other id
// (another tenant's, the operator's) names no endpoint.
func (w *Webhooks) AttemptsForTenant(ctx context.Context, tenantID, id string, p AttemptsParams) (AttemptsPage, error) {
	return w.attempts(ctx, id, p, func(u uuid.UUID) error {
		_, err := w.st.GetTenantWebhook(ctx, store.TenantWebhookParams{TenantID: tenantID, ID: u})
		return err
	})
}

// attempts reads a page of the attempts of endpoint id, once exists says the caller
// may see it.
func (w *Webhooks) attempts(ctx context.Context, id string, p AttemptsParams, exists func(uuid.UUID) error) (AttemptsPage, error) {
	u, err := ParseWebhookID(id)
	if err != nil {
		return AttemptsPage{}, err
	}
	limit := p.Limit
	if limit == 0 {
		limit = DefaultAttemptsLimit
	}
	if limit < 0 || limit > MaxAttemptsLimit {
		return AttemptsPage{}, invalidWebhook("limit", "limit must be between 1 and %d.", MaxAttemptsLimit)
	}
	var before int64
	if p.After != "" {
		n, err := strconv.ParseInt(p.After, 10, 64)
		if err != nil || n <= 0 || strconv.FormatInt(n, 10) != p.After {
			return AttemptsPage{}, invalidWebhook("after", "Malformed cursor: pass after= a next_cursor this list gave.")
		}
		before = n
	}
	if err := exists(u); err != nil {
		return AttemptsPage{}, w.notFound(err, id)
	}
	as, err := w.st.UnscopedListWebhookAttempts(ctx, store.ListWebhookAttemptsParams{EndpointID: u, Before: before, Limit: limit + 1})
	if err != nil {
		return AttemptsPage{}, err
	}
	page := AttemptsPage{Attempts: as}
	if len(as) > limit {
		page.Attempts = as[:limit]
		page.Next = strconv.FormatInt(as[limit-1].ID, 10)
	}
	return page, nil
}

// WebhookLimitError is a tenant endpoint refused by the tenant's webhook_endpoints
// limit: it has Used endpoints of its own and may have Limit.
type WebhookLimitError struct {
	TenantID    string
	Limit, Used int64
}

func (e *WebhookLimitError) Error() string {
	if e.Limit == 0 {
		return "Your plan includes no webhook endpoints."
	}
	return fmt.Sprintf("Webhook endpoint limit of %d reached. Delete one, or upgrade your plan for more.", e.Limit)
}

// TenantWebhookParams are a tenant's new endpoint of its own.
type TenantWebhookParams struct {
	TenantID string
	URL      string   // absolute http or https, not an address literal in a refused network
	Types    []string // event types, at least one (KnownType)
}

// CreateForTenant checks and stores an endpoint of the tenant's own, with a fresh
// secret: it receives that tenant's events of its types written after it, and no
// other tenant's. The tenant may have as many as its webhook_endpoints limit says;
// one more is a *WebhookLimitError.
func (w *Webhooks) CreateForTenant(ctx context.Context, p TenantWebhookParams) (WebhookWithSecret, error) {
	types, err := w.check(p.URL, p.Types)
	if err != nil {
		return WebhookWithSecret{}, err
	}
	limit, err := w.limit(ctx, p.TenantID)
	if err != nil {
		return WebhookWithSecret{}, err
	}
	most := int64(-1)
	if !limit.Off() {
		most = int64(limit)
	}
	secret, err := newWebhookSecret()
	if err != nil {
		return WebhookWithSecret{}, err
	}
	var ep Webhook
	var n int64
	err = w.st.InTx(ctx, func(tx *store.Store) error {
		var err error
		ep, n, err = tx.CreateTenantWebhook(ctx, store.CreateTenantWebhookParams{
			TenantID: p.TenantID, ID: uuid.New(), URL: p.URL, Types: types, Secret: secret, Max: most,
		})
		if err != nil {
			return err
		}
		return record(ctx, tx, "webhook.create", nil, &ep)
	})
	if errors.Is(err, store.ErrWebhookLimit) {
		return WebhookWithSecret{}, &WebhookLimitError{TenantID: p.TenantID, Limit: most, Used: n}
	}
	if err != nil {
		return WebhookWithSecret{}, err
	}
	return WebhookWithSecret{Webhook: hideSecrets(ep), Secret: secret}, nil
}

// ListForTenant returns the tenant's own endpoints, oldest first, without secrets.
func (w *Webhooks) ListForTenant(ctx context.Context, tenantID string) ([]Webhook, error) {
	eps, err := w.st.ListTenantWebhooks(ctx, store.ListTenantWebhooksParams{TenantID: tenantID})
	for i := range eps {
		eps[i] = hideSecrets(eps[i])
	}
	return eps, err
}

// GetForTenant returns one of the tenant's own endpoints, without its secrets; any
// other id (another tenant's, the operator's) names no endpoint.
func (w *Webhooks) GetForTenant(ctx context.Context, tenantID, id string) (Webhook, error) {
	u, err := ParseWebhookID(id)
	if err != nil {
		return Webhook{}, err
	}
	ep, err := w.st.GetTenantWebhook(ctx, store.TenantWebhookParams{TenantID: tenantID, ID: u})
	if err != nil {
		return Webhook{}, w.notFound(err, id)
	}
	return hideSecrets(ep), nil
}

// DeleteForTenant removes one of the tenant's own endpoints, as Delete does.
func (w *Webhooks) DeleteForTenant(ctx context.Context, tenantID, id string) error {
	u, err := ParseWebhookID(id)
	if err != nil {
		return err
	}
	err = w.st.InTx(ctx, func(tx *store.Store) error {
		old, err := tx.GetTenantWebhook(ctx, store.TenantWebhookParams{TenantID: tenantID, ID: u})
		if err != nil {
			return err
		}
		if err := tx.DeleteTenantWebhook(ctx, store.TenantWebhookParams{TenantID: tenantID, ID: u}); err != nil {
			return err
		}
		return record(ctx, tx, "webhook.delete", &old, nil)
	})
	return w.notFound(err, id)
}

// RotateSecretForTenant gives one of the tenant's own endpoints a new secret, as
// RotateSecret does.
func (w *Webhooks) RotateSecretForTenant(ctx context.Context, tenantID, id string) (WebhookWithSecret, error) {
	u, err := ParseWebhookID(id)
	if err != nil {
		return WebhookWithSecret{}, err
	}
	secret, err := newWebhookSecret()
	if err != nil {
		return WebhookWithSecret{}, err
	}
	var ep Webhook
	err = w.st.InTx(ctx, func(tx *store.Store) error {
		old, err := tx.GetTenantWebhook(ctx, store.TenantWebhookParams{TenantID: tenantID, ID: u})
		if err != nil {
			return err
		}
		ep, err = tx.RotateTenantWebhookSecret(ctx, store.RotateTenantWebhookParams{TenantID: tenantID,
			RotateWebhookParams: store.RotateWebhookParams{ID: u, Secret: secret, PreviousExpiresAt: w.arch.Now().Add(w.grace)}})
		if err != nil {
			return err
		}
		return record(ctx, tx, actionRotate, &old, &ep)
	})
	if err != nil {
		return WebhookWithSecret{}, w.notFound(err, id)
	}
	return WebhookWithSecret{Webhook: hideSecrets(ep), Secret: secret}, nil
}
