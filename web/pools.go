package web

import (
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/pools"
)

// PoolRequest is the body of PUT /v1/admin/pools/{name}: the whole configuration (an
// optional field left out goes back to its default).
type PoolRequest struct {
	TokensPerMinute   *int64 `json:"tokens_per_minute"`
	BurstTokens       *int64 `json:"burst_tokens"`
	RequestsPerMinute *int64 `json:"requests_per_minute"`
}

// PoolJSON is a pool as the admin API shows it: its configuration (BurstTokens the
// effective burst, RequestsPerMinute null when not limited), its live state and its
// agents.
type PoolJSON struct {
	Name                     string           `json:"name"`
	TokensPerMinute          int64            `json:"tokens_per_minute"`
	BurstTokens              int64            `json:"burst_tokens"`
	RequestsPerMinute        *int64           `json:"requests_per_minute"`
	EffectiveTokensPerMinute int64            `json:"effective_tokens_per_minute"`
	UsedLastMinute           int64            `json:"used_last_minute"`
	Level                    int64            `json:"level"`
	Throttled                bool             `json:"throttled"`
	Waiting                  []PoolWaiterJSON `json:"waiting"`
	Agents                   []PoolAgentJSON  `json:"agents"`
}

// PoolWaiterJSON is a tenant waiting on a pool with its share among the waiting
// tenants (its weight over theirs).
type PoolWaiterJSON struct {
	TenantID string  `json:"tenant_id"`
	Weight   int     `json:"weight"`
	Share    float64 `json:"share"`
}

// PoolAgentJSON is an agent bound to a pool.
type PoolAgentJSON struct {
	Agent         string `json:"agent"`
	TokensPerStep int64  `json:"tokens_per_step"`
}

// AgentPoolRequest is the body of PUT /v1/admin/agents/{name}/pool.
type AgentPoolRequest struct {
	Pool          string `json:"pool"`
	TokensPerStep *int64 `json:"tokens_per_step"`
}

// AgentPoolJSON is an agent's binding to a pool.
type AgentPoolJSON struct {
	Agent         string `json:"agent"`
	Pool          string `json:"pool"`
	TokensPerStep int64  `json:"tokens_per_step"`
}

// NewPoolJSON is p as the admin API shows it.
func NewPoolJSON(p pools.Pool) PoolJSON {
	out := PoolJSON{
		Name: p.Config.Name, TokensPerMinute: p.Config.TokensPerMinute, BurstTokens: p.Config.Burst(),
		EffectiveTokensPerMinute: p.Status.EffectiveRate, UsedLastMinute: p.Status.UsedLastMinute,
		Level: p.Status.Level, Throttled: p.Status.Throttled,
		Waiting: make([]PoolWaiterJSON, 0, len(p.Status.Waiting)), Agents: make([]PoolAgentJSON, 0, len(p.Agents)),
	}
	if p.Config.RequestsPerMinute > 0 {
		out.RequestsPerMinute = ptr(p.Config.RequestsPerMinute)
	}
	for _, w := range p.Status.Waiting {
		out.Waiting = append(out.Waiting, PoolWaiterJSON{TenantID: w.Tenant, Weight: w.Weight, Share: w.Share})
	}
	for _, a := range p.Agents {
		out.Agents = append(out.Agents, PoolAgentJSON{Agent: a.Agent, TokensPerStep: a.TokensPerStep})
	}
	return out
}

// NewPoolsJSON is GET /v1/admin/pools's body.
func NewPoolsJSON(ps []pools.Pool) map[string][]PoolJSON {
	out := make([]PoolJSON, 0, len(ps))
	for _, p := range ps {
		out = append(out, NewPoolJSON(p))
	}
	return map[string][]PoolJSON{"pools": out}
}

// NewAgentPoolJSON is b as the admin API shows it.
func NewAgentPoolJSON(b pools.Bound) AgentPoolJSON {
	return AgentPoolJSON{Agent: b.Agent, Pool: b.Pool, TokensPerStep: b.TokensPerStep}
}

// poolErr turns the pool service's errors into the API's.
func poolErr(err error) error {
	var inv *agentqtype.InvalidError
	var nf *agentqtype.NotFoundError
	switch {
	case errors.As(err, &inv):
		return apiErr(http.StatusBadRequest, CodeInvalidRequest, "%s", inv.Message)
	case errors.As(err, &nf):
		return apiErr(http.StatusNotFound, CodeNotFound, "%s", nf.Message)
	}
	return err
}

func (s *Server) putPool(c echo.Context) error {
	name := c.Param("name")
	// The name is judged before the body is read: a bad name is the answer whatever
	// the body holds.
	if err := pools.CheckName(name); err != nil {
		return poolErr(err)
	}
	body, err := readBody(c)
	if err != nil {
		return err
	}
	var r PoolRequest
	if err := decodeStrict(body, &r, false); err != nil {
		return err
	}
	cfg, err := pools.ConfigOf(pools.ConfigParams{
		Name: name, TokensPerMinute: r.TokensPerMinute, BurstTokens: r.BurstTokens, RequestsPerMinute: r.RequestsPerMinute,
	})
	if err != nil {
		return poolErr(err)
	}
	ctx := c.Request().Context()
	created, err := s.Pools.Put(ctx, cfg)
	if err != nil {
		return poolErr(err)
	}
	p, err := s.Pools.Get(ctx, name)
	if err != nil {
		return poolErr(err)
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return c.JSON(status, NewPoolJSON(p))
}

func (s *Server) getPool(c echo.Context) error {
	p, err := s.Pools.Get(c.Request().Context(), c.Param("name"))
	if err != nil {
		return poolErr(err)
	}
	return c.JSON(http.StatusOK, NewPoolJSON(p))
}

func (s *Server) listPools(c echo.Context) error {
	ps, err := s.Pools.List(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, NewPoolsJSON(ps))
}

func (s *Server) deletePool(c echo.Context) error {
	if err := s.Pools.Delete(c.Request().Context(), c.Param("name")); err != nil {
		return poolErr(err)
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) putAgentPool(c echo.Context) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	var r AgentPoolRequest
	if err := decodeStrict(body, &r, false); err != nil {
		return err
	}
	p := pools.BindParams{Agent: c.Param("name"), Pool: r.Pool}
	if r.TokensPerStep != nil {
		p.TokensPerStep = *r.TokensPerStep
	}
	created, err := s.Pools.Bind(c.Request().Context(), p)
	if err != nil {
		return poolErr(err)
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return c.JSON(status, AgentPoolJSON{Agent: p.Agent, Pool: p.Pool, TokensPerStep: p.TokensPerStep})
}

func (s *Server) getAgentPool(c echo.Context) error {
	b, err := s.Pools.GetBinding(c.Request().Context(), c.Param("name"))
	if err != nil {
		return poolErr(err)
	}
	return c.JSON(http.StatusOK, NewAgentPoolJSON(b))
}

func (s *Server) deleteAgentPool(c echo.Context) error {
	if err := s.Pools.Unbind(c.Request().Context(), c.Param("name")); err != nil {
		return poolErr(err)
	}
	return c.NoContent(http.StatusNoContent)
}
