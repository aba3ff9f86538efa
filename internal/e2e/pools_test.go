package e2e_test

import (
	"fmt"
	"maps"
	"math"
	"testing"
	"time"

	"github.com/agentq/agentq/client"
)

// A model pool is global: the workers of two replicas draw on one bucket, which lets
// through no more than its burst and rate, and share it by the tenants' weights.
func TestPoolSharedByTwoReplicas(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.start(t)
	poolSharedByReplicas(t, a, e.start(t))
	// The pool's series: its rates and last minute's use, the waiting tenants'
	// entitlements, and the tokens each tenant drew (from this process's workers).
	fams := a.scrape()
	// A tenant's entitlement shows while it is in the pool's line, which it leaves
	// for moments between a grant and its next ask: scraped again until it shows
	// (the flood keeps both tenants waiting for a minute).
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if v, ok := sample(fams, "agentq_pool_entitlement_ratio", map[string]string{"pool": "shared", "tenant_id": "wb"}); ok && v > 0 {
			break
		}
		fams = a.scrape()
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
	}{
		{"agentq_pool_configured_rate", map[string]string{"pool": "shared"}},
		{"agentq_pool_effective_rate", map[string]string{"pool": "shared"}},
		{"agentq_pool_used_last_minute", map[string]string{"pool": "shared"}},
		{"agentq_pool_entitlement_ratio", map[string]string{"pool": "shared", "tenant_id": "wb"}},
		{"agentq_pool_tokens_total", map[string]string{"pool": "shared"}},
		{"agentq_capacity_wait_seconds", map[string]string{"reason": "pool:shared"}},
	} {
		if v, ok := sample(fams, c.name, c.labels); !ok || v <= 0 {
			t.Errorf("%s%v = %v (present %v), want above 0", c.name, c.labels, v, ok)
		}
	}
}

// poolSharedByReplicas floods one pool with two tenants of weights 1 and 2, each
// through its own API process, and checks the pool's bound and the shares. Both
// processes run workers.
func poolSharedByReplicas(t *testing.T, a, b *harness) {
	t.Helper()
	const rate, burst, step = 120_000, 2000, 500 // 2,000 tokens a second
	if st, _ := a.do("PUT", "/v1/admin/pools/shared", a.admin, map[string]any{"tokens_per_minute": rate, "burst_tokens": burst}, nil); st/100 != 2 {
		t.Fatalf("PUT pool: %d", st)
	}
	if st, _ := a.do("PUT", "/v1/admin/agents/sim/pool", a.admin, map[string]any{"pool": "shared", "tokens_per_step": step}, nil); st/100 != 2 {
		t.Fatalf("PUT binding: %d", st)
	}
	keys := map[string]string{}
	for tenant, h := range map[string]*harness{"wa": a, "wb": b} {
		ov := maps.Clone(generous)
		ov["ai_tokens_per_minute"] = client.Limit(1e9)
		weight := map[string]int{"wa": 1, "wb": 2}[tenant]
		if st, _ := h.do("POST", "/v1/admin/tenants", h.admin, map[string]any{"id": tenant, "plan": "enterprise", "weight": weight, "overrides": ov}, nil); st != 201 {
			t.Fatalf("create tenant %s: %d", tenant, st)
		}
		var k struct{ Key string }
		h.do("POST", "/v1/admin/tenants/"+tenant+"/keys", h.admin, map[string]any{}, &k)
		keys[tenant] = k.Key
	}
	began := time.Now()
	task := map[string]any{"agent": "sim", "input": map[string]any{"steps": 4, "step_ms": 5, "tokens_per_step": step}}
	for i := range 30 {
		for tenant, h := range map[string]*harness{"wa": a, "wb": b} {
			if st, _ := h.do("POST", "/v1/tasks", keys[tenant], task, nil); st != 202 {
				t.Fatalf("submit %d for %s: %d", i, tenant, st)
			}
		}
	}
	time.Sleep(6 * time.Second)
	used := map[string]int64{}
	for tenant := range keys {
		var list struct{ Tasks []client.Task }
		a.do("GET", "/v1/tasks?limit=500", keys[tenant], nil, &list)
		for _, tk := range list.Tasks {
			used[tenant] += tk.Usage.Tokens
		}
	}
	elapsed := time.Since(began).Seconds()
	total := used["wa"] + used["wb"]
	// sim's estimates are exact (next_step_tokens), so nothing is let through beyond
	// the bucket; the burst is the first second's grant.
	if allowed := burst + rate/60*elapsed; float64(total) > allowed {
		t.Fatalf("the pool let %d tokens through in %.1f s; its bucket allows %.0f", total, elapsed, allowed)
	}
	// and it keeps granting past its first burst (a loose bound: a loaded machine
	// runs fewer steps, never more)
	if total < 2*burst {
		t.Fatalf("the pool let only %d tokens through in %.1f s", total, elapsed)
	}
	// The first burst goes before the line forms: a loose bound on the shares.
	if share := float64(used["wa"]) / float64(total); math.Abs(share-1.0/3) > 0.1 {
		t.Fatalf("the weight-1 tenant got %.3f of the pool against weight 2 (%v), want about 0.333", share, fmt.Sprint(used))
	}
}
