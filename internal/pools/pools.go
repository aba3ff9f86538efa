// Package pools is the model-pool domain service: the operator's pools (a shared
// token capacity, an upstream model's rate limit, that every tenant's steps draw on),
// the agents bound to them, the rules both must satisfy, and the binding lookup
// through which the workers find, per step, the pool an agent reserves from. The
// configuration lives in Postgres; a pool's live state (its bucket, effective rate
// and waiting tenants) in Redis, read through quotas/capacity. The admin API and the CLI go
// through it; it knows nothing of HTTP requests.
package pools

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/capacity"
)

// Bounds of a pool's configuration and of a binding.
const (
	MaxTokensPerMinute   = 1_000_000_000_000 // 1e12: far above any upstream, well inside Lua's exact integers
	MaxRequestsPerMinute = 1_000_000_000_000
	MaxTokensPerStep     = 1_000_000_000_000
)

// CacheTTL is how long Binding trusts what it read: a change made through another
// process (a PUT of a pool's rate, a binding) reaches every worker within it. This
// process's own changes apply at once.
const CacheTTL = time.Second

// cacheMax bounds the agents Binding remembers; past it the cache starts over.
const cacheMax = 4096

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// noPool is an unknown pool. An unknown agent and an agent without a binding are
// *agentqtype.NotFoundError too, of What "agent" and "binding".
func noPool(name string) *agentqtype.NotFoundError {
	return &agentqtype.NotFoundError{What: "pool", Name: name, Message: fmt.Sprintf("No pool %q.", name)}
}

// invalid is a refused field: name, tokens_per_minute, burst_tokens,
// requests_per_minute, pool or tokens_per_step.
func invalid(field, format string, args ...any) *agentqtype.InvalidError {
	return agentqtype.Invalid(field, format, args...)
}

// Agents tells the agents that run in process (the built-in sim, Go handlers): with
// the HTTP agents in Postgres, the agents a pool may be bound to.
type Agents interface {
	Local(name string) bool
}

// Pool is a pool's configuration with its live state and the agents bound to it.
type Pool struct {
	Config    quotas.PoolConfig
	Status    quotas.PoolStatus // zero when the service has no Capacity
	Agents    []AgentTokens     // by agent, never nil
	CreatedAt time.Time
	UpdatedAt time.Time
}

// AgentTokens is one agent bound to a pool and what each of its steps reserves.
type AgentTokens struct {
	Agent         string
	TokensPerStep int64
}

// Binding is what a step of a bound agent reserves: from Pool, TokensPerStep tokens.
type Binding = quotas.PoolBinding

// Bound is an agent's binding as the API shows it.
type Bound struct {
	Agent         string
	Pool          string
	TokensPerStep int64
	CreatedAt     time.Time
	UpdatedAt     time.Time
}

// Deps are the service's collaborators. Store is required.
type Deps struct {
	Store *store.Store
	// Capacity reads the pools' live state; nil: Get and List show a zero status.
	Capacity *capacity.Pools
	// Agents names the in-process agents; nil: only HTTP agents may be bound.
	Agents Agents
	// Now is Binding's cache clock (nil: time.Now).
	Now func() time.Time
}

// Service manages pools and bindings.
type Service struct {
	d Deps

	mu    sync.Mutex
	gen   uint64 // moved by every write, so a read that raced one caches nothing
	cache map[string]cached
}

type cached struct {
	b     Binding
	found bool
	at    time.Time
}

// New returns the service.
func New(d Deps) *Service {
	if d.Now == nil {
		d.Now = time.Now
	}
	return &Service{d: d, cache: map[string]cached{}}
}

// ConfigParams are a pool's fields as a request gives them: nil is not given
// (burst_tokens: one minute's worth; requests_per_minute: not limited).
type ConfigParams struct {
	Name              string
	TokensPerMinute   *int64
	BurstTokens       *int64
	RequestsPerMinute *int64
}

// ConfigOf turns a request's fields into a pool's configuration, refusing a missing
// rate and an optional field given as 0 or less (an *agentqtype.InvalidError); Put
// then checks the rest.
func ConfigOf(p ConfigParams) (quotas.PoolConfig, error) {
	c := quotas.PoolConfig{Name: p.Name}
	if p.TokensPerMinute == nil {
		return c, invalid("tokens_per_minute", "tokens_per_minute is required.")
	}
	c.TokensPerMinute = *p.TokensPerMinute
	if p.BurstTokens != nil {
		if *p.BurstTokens <= 0 {
			return c, invalid("burst_tokens", "burst_tokens must be above 0 (leave it out for one minute's worth).")
		}
		c.BurstTokens = *p.BurstTokens
	}
	if p.RequestsPerMinute != nil {
		if *p.RequestsPerMinute <= 0 {
			return c, invalid("requests_per_minute", "requests_per_minute must be above 0 (leave it out for no request limit).")
		}
		c.RequestsPerMinute = *p.RequestsPerMinute
	}
	return c, nil
}

// CheckName refuses a name a pool cannot have (an *agentqtype.InvalidError). Put
// checks it too; callers that read a request body after the name call it first.
func CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return invalid("name", "Pool names are 1 to 63 lower-case letters, digits, '.', '-' or '_', starting with a letter or digit.")
	}
	return nil
}

func checkConfig(c quotas.PoolConfig) error {
	if err := CheckName(c.Name); err != nil {
		return err
	}
	if c.TokensPerMinute <= 0 || c.TokensPerMinute > MaxTokensPerMinute {
		return invalid("tokens_per_minute", "tokens_per_minute must be from 1 to %d.", int64(MaxTokensPerMinute))
	}
	if c.BurstTokens < 0 || c.BurstTokens > c.TokensPerMinute {
		return invalid("burst_tokens", "burst_tokens must be above 0 and at most tokens_per_minute (one minute's worth, the default).")
	}
	if c.RequestsPerMinute < 0 || c.RequestsPerMinute > MaxRequestsPerMinute {
		return invalid("requests_per_minute", "requests_per_minute must be from 1 to %d, or left out.", int64(MaxRequestsPerMinute))
	}
	return nil
}

// Put creates pool c.Name, or replaces its whole configuration: BurstTokens 0 is one
// minute's worth, RequestsPerMinute 0 no request limit. A changed rate applies to the
// pool's next reservation in this process, within CacheTTL in the others.
func (s *Service) Put(ctx context.Context, c quotas.PoolConfig) (created bool, err error) {
	if err := checkConfig(c); err != nil {
		return false, err
	}
	defer s.forget()
	err = s.d.Store.InTx(ctx, func(tx *store.Store) error {
		var err error
		created, _, err = putPool(ctx, tx, c, nil)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("pools: put %s: %w", c.Name, err)
	}
	return created, nil
}

// Get returns pool name with its live state and agents, or a *agentqtype.NotFoundError.
func (s *Service) Get(ctx context.Context, name string) (Pool, error) {
	p, err := s.d.Store.GetPool(ctx, name)
	if errors.Is(err, agentqtype.ErrNotFound) {
		return Pool{}, noPool(name)
	}
	if err != nil {
		return Pool{}, fmt.Errorf("pools: get %s: %w", name, err)
	}
	bs, err := s.d.Store.ListPoolAgents(ctx, name)
	if err != nil {
		return Pool{}, fmt.Errorf("pools: agents of %s: %w", name, err)
	}
	return s.withStatus(ctx, p, bs)
}

// List returns every pool, by name, with its live state and agents (never nil).
func (s *Service) List(ctx context.Context) ([]Pool, error) {
	ps, err := s.d.Store.ListPools(ctx)
	if err != nil {
		return nil, fmt.Errorf("pools: list: %w", err)
	}
	bs, err := s.d.Store.ListAgentPools(ctx)
	if err != nil {
		return nil, fmt.Errorf("pools: list bindings: %w", err)
	}
	byPool := map[string][]store.AgentPool{}
	for _, b := range bs {
		byPool[b.Pool] = append(byPool[b.Pool], b)
	}
	out := make([]Pool, 0, len(ps))
	for _, p := range ps {
		pl, err := s.withStatus(ctx, p, byPool[p.Name])
		if err != nil {
			return nil, err
		}
		out = append(out, pl)
	}
	return out, nil
}

func (s *Service) withStatus(ctx context.Context, p store.Pool, bs []store.AgentPool) (Pool, error) {
	out := Pool{Config: configOf(p), Agents: make([]AgentTokens, 0, len(bs)), CreatedAt: p.CreatedAt, UpdatedAt: p.UpdatedAt}
	for _, b := range bs {
		out.Agents = append(out.Agents, AgentTokens{Agent: b.Agent, TokensPerStep: b.TokensPerStep})
	}
	if s.d.Capacity == nil {
		out.Status = quotas.PoolStatus{Level: out.Config.Burst(), EffectiveRate: out.Config.TokensPerMinute}
		return out, nil
	}
	st, err := s.d.Capacity.PoolStatus(ctx, out.Config)
	if err != nil {
		return Pool{}, fmt.Errorf("pools: status of %s: %w", p.Name, err)
	}
	out.Status = st
	return out, nil
}

func configOf(p store.Pool) quotas.PoolConfig {
	return quotas.PoolConfig{Name: p.Name, TokensPerMinute: p.TokensPerMinute, BurstTokens: p.BurstTokens, RequestsPerMinute: p.RequestsPerMinute}
}

// Delete removes pool name and its agents' bindings (their steps then reserve from no
// pool), or returns a *agentqtype.NotFoundError.
func (s *Service) Delete(ctx context.Context, name string) error {
	defer s.forget()
	err := s.d.Store.InTx(ctx, func(tx *store.Store) error {
		_, err := deletePool(ctx, tx, name, nil)
		return err
	})
	if errors.Is(err, agentqtype.ErrNotFound) {
		return noPool(name)
	}
	if err != nil {
		return fmt.Errorf("pools: delete %s: %w", name, err)
	}
	return nil
}

// maxEntitlementSeries bounds the tenants whose entitlement a pool's gauge shows at
// one collection: those with the largest shares.
const maxEntitlementSeries = 20

// topWaiting is the n waiting tenants with the largest shares (ties by tenant id).
func topWaiting(ws []quotas.PoolWaiter, n int) []quotas.PoolWaiter {
	if len(ws) <= n {
		return ws
	}
	top := slices.Clone(ws)
	slices.SortFunc(top, func(a, b quotas.PoolWaiter) int {
		if c := cmp.Compare(b.Share, a.Share); c != 0 {
			return c
		}
		return cmp.Compare(a.Tenant, b.Tenant)
	})
	return top[:n]
}

// Instrument registers the pools' gauges on mp: each pool's configured and effective
// rate and the tokens it granted in the last minute, and the entitlement of each of
// the (at most maxEntitlementSeries, the largest) waiting tenants (its weight's share
// among the tenants waiting). With the workers'
// agentq.pool_tokens counter (tokens each tenant drew from each pool) they show each
// tenant's share of a pool against its entitlement. The pools are read at each
// collection.
func (s *Service) Instrument(mp metric.MeterProvider) error {
	m := mp.Meter("github.com/agentq/agentq/internal/pools")
	configured, err1 := m.Int64ObservableGauge("agentq.pool_configured_rate", metric.WithUnit("{token}"),
		metric.WithDescription("A model pool's configured tokens a minute"))
	effective, err2 := m.Int64ObservableGauge("agentq.pool_effective_rate", metric.WithUnit("{token}"),
		metric.WithDescription("A model pool's effective tokens a minute: lowered by throttled answers, climbing back while none comes"))
	used, err3 := m.Int64ObservableGauge("agentq.pool_used_last_minute", metric.WithUnit("{token}"),
		metric.WithDescription("Tokens a model pool granted in the last minute"))
	entitled, err4 := m.Float64ObservableGauge("agentq.pool_entitlement", metric.WithUnit("1"),
		metric.WithDescription("A waiting tenant's entitled share of a model pool: its weight over the waiting tenants' weights"))
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return fmt.Errorf("pools: instruments: %w", err)
	}
	_, err := m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		ps, err := s.List(ctx)
		if err != nil {
			return err
		}
		for _, p := range ps {
			pool := attribute.String("pool", p.Config.Name)
			o.ObserveInt64(configured, p.Config.TokensPerMinute, metric.WithAttributes(pool))
			o.ObserveInt64(effective, p.Status.EffectiveRate, metric.WithAttributes(pool))
			o.ObserveInt64(used, p.Status.UsedLastMinute, metric.WithAttributes(pool))
			for _, w := range topWaiting(p.Status.Waiting, maxEntitlementSeries) {
				o.ObserveFloat64(entitled, w.Share, metric.WithAttributes(pool, attribute.String("tenant_id", w.Tenant)))
			}
		}
		return nil
	}, configured, effective, used, entitled)
	return err
}
