package audit

import (
	"time"

	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// The states a row's before and after hold, one per kind of object. They are built
// here and only here, so that every secret is masked the same way: a key's secret,
// an agent's signing secret and header values, a webhook endpoint's secret appear as
// Mask (or not at all), never as themselves.

// TenantState is a tenant's configuration: what its limits and its billing depend on.
type TenantState struct {
	Name       string                  `json:"name"`
	Plan       string                  `json:"plan"`
	Weight     *int                    `json:"weight"`
	Overrides  map[string]quotas.Limit `json:"overrides"`
	Status     string                  `json:"status"`
	BillingDay *int                    `json:"billing_day"`
	TimeZone   *string                 `json:"time_zone"`
}

// Tenant is t's state.
func Tenant(t store.Tenant) *TenantState {
	ov := t.Overrides
	if ov == nil {
		ov = map[string]quotas.Limit{}
	}
	return &TenantState{Name: t.Name, Plan: t.Plan, Weight: t.Weight, Overrides: ov, Status: t.Status,
		BillingDay: t.BillingDay, TimeZone: t.TimeZone}
}

// PanelLinksState is when a tenant's panel links were last revoked, or, for a link
// handed out, when it expires (never the link: it is a credential).
type PanelLinksState struct {
	ValidAfter *time.Time `json:"links_valid_after,omitempty"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
}

// PanelLinks is the revocation mark of t.
func PanelLinks(t store.Tenant) *PanelLinksState {
	if t.PanelLinksValidAfter == nil {
		return &PanelLinksState{}
	}
	at := rowTime(*t.PanelLinksValidAfter)
	return &PanelLinksState{ValidAfter: &at}
}

// PanelLink is a link handed out, expiring at exp.
func PanelLink(exp time.Time) *PanelLinksState {
	at := rowTime(exp)
	return &PanelLinksState{ExpiresAt: &at}
}

// KeyState is an API key without its secret, which is Mask.
type KeyState struct {
	Kid       string       `json:"kid"`
	Tenant    string       `json:"tenant"`
	Scopes    store.Scopes `json:"scopes"`
	Secret    string       `json:"secret"`
	RotatedAt *time.Time   `json:"rotated_at"`
	RevokedAt *time.Time   `json:"revoked_at"`
}

// Key is k's state.
func Key(k store.APIKey) *KeyState {
	return &KeyState{Kid: k.Kid, Tenant: k.TenantID, Scopes: k.Scopes, Secret: Mask, RotatedAt: timeOf(k.RotatedAt),
		RevokedAt: timeOf(k.RevokedAt)}
}

// AgentState is an HTTP agent: its URL and settings, header names with their values
// masked, its signing secret masked ("" when it has none of its own).
type AgentState struct {
	URL                    string            `json:"url"`
	StepTimeoutS           float64           `json:"step_timeout_s"`
	Headers                map[string]string `json:"headers"`
	SigningSecret          string            `json:"signing_secret"`
	SigningSecretCreatedAt *time.Time        `json:"signing_secret_created_at"`
}

// Agent is a's state.
func Agent(a store.Agent) *AgentState {
	h := make(map[string]string, len(a.Headers))
	for k := range a.Headers {
		h[k] = Mask
	}
	s := &AgentState{URL: a.URL, StepTimeoutS: a.StepTimeoutS, Headers: h, SigningSecretCreatedAt: timeOf(a.SigningSecretCreatedAt)}
	if a.SigningSecret != "" {
		s.SigningSecret = Mask
	}
	return s
}

// PoolState is a model pool's configuration (0: the default).
type PoolState struct {
	TokensPerMinute   int64 `json:"tokens_per_minute"`
	BurstTokens       int64 `json:"burst_tokens"`
	RequestsPerMinute int64 `json:"requests_per_minute"`
}

// Pool is p's state.
func Pool(p store.Pool) *PoolState {
	return &PoolState{TokensPerMinute: p.TokensPerMinute, BurstTokens: p.BurstTokens, RequestsPerMinute: p.RequestsPerMinute}
}

// BindingState is an agent's binding to a pool.
type BindingState struct {
	Pool          string `json:"pool"`
	TokensPerStep int64  `json:"tokens_per_step"`
}

// Binding is b's state.
func Binding(b store.AgentPool) *BindingState {
	return &BindingState{Pool: b.Pool, TokensPerStep: b.TokensPerStep}
}

// WebhookState is a webhook endpoint: its secret masked, whether it is enabled.
type WebhookState struct {
	URL            string   `json:"url"`
	Types          []string `json:"types"`
	Tenant         string   `json:"tenant,omitempty"`
	Owner          string   `json:"owner"` // operator or tenant
	Enabled        bool     `json:"enabled"`
	DisabledReason string   `json:"disabled_reason,omitempty"`
	Secret         string   `json:"secret"`
	// PreviousSecretExpiresAt moves with each rotation: when the replaced secret stops
	// signing.
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
}

// Webhook is w's state.
func Webhook(w store.WebhookEndpoint) *WebhookState {
	s := &WebhookState{URL: w.URL, Types: w.Types, Tenant: w.TenantID, Owner: "operator", Enabled: w.DisabledAt == nil,
		DisabledReason: w.DisabledReason, Secret: Mask, PreviousSecretExpiresAt: timeOf(w.PreviousSecretExpiresAt)}
	if w.TenantOwned {
		s.Owner = "tenant"
	}
	if s.Types == nil {
		s.Types = []string{}
	}
	return s
}

// BudgetState is a task's budget.
type BudgetState struct {
	Budget quotas.TaskBudget `json:"budget"`
}

func timeOf(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := rowTime(*t)
	return &u
}

// CredentialState is an admin credential: its role, its token masked.
type CredentialState struct {
	Role      string     `json:"role"`
	Token     string     `json:"token"`
	RotatedAt *time.Time `json:"rotated_at"`
	RevokedAt *time.Time `json:"revoked_at"`
}

// Credential is c's state.
func Credential(c store.AdminCredential) *CredentialState {
	return &CredentialState{Role: string(c.Role), Token: Mask, RotatedAt: timeOf(c.RotatedAt), RevokedAt: timeOf(c.RevokedAt)}
}
