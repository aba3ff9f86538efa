package client

import (
	"context"
	"net/http"
	"net/url"
)

// PoolRequest is a model pool's whole configuration (PUT /v1/admin/pools/{name}): a
// field left at 0 is its default.
type PoolRequest struct {
	TokensPerMinute   int64 `json:"tokens_per_minute"`             // the pool's rate (> 0)
	BurstTokens       int64 `json:"burst_tokens,omitempty"`        // 0: one minute's worth
	RequestsPerMinute int64 `json:"requests_per_minute,omitempty"` // 0: not limited
}

// Pool is a model pool: its configuration, its live state and its agents.
type Pool struct {
	Name            string `json:"name"`
	TokensPerMinute int64  `json:"tokens_per_minute"`
	// BurstTokens is the effective burst: as configured, else one minute's worth.
	BurstTokens int64 `json:"burst_tokens"`
	// RequestsPerMinute is nil when the pool does not limit requests.
	RequestsPerMinute *int64 `json:"requests_per_minute"`
	// EffectiveTokensPerMinute is the rate the pool grants at now, lowered while the
	// upstream answers throttled.
	EffectiveTokensPerMinute int64        `json:"effective_tokens_per_minute"`
	UsedLastMinute           int64        `json:"used_last_minute"`
	Level                    int64        `json:"level"` // tokens in the bucket; negative: in debt
	Throttled                bool         `json:"throttled"`
	Waiting                  []PoolWaiter `json:"waiting"`
	Agents                   []PoolAgent  `json:"agents"`
}

// PoolWaiter is a tenant waiting on a pool, with its share among the waiting tenants.
type PoolWaiter struct {
	TenantID string  `json:"tenant_id"`
	Weight   int     `json:"weight"`
	Share    float64 `json:"share"`
}

// PoolAgent is an agent bound to a pool.
type PoolAgent struct {
	Agent         string `json:"agent"`
	TokensPerStep int64  `json:"tokens_per_step"`
}

// AgentPool is an agent's binding: each of its steps reserves TokensPerStep tokens
// from Pool before it runs.
type AgentPool struct {
	Agent         string `json:"agent"`
	Pool          string `json:"pool"`
	TokensPerStep int64  `json:"tokens_per_step"`
}

func poolPath(name string) string { return "/v1/admin/pools/" + url.PathEscape(name) }

func agentPoolPath(agent string) string { return "/v1/admin/agents/" + url.PathEscape(agent) + "/pool" }

// PutPool creates pool name (201) or replaces its whole configuration (200).
func (a *Admin) PutPool(ctx context.Context, name string, req PoolRequest) (*Pool, error) {
	var p Pool
	if err := a.t.do(ctx, http.MethodPut, poolPath(name), nil, nil, req, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// GetPool returns a pool with its live state.
func (a *Admin) GetPool(ctx context.Context, name string) (*Pool, error) {
	var p Pool
	if err := a.t.do(ctx, http.MethodGet, poolPath(name), nil, nil, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// ListPools returns every pool, by name.
func (a *Admin) ListPools(ctx context.Context) ([]Pool, error) {
	var out struct {
		Pools []Pool `json:"pools"`
	}
	if err := a.t.do(ctx, http.MethodGet, "/v1/admin/pools", nil, nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Pools, nil
}

// DeletePool removes a pool and unbinds its agents (204).
func (a *Admin) DeletePool(ctx context.Context, name string) error {
	return a.t.do(ctx, http.MethodDelete, poolPath(name), nil, nil, nil, nil)
}

// BindAgentPool binds agent to pool (201), or moves it there (200): each of its steps
// then reserves tokensPerStep tokens from the pool before it runs.
func (a *Admin) BindAgentPool(ctx context.Context, agent, pool string, tokensPerStep int64) (*AgentPool, error) {
	body := struct {
		Pool          string `json:"pool"`
		TokensPerStep int64  `json:"tokens_per_step"`
	}{pool, tokensPerStep}
	var b AgentPool
	if err := a.t.do(ctx, http.MethodPut, agentPoolPath(agent), nil, nil, body, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// GetAgentPool returns agent's binding; a 404 *Error when it has none.
func (a *Admin) GetAgentPool(ctx context.Context, agent string) (*AgentPool, error) {
	var b AgentPool
	if err := a.t.do(ctx, http.MethodGet, agentPoolPath(agent), nil, nil, nil, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// UnbindAgentPool removes agent's binding (204).
func (a *Admin) UnbindAgentPool(ctx context.Context, agent string) error {
	return a.t.do(ctx, http.MethodDelete, agentPoolPath(agent), nil, nil, nil, nil)
}
