package pools_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/pools"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/capacity"
	"github.com/agentq/agentq/runtime"
)

// clock is a settable clock for the binding cache.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type fixture struct {
	st  *store.Store
	q   *capacity.Pools
	svc *pools.Service
	clk *clock
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	st := store.New(testenv.Postgres(t))
	rdb, rk := testenv.Redis(t, 1)
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	q := capacity.NewPools(rdb, rk, func() int64 { return clk.Now().UnixMilli() })
	f := &fixture{st: st, q: q, clk: clk}
	f.svc = f.instance()
	return f
}

// instance is another process's service on the same Postgres and Redis.
func (f *fixture) instance() *pools.Service {
	return pools.New(pools.Deps{Store: f.st, Capacity: f.q, Agents: runtime.NewRegistry(), Now: f.clk.Now})
}

func ptr(n int64) *int64 { return &n }

func TestPutRefusesBadConfigurations(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	cases := []struct {
		name  string
		cfg   quotas.PoolConfig
		field string
	}{
		{"empty name", quotas.PoolConfig{TokensPerMinute: 1}, "name"},
		{"upper case", quotas.PoolConfig{Name: "LLM", TokensPerMinute: 1}, "name"},
		{"leading dash", quotas.PoolConfig{Name: "-llm", TokensPerMinute: 1}, "name"},
		{"braces", quotas.PoolConfig{Name: "a{b}", TokensPerMinute: 1}, "name"},
		{"64 bytes", quotas.PoolConfig{Name: "a234567890123456789012345678901234567890123456789012345678901234", TokensPerMinute: 1}, "name"},
		{"no rate", quotas.PoolConfig{Name: "llm"}, "tokens_per_minute"},
		{"negative rate", quotas.PoolConfig{Name: "llm", TokensPerMinute: -5}, "tokens_per_minute"},
		{"rate above 1e12", quotas.PoolConfig{Name: "llm", TokensPerMinute: pools.MaxTokensPerMinute + 1}, "tokens_per_minute"},
		{"burst above a minute", quotas.PoolConfig{Name: "llm", TokensPerMinute: 100, BurstTokens: 101}, "burst_tokens"},
		{"negative burst", quotas.PoolConfig{Name: "llm", TokensPerMinute: 100, BurstTokens: -1}, "burst_tokens"},
		{"negative requests", quotas.PoolConfig{Name: "llm", TokensPerMinute: 100, RequestsPerMinute: -1}, "requests_per_minute"},
	}
	for _, c := range cases {
		_, err := f.svc.Put(ctx, c.cfg)
		var inv *agentqtype.InvalidError
		if !errors.As(err, &inv) || inv.Field != c.field || inv.Message == "" {
			t.Errorf("%s: %v, want an invalid %s", c.name, err, c.field)
		}
	}
	for name, p := range map[string]pools.ConfigParams{
		"no rate":         {Name: "llm"},
		"burst 0":         {Name: "llm", TokensPerMinute: ptr(10), BurstTokens: ptr(0)},
		"requests 0":      {Name: "llm", TokensPerMinute: ptr(10), RequestsPerMinute: ptr(0)},
		"negative burst":  {Name: "llm", TokensPerMinute: ptr(10), BurstTokens: ptr(-3)},
		"negative requst": {Name: "llm", TokensPerMinute: ptr(10), RequestsPerMinute: ptr(-3)},
	} {
		var inv *agentqtype.InvalidError
		if _, err := pools.ConfigOf(p); !errors.As(err, &inv) {
			t.Errorf("ConfigOf %s: %v", name, err)
		}
	}
	if ps, err := f.svc.List(ctx); err != nil || len(ps) != 0 {
		t.Fatalf("refused configurations were stored: %+v %v", ps, err)
	}
	// The bounds themselves are fine.
	c, err := pools.ConfigOf(pools.ConfigParams{Name: "a.b_c-9", TokensPerMinute: ptr(pools.MaxTokensPerMinute), BurstTokens: ptr(pools.MaxTokensPerMinute), RequestsPerMinute: ptr(1)})
	if err != nil {
		t.Fatal(err)
	}
	if created, err := f.svc.Put(ctx, c); err != nil || !created {
		t.Fatalf("put at the bounds: %v %v", created, err)
	}
}

// A PUT replaces the whole configuration, Get shows the pool's live state and its
// agents, and Delete takes the bindings along.
func TestPoolLifecycleAndStatus(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	if created, err := f.svc.Put(ctx, quotas.PoolConfig{Name: "llm", TokensPerMinute: 120000, BurstTokens: 6000, RequestsPerMinute: 600}); err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	if created, err := f.svc.Put(ctx, quotas.PoolConfig{Name: "llm", TokensPerMinute: 60000}); err != nil || created {
		t.Fatalf("replace: %v %v", created, err)
	}
	if created, err := f.svc.Bind(ctx, pools.BindParams{Agent: "sim", Pool: "llm", TokensPerStep: 1000}); err != nil || !created {
		t.Fatalf("bind: %v %v", created, err)
	}
	cfg := quotas.PoolConfig{Name: "llm", TokensPerMinute: 60000}
	for _, tenant := range []string{"acme", "globex"} {
		if a, err := f.q.ReservePool(ctx, quotas.PoolReserveParams{Pool: cfg, Tenant: tenant, Weight: 1, Tokens: 30000}); err != nil || !a.Granted {
			t.Fatalf("reserve for %s: %+v %v", tenant, a, err)
		}
	}
	if a, err := f.q.ReservePool(ctx, quotas.PoolReserveParams{Pool: cfg, Tenant: "acme", Weight: 3, Tokens: 1000}); err != nil || a.Granted {
		t.Fatalf("reserve from an empty pool: %+v %v", a, err)
	}
	p, err := f.svc.Get(ctx, "llm")
	if err != nil {
		t.Fatal(err)
	}
	if p.Config != cfg || p.Config.Burst() != 60000 {
		t.Errorf("config %+v, want the replaced one with its defaults", p.Config)
	}
	if p.Status.UsedLastMinute != 60000 || p.Status.EffectiveRate != 60000 || p.Status.Level != 0 {
		t.Errorf("status %+v", p.Status)
	}
	if len(p.Status.Waiting) != 1 || p.Status.Waiting[0].Tenant != "acme" || p.Status.Waiting[0].Weight != 3 || p.Status.Waiting[0].Share != 1 {
		t.Errorf("waiting %+v", p.Status.Waiting)
	}
	if len(p.Agents) != 1 || p.Agents[0] != (pools.AgentTokens{Agent: "sim", TokensPerStep: 1000}) {
		t.Errorf("agents %+v", p.Agents)
	}
	ps, err := f.svc.List(ctx)
	if err != nil || len(ps) != 1 || len(ps[0].Agents) != 1 || ps[0].Status.UsedLastMinute != 60000 {
		t.Fatalf("list: %+v %v", ps, err)
	}
	if err := f.svc.Delete(ctx, "llm"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.GetBinding(ctx, "sim"); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("binding after its pool's deletion: %v", err)
	}
	var nf *agentqtype.NotFoundError
	if _, err := f.svc.Get(ctx, "llm"); !errors.As(err, &nf) || nf.What != "pool" {
		t.Fatalf("get deleted: %v", err)
	}
	if err := f.svc.Delete(ctx, "llm"); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
}

func TestBindNeedsTheAgentAndThePool(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.svc.Put(ctx, quotas.PoolConfig{Name: "llm", TokensPerMinute: 1000}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.st.PutAgent(ctx, store.PutAgentParams{Name: "echo", URL: "http://127.0.0.1:9/", StepTimeoutS: 1, SigningSecret: "s"}); err != nil {
		t.Fatal(err)
	}
	notFound := func(what string, err error) {
		t.Helper()
		var nf *agentqtype.NotFoundError
		if !errors.As(err, &nf) || nf.What != what || nf.Message == "" {
			t.Errorf("%v, want a missing %s", err, what)
		}
	}
	_, err := f.svc.Bind(ctx, pools.BindParams{Agent: "ghost", Pool: "llm", TokensPerStep: 1})
	notFound("agent", err)
	_, err = f.svc.Bind(ctx, pools.BindParams{Agent: "echo", Pool: "nope", TokensPerStep: 1})
	notFound("pool", err)
	_, err = f.svc.GetBinding(ctx, "echo")
	notFound("binding", err)
	notFound("binding", f.svc.Unbind(ctx, "echo"))
	for name, p := range map[string]pools.BindParams{
		"no pool":        {Agent: "echo", TokensPerStep: 1},
		"bad pool name":  {Agent: "echo", Pool: "No Pool", TokensPerStep: 1},
		"zero tokens":    {Agent: "echo", Pool: "llm"},
		"negative":       {Agent: "echo", Pool: "llm", TokensPerStep: -1},
		"above the most": {Agent: "echo", Pool: "llm", TokensPerStep: pools.MaxTokensPerStep + 1},
	} {
		var inv *agentqtype.InvalidError
		if _, err := f.svc.Bind(ctx, p); !errors.As(err, &inv) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, agent := range []string{"echo", "sim"} { // an HTTP agent, the built-in one
		if created, err := f.svc.Bind(ctx, pools.BindParams{Agent: agent, Pool: "llm", TokensPerStep: 10}); err != nil || !created {
			t.Fatalf("bind %s: %v %v", agent, created, err)
		}
	}
	if created, err := f.svc.Bind(ctx, pools.BindParams{Agent: "echo", Pool: "llm", TokensPerStep: 20}); err != nil || created {
		t.Fatalf("rebind: %v %v", created, err)
	}
	if b, err := f.svc.GetBinding(ctx, "echo"); err != nil || b.Pool != "llm" || b.TokensPerStep != 20 {
		t.Fatalf("binding: %+v %v", b, err)
	}
}

// Binding answers from its cache: this process's writes apply at once, another
// process's within the cache's second.
func TestBindingCache(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	other := f.instance()
	want := func(svc *pools.Service, name string, found bool, rate, perStep int64) {
		t.Helper()
		b, ok, err := svc.Binding(ctx, "sim")
		if err != nil {
			t.Fatal(err)
		}
		if ok != found || (found && (b.Pool.TokensPerMinute != rate || b.TokensPerStep != perStep || b.Pool.Name != "llm")) {
			t.Fatalf("%s: %+v found %v, want found %v rate %d per step %d", name, b, ok, found, rate, perStep)
		}
	}
	want(f.svc, "unbound", false, 0, 0)
	want(other, "unbound, elsewhere", false, 0, 0)
	if _, err := f.svc.Put(ctx, quotas.PoolConfig{Name: "llm", TokensPerMinute: 1000}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Bind(ctx, pools.BindParams{Agent: "sim", Pool: "llm", TokensPerStep: 10}); err != nil {
		t.Fatal(err)
	}
	want(f.svc, "bound here: at once", true, 1000, 10)
	want(other, "bound elsewhere: still cached", false, 0, 0)
	f.clk.Add(pools.CacheTTL)
	want(other, "bound elsewhere: after the ttl", true, 1000, 10)

	if _, err := f.svc.Put(ctx, quotas.PoolConfig{Name: "llm", TokensPerMinute: 5000}); err != nil {
		t.Fatal(err)
	}
	want(f.svc, "rate changed here: at once", true, 5000, 10)
	f.clk.Add(pools.CacheTTL / 2)
	want(other, "rate changed elsewhere: within the ttl", true, 1000, 10)
	f.clk.Add(pools.CacheTTL / 2)
	want(other, "rate changed elsewhere: after the ttl", true, 5000, 10)

	// The other process's writes apply at once to it, too.
	want(f.svc, "read here again", true, 5000, 10)
	if err := other.Unbind(ctx, "sim"); err != nil {
		t.Fatal(err)
	}
	want(other, "unbound there: at once", false, 0, 0)
	want(f.svc, "unbound there: still cached here", true, 5000, 10)
	f.clk.Add(pools.CacheTTL)
	want(f.svc, "unbound there: after the ttl", false, 0, 0)
}
