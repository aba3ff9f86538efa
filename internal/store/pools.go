package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agentq/agentq/agentqtype"
)

// Pools and their agent bindings are the deployment's own configuration, shared by
// every tenant: their calls carry no tenant and no prefix.

// Pool is a model pool's stored configuration. BurstTokens and RequestsPerMinute are
// 0 when not set (one minute's worth; no request limit).
type Pool struct {
	Name              string
	TokensPerMinute   int64
	BurstTokens       int64
	RequestsPerMinute int64
	CreatedAt         time.Time
	UpdatedAt         time.Time
}

const poolCols = `name, tokens_per_minute, COALESCE(burst_tokens, 0), COALESCE(requests_per_minute, 0), created_at, updated_at`

// scanPoolRow scans poolCols, and a trailing created flag when withCreated.
func scanPoolRow(row pgx.Row, withCreated bool) (p Pool, created bool, err error) {
	dst := []any{&p.Name, &p.TokensPerMinute, &p.BurstTokens, &p.RequestsPerMinute, &p.CreatedAt, &p.UpdatedAt}
	if withCreated {
		dst = append(dst, &created)
	}
	if err := row.Scan(dst...); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return p, false, agentqtype.ErrNotFound
		}
		return p, false, err
	}
	return p, created, nil
}

func scanPool(row pgx.Row) (Pool, error) {
	p, _, err := scanPoolRow(row, false)
	return p, err
}

// PutPoolParams create or replace a pool. A zero BurstTokens or RequestsPerMinute
// is stored as not set.
type PutPoolParams struct {
	Name              string
	TokensPerMinute   int64
	BurstTokens       int64
	RequestsPerMinute int64
}

// PutPool creates or replaces a pool (the whole configuration); created reports
// which.
func (s *Store) PutPool(ctx context.Context, p PutPoolParams) (Pool, bool, error) {
	return scanPoolRow(s.db.QueryRow(ctx, `
		INSERT INTO pools (name, tokens_per_minute, burst_tokens, requests_per_minute)
		VALUES ($1, $2, NULLIF($3::bigint, 0), NULLIF($4::bigint, 0))
		ON CONFLICT (name) DO UPDATE SET tokens_per_minute = $2, burst_tokens = NULLIF($3::bigint, 0),
			requests_per_minute = NULLIF($4::bigint, 0), updated_at = now()
		RETURNING `+poolCols+`, (xmax = 0)`, p.Name, p.TokensPerMinute, p.BurstTokens, p.RequestsPerMinute), true)
}

// GetPool returns a pool by name; agentqtype.ErrNotFound if there is none.
func (s *Store) GetPool(ctx context.Context, name string) (Pool, error) {
	return scanPool(s.db.QueryRow(ctx, `SELECT `+poolCols+` FROM pools WHERE name = $1`, name))
}

// ListPools returns every pool, by name (never nil).
func (s *Store) ListPools(ctx context.Context) ([]Pool, error) {
	rows, err := s.db.Query(ctx, `SELECT `+poolCols+` FROM pools ORDER BY name`)
	out, err := collect(rows, err, scanPool)
	if out == nil && err == nil {
		out = []Pool{}
	}
	return out, err
}

// DeletePool removes a pool and, with it, its agents' bindings;
// agentqtype.ErrNotFound if there is none by that name.
func (s *Store) DeletePool(ctx context.Context, name string) error {
	tag, err := s.db.Exec(ctx, `DELETE FROM pools WHERE name = $1`, name)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return agentqtype.ErrNotFound
	}
	return nil
}

// AgentPool is an agent's binding to the pool its steps reserve from.
type AgentPool struct {
	Agent         string
	Pool          string
	TokensPerStep int64
	CreatedAt     time.Time
	UpdatedAt     time.Time
}

const agentPoolCols = `agent, pool, tokens_per_step, created_at, updated_at`

func scanAgentPoolRow(row pgx.Row, withCreated bool) (b AgentPool, created bool, err error) {
	dst := []any{&b.Agent, &b.Pool, &b.TokensPerStep, &b.CreatedAt, &b.UpdatedAt}
	if withCreated {
		dst = append(dst, &created)
	}
	if err := row.Scan(dst...); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return b, false, agentqtype.ErrNotFound
		}
		return b, false, err
	}
	return b, created, nil
}

func scanAgentPool(row pgx.Row) (AgentPool, error) {
	b, _, err := scanAgentPoolRow(row, false)
	return b, err
}

// PutAgentPoolParams bind an agent to a pool, or move it to another.
type PutAgentPoolParams struct {
	Agent         string
	Pool          string
	TokensPerStep int64
}

// PutAgentPool binds an agent to a pool, replacing its binding if it has one;
// created reports which. A pool that does not exist is ErrMissingReference.
func (s *Store) PutAgentPool(ctx context.Context, p PutAgentPoolParams) (AgentPool, bool, error) {
	return scanAgentPoolRow(s.db.QueryRow(ctx, `
		INSERT INTO agent_pools (agent, pool, tokens_per_step) VALUES ($1, $2, $3)
		ON CONFLICT (agent) DO UPDATE SET pool = $2, tokens_per_step = $3, updated_at = now()
		RETURNING `+agentPoolCols+`, (xmax = 0)`, p.Agent, p.Pool, p.TokensPerStep), true)
}

// GetAgentPool returns an agent's binding; agentqtype.ErrNotFound if it has none.
func (s *Store) GetAgentPool(ctx context.Context, agent string) (AgentPool, error) {
	return scanAgentPool(s.db.QueryRow(ctx, `SELECT `+agentPoolCols+` FROM agent_pools WHERE agent = $1`, agent))
}

// ListAgentPools returns every binding, by pool then agent (never nil).
func (s *Store) ListAgentPools(ctx context.Context) ([]AgentPool, error) {
	rows, err := s.db.Query(ctx, `SELECT `+agentPoolCols+` FROM agent_pools ORDER BY pool, agent`)
	out, err := collect(rows, err, scanAgentPool)
	if out == nil && err == nil {
		out = []AgentPool{}
	}
	return out, err
}

// ListPoolAgents returns a pool's bindings, by agent (never nil).
func (s *Store) ListPoolAgents(ctx context.Context, pool string) ([]AgentPool, error) {
	rows, err := s.db.Query(ctx, `SELECT `+agentPoolCols+` FROM agent_pools WHERE pool = $1 ORDER BY agent`, pool)
	out, err := collect(rows, err, scanAgentPool)
	if out == nil && err == nil {
		out = []AgentPool{}
	}
	return out, err
}

// AgentBinding is an agent's binding with its pool's configuration: what a step
// needs to reserve, in one read.
type AgentBinding struct {
	Pool          Pool
	TokensPerStep int64
}

// GetAgentBinding returns an agent's binding joined with its pool;
// agentqtype.ErrNotFound if the agent has none.
func (s *Store) GetAgentBinding(ctx context.Context, agent string) (AgentBinding, error) {
	var b AgentBinding
	p := &b.Pool
	err := s.db.QueryRow(ctx, `
		SELECT p.name, p.tokens_per_minute, COALESCE(p.burst_tokens, 0), COALESCE(p.requests_per_minute, 0),
			p.created_at, p.updated_at, a.tokens_per_step
		FROM agent_pools a JOIN pools p ON p.name = a.pool WHERE a.agent = $1`, agent).
		Scan(&p.Name, &p.TokensPerMinute, &p.BurstTokens, &p.RequestsPerMinute, &p.CreatedAt, &p.UpdatedAt, &b.TokensPerStep)
	if errors.Is(err, pgx.ErrNoRows) {
		return b, agentqtype.ErrNotFound
	}
	return b, err
}

// DeleteAgentPool unbinds an agent; agentqtype.ErrNotFound if it has no binding.
func (s *Store) DeleteAgentPool(ctx context.Context, agent string) error {
	tag, err := s.db.Exec(ctx, `DELETE FROM agent_pools WHERE agent = $1`, agent)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return agentqtype.ErrNotFound
	}
	return nil
}

// LockPool reads a pool and locks its row for the rest of the transaction;
// agentqtype.ErrNotFound if there is none.
func (s *Store) LockPool(ctx context.Context, name string) (Pool, error) {
	return scanPool(s.db.QueryRow(ctx, `SELECT `+poolCols+` FROM pools WHERE name = $1 FOR UPDATE`, name))
}

// LockAgentPool reads an agent's binding and locks it for the rest of the transaction;
// agentqtype.ErrNotFound if it has none.
func (s *Store) LockAgentPool(ctx context.Context, agent string) (AgentPool, error) {
	return scanAgentPool(s.db.QueryRow(ctx, `SELECT `+agentPoolCols+` FROM agent_pools WHERE agent = $1 FOR UPDATE`, agent))
}
