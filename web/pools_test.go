package web

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/capacity"
)

var poolFields = []string{"name", "tokens_per_minute", "burst_tokens", "requests_per_minute", "effective_tokens_per_minute",
	"used_last_minute", "level", "throttled", "waiting", "agents"}

func TestPoolHandlers(t *testing.T) {
	t.Parallel()
	f := newAPIFixture(t)
	ctx := context.Background()

	st, body := f.call("PUT", "/v1/admin/pools/llm", f.admin, `{"tokens_per_minute":120000,"burst_tokens":6000,"requests_per_minute":600}`)
	if st != http.StatusCreated {
		t.Fatalf("PUT new pool: %d %s", st, body)
	}
	if got := topKeys(t, body); !slices.Equal(got, poolFields) {
		t.Errorf("pool fields %v", got)
	}
	var p PoolJSON
	_ = json.Unmarshal(body, &p)
	if p.Name != "llm" || p.TokensPerMinute != 120000 || p.BurstTokens != 6000 || p.RequestsPerMinute == nil || *p.RequestsPerMinute != 600 ||
		p.EffectiveTokensPerMinute != 120000 || p.Level != 6000 || p.UsedLastMinute != 0 || p.Throttled || p.Waiting == nil || p.Agents == nil {
		t.Errorf("created pool %s", body)
	}

	// A PUT replaces the whole configuration: what it leaves out is back to its default.
	st, body = f.call("PUT", "/v1/admin/pools/llm", f.admin, `{"tokens_per_minute":60000}`)
	if st != http.StatusOK {
		t.Fatalf("PUT again: %d %s", st, body)
	}
	if !strings.Contains(string(body), `"burst_tokens":60000,"requests_per_minute":null`) {
		t.Errorf("replaced pool %s", body)
	}

	st, body = f.call("PUT", "/v1/admin/agents/sim/pool", f.admin, `{"pool":"llm","tokens_per_step":1000}`)
	if st != http.StatusCreated || string(body) != `{"agent":"sim","pool":"llm","tokens_per_step":1000}`+"\n" {
		t.Fatalf("bind: %d %s", st, body)
	}
	if st, body = f.call("PUT", "/v1/admin/agents/sim/pool", f.admin, `{"pool":"llm","tokens_per_step":500}`); st != http.StatusOK {
		t.Fatalf("rebind: %d %s", st, body)
	}
	if st, body = f.call("GET", "/v1/admin/agents/sim/pool", f.admin, ""); st != http.StatusOK || string(body) != `{"agent":"sim","pool":"llm","tokens_per_step":500}`+"\n" {
		t.Fatalf("get binding: %d %s", st, body)
	}
	if b, ok, err := f.svc.Pools.Binding(ctx, "sim"); err != nil || !ok || b.TokensPerStep != 500 || b.Pool.TokensPerMinute != 60000 {
		t.Fatalf("the workers' lookup: %+v %v %v", b, ok, err)
	}

	// The live state: a tenant drew from the pool, another waits.
	cfg := quotas.PoolConfig{Name: "llm", TokensPerMinute: 60000}
	q := capacity.NewPools(f.s.Redis, f.s.Keys, nil)
	drained := time.Now()
	if a, err := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: cfg, Tenant: "acme", Weight: 1, Tokens: 60000}); err != nil || !a.Granted {
		t.Fatalf("reserve: %+v %v", a, err)
	}
	if a, err := q.ReservePool(ctx, quotas.PoolReserveParams{Pool: cfg, Tenant: "globex", Weight: 2, Tokens: 1000}); err != nil || a.Granted {
		t.Fatalf("reserve from an empty pool: %+v %v", a, err)
	}
	st, body = f.call("GET", "/v1/admin/pools/llm", f.admin, "")
	if st != http.StatusOK {
		t.Fatalf("GET pool: %d %s", st, body)
	}
	p = PoolJSON{}
	_ = json.Unmarshal(body, &p)
	// The bucket refills at 1,000 tokens a second from the moment it was drained.
	refilled := float64(time.Since(drained).Milliseconds()) + 1
	if p.UsedLastMinute != 60000 || float64(p.Level) > refilled || len(p.Waiting) != 1 || p.Waiting[0] != (PoolWaiterJSON{TenantID: "globex", Weight: 2, Share: 1}) ||
		len(p.Agents) != 1 || p.Agents[0] != (PoolAgentJSON{Agent: "sim", TokensPerStep: 500}) {
		t.Errorf("pool with its state %s", body)
	}
	if _, err := f.svc.Pools.Put(ctx, quotas.PoolConfig{Name: "aaa", TokensPerMinute: 10}); err != nil {
		t.Fatal(err)
	}
	st, body = f.call("GET", "/v1/admin/pools", f.admin, "")
	var list struct{ Pools []PoolJSON }
	_ = json.Unmarshal(body, &list)
	if st != http.StatusOK || len(list.Pools) != 2 || list.Pools[0].Name != "aaa" || list.Pools[1].Name != "llm" || !strings.HasPrefix(string(body), `{"pools":[`) {
		t.Fatalf("list: %d %s", st, body)
	}

	// Deleting the pool unbinds its agents.
	if st, body = f.call("DELETE", "/v1/admin/pools/llm", f.admin, ""); st != http.StatusNoContent || len(body) != 0 {
		t.Fatalf("delete: %d %s", st, body)
	}
	if st, _ = f.call("GET", "/v1/admin/agents/sim/pool", f.admin, ""); st != http.StatusNotFound {
		t.Fatalf("binding after its pool's deletion: %d", st)
	}
	if _, ok, err := f.svc.Pools.Binding(ctx, "sim"); err != nil || ok {
		t.Fatalf("the workers' lookup after the deletion: %v %v", ok, err)
	}
	if st, _ = f.call("PUT", "/v1/admin/agents/sim/pool", f.admin, `{"pool":"aaa","tokens_per_step":1}`); st != http.StatusCreated {
		t.Fatalf("bind to another pool: %d", st)
	}
	if st, body = f.call("DELETE", "/v1/admin/agents/sim/pool", f.admin, ""); st != http.StatusNoContent || len(body) != 0 {
		t.Fatalf("unbind: %d %s", st, body)
	}
	if st, _ = f.call("DELETE", "/v1/admin/agents/sim/pool", f.admin, ""); st != http.StatusNotFound {
		t.Fatalf("unbind twice: %d", st)
	}
}

// Every refused request is a 4xx with the documented error body, and changes nothing.
func TestPoolHandlersRefuseBadInput(t *testing.T) {
	t.Parallel()
	f := newAPIFixture(t)
	ctx := context.Background()
	if _, err := f.svc.Pools.Put(ctx, quotas.PoolConfig{Name: "llm", TokensPerMinute: 1000}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.New(f.pool).PutAgent(ctx, store.PutAgentParams{Name: "echo", URL: "http://127.0.0.1:9/", StepTimeoutS: 1, SigningSecret: "s"}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"PUT", "/v1/admin/pools/LLM", `{"tokens_per_minute":1}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/pools/a%7Bb%7D", `{"tokens_per_minute":1}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/pools/" + strings.Repeat("a", 64), `{"tokens_per_minute":1}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/pools/llm", ``, 400, CodeInvalidJSON},
		{"PUT", "/v1/admin/pools/llm", `{}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/pools/llm", `{"tokens_per_minute":0}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/pools/llm", `{"tokens_per_minute":-1}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/pools/llm", `{"tokens_per_minute":1000000000001}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/pools/llm", `{"tokens_per_minute":1e30}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/pools/llm", `{"tokens_per_minute":1.5}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/pools/llm", `{"tokens_per_minute":"100"}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/pools/llm", `{"tokens_per_minute":100,"burst_tokens":101}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/pools/llm", `{"tokens_per_minute":100,"burst_tokens":0}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/pools/llm", `{"tokens_per_minute":100,"requests_per_minute":0}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/pools/llm", `{"tokens_per_minute":100,"requests_per_minute":-5}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/pools/llm", `{"tokens_per_minute":100,"name":"other"}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/pools/llm", `{"tokens_per_minute":100}{}`, 400, CodeInvalidJSON},
		{"PUT", "/v1/admin/pools/llm", `[1]`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/pools/llm%00", `{"tokens_per_minute":1}`, 400, CodeInvalidRequest},
		{"GET", "/v1/admin/pools/nope", ``, 404, CodeNotFound},
		{"GET", "/v1/admin/pools/%FF", ``, 400, CodeInvalidRequest},
		{"DELETE", "/v1/admin/pools/nope", ``, 404, CodeNotFound},
		{"PUT", "/v1/admin/agents/ghost/pool", `{"pool":"llm","tokens_per_step":1}`, 404, CodeNotFound},
		{"PUT", "/v1/admin/agents/echo/pool", `{"pool":"nope","tokens_per_step":1}`, 404, CodeNotFound},
		{"PUT", "/v1/admin/agents/echo/pool", `{"tokens_per_step":1}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/agents/echo/pool", `{"pool":"llm"}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/agents/echo/pool", `{"pool":"llm","tokens_per_step":0}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/agents/echo/pool", `{"pool":"llm","tokens_per_step":1e400}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/agents/echo/pool", `{"pool":"Bad Name","tokens_per_step":1}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/agents/echo/pool", `{"pool":"llm\u0000","tokens_per_step":1}`, 400, CodeInvalidJSON},
		{"PUT", "/v1/admin/agents/echo/pool", `{"pool":"llm","tokens_per_step":1,"weight":2}`, 400, CodeInvalidRequest},
		{"PUT", "/v1/admin/agents/echo/pool", `{"pool":7,"tokens_per_step":1}`, 400, CodeInvalidRequest},
		{"GET", "/v1/admin/agents/echo/pool", ``, 404, CodeNotFound},
		{"DELETE", "/v1/admin/agents/echo/pool", ``, 404, CodeNotFound},
		{"GET", "/v1/admin/agents/echo%07/pool", ``, 400, CodeInvalidRequest},
		{"POST", "/v1/admin/pools/llm", `{"tokens_per_minute":1}`, 405, CodeMethodNotAllowed},
	}
	for _, c := range cases {
		st, body := f.call(c.method, c.path, f.admin, c.body)
		if st != c.status {
			t.Errorf("%s %s %s: %d %s, want %d", c.method, c.path, c.body, st, body, c.status)
			continue
		}
		if code, msg := errorOf(t, body); code != c.code || msg == "" {
			t.Errorf("%s %s %s: %s %q, want %s", c.method, c.path, c.body, code, msg, c.code)
		}
	}
	for _, path := range []string{"/v1/admin/pools", "/v1/admin/pools/llm", "/v1/admin/agents/echo/pool"} {
		if st, _ := f.call("GET", path, "", ""); st != http.StatusUnauthorized {
			t.Errorf("GET %s without the admin token: %d", path, st)
		}
	}
	p, err := f.svc.Pools.Get(ctx, "llm")
	if err != nil || p.Config != (quotas.PoolConfig{Name: "llm", TokensPerMinute: 1000}) || len(p.Agents) != 0 {
		t.Fatalf("the refused requests changed the pool: %+v %v", p, err)
	}
	if ps, err := f.svc.Pools.List(ctx); err != nil || len(ps) != 1 {
		t.Fatalf("the refused requests made pools: %+v %v", ps, err)
	}
}
