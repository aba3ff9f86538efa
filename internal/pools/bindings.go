package pools

import (
	"context"
	"errors"
	"fmt"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
)

// BindParams bind an agent's steps to a pool: each reserves TokensPerStep tokens from
// it before it runs.
type BindParams struct {
	Agent         string
	Pool          string
	TokensPerStep int64
}

func noAgent(name string) *agentqtype.NotFoundError {
	return &agentqtype.NotFoundError{What: "agent", Name: name, Message: fmt.Sprintf("No agent %q: neither built in, registered in process, nor an HTTP agent.", name)}
}

func noBinding(name string) *agentqtype.NotFoundError {
	return &agentqtype.NotFoundError{What: "binding", Name: name, Message: fmt.Sprintf("Agent %q is bound to no pool.", name)}
}

// CheckBinding refuses a binding's fields before anything is read (an
// *agentqtype.InvalidError): Bind checks them too.
func CheckBinding(p BindParams) error {
	if p.Pool == "" {
		return invalid("pool", "pool is required.")
	}
	if err := CheckName(p.Pool); err != nil {
		return invalid("pool", "pool: %s", err.Error())
	}
	if p.TokensPerStep <= 0 || p.TokensPerStep > MaxTokensPerStep {
		return invalid("tokens_per_step", "tokens_per_step must be from 1 to %d.", int64(MaxTokensPerStep))
	}
	return nil
}

// Bind binds agent p.Agent to pool p.Pool, or moves it there; created reports a new
// binding. The agent must exist (built in, registered in process, or an HTTP agent)
// and so must the pool; otherwise a *agentqtype.NotFoundError.
func (s *Service) Bind(ctx context.Context, p BindParams) (created bool, err error) {
	if err := CheckBinding(p); err != nil {
		return false, err
	}
	if err := s.checkAgent(ctx, p.Agent); err != nil {
		return false, err
	}
	defer s.forget()
	err = s.d.Store.InTx(ctx, func(tx *store.Store) error {
		var err error
		created, _, err = putBinding(ctx, tx, p, nil)
		return err
	})
	if errors.Is(err, store.ErrMissingReference) {
		return false, noPool(p.Pool)
	}
	if err != nil {
		return false, fmt.Errorf("pools: bind %s: %w", p.Agent, err)
	}
	return created, nil
}

func (s *Service) checkAgent(ctx context.Context, name string) error {
	if s.d.Agents != nil && s.d.Agents.Local(name) {
		return nil
	}
	_, err := s.d.Store.GetAgent(ctx, name)
	if errors.Is(err, agentqtype.ErrNotFound) {
		return noAgent(name)
	}
	if err != nil {
		return fmt.Errorf("pools: agent %s: %w", name, err)
	}
	return nil
}

func boundOf(b store.AgentPool) Bound {
	return Bound{Agent: b.Agent, Pool: b.Pool, TokensPerStep: b.TokensPerStep, CreatedAt: b.CreatedAt, UpdatedAt: b.UpdatedAt}
}

// GetBinding returns agent's binding, or a *agentqtype.NotFoundError when it has
// none. It reads Postgres; the workers' lookup is Binding.
func (s *Service) GetBinding(ctx context.Context, agent string) (Bound, error) {
	b, err := s.d.Store.GetAgentPool(ctx, agent)
	if errors.Is(err, agentqtype.ErrNotFound) {
		return Bound{}, noBinding(agent)
	}
	if err != nil {
		return Bound{}, fmt.Errorf("pools: binding of %s: %w", agent, err)
	}
	return boundOf(b), nil
}

// Unbind removes agent's binding (its steps then reserve from no pool), or returns a
// *agentqtype.NotFoundError when it has none.
func (s *Service) Unbind(ctx context.Context, agent string) error {
	defer s.forget()
	err := s.d.Store.InTx(ctx, func(tx *store.Store) error {
		_, err := deleteBinding(ctx, tx, agent, nil)
		return err
	})
	if errors.Is(err, agentqtype.ErrNotFound) {
		return noBinding(agent)
	}
	if err != nil {
		return fmt.Errorf("pools: unbind %s: %w", agent, err)
	}
	return nil
}

// Binding is the workers' lookup, once per step: the pool agent's steps reserve from
// and how much, found=false when it is bound to none. It answers from a cache of
// CacheTTL, so a step does not read Postgres; this process's own writes apply at
// once, the others' within CacheTTL.
func (s *Service) Binding(ctx context.Context, agent string) (Binding, bool, error) {
	now := s.d.Now()
	s.mu.Lock()
	c, ok := s.cache[agent]
	gen := s.gen
	s.mu.Unlock()
	if ok && now.Sub(c.at) < CacheTTL && !now.Before(c.at) {
		return c.b, c.found, nil
	}
	jb, err := s.d.Store.GetAgentBinding(ctx, agent)
	c = cached{at: now}
	switch {
	case errors.Is(err, agentqtype.ErrNotFound):
	case err != nil:
		return Binding{}, false, fmt.Errorf("pools: binding of %s: %w", agent, err)
	default:
		c.b, c.found = Binding{Pool: configOf(jb.Pool), TokensPerStep: jb.TokensPerStep}, true
	}
	s.mu.Lock()
	if s.gen == gen { // no write since the read began: what it read is current
		if len(s.cache) >= cacheMax {
			clear(s.cache)
		}
		s.cache[agent] = c
	}
	s.mu.Unlock()
	return c.b, c.found, nil
}

// forget drops every cached binding: a pool's change touches each agent bound to it.
// It runs after the write, so a read that began before it caches nothing.
func (s *Service) forget() {
	s.mu.Lock()
	s.gen++
	clear(s.cache)
	s.mu.Unlock()
}
