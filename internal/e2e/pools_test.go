package e2e_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/agentq/agentq/client"
)

// The operator's pools and bindings through the Go client, against the running
// process: created, replaced whole, shown with the agents bound to them, refused
// with the API's errors, and deleted with their bindings.
func TestPoolsThroughTheClient(t *testing.T) {
	t.Parallel()
	h := start(t)
	a := h.adminClient()
	ctx := context.Background()

	p, err := a.PutPool(ctx, "llm", client.PoolRequest{TokensPerMinute: 120000, BurstTokens: 6000, RequestsPerMinute: 600})
	if err != nil || p.BurstTokens != 6000 || p.RequestsPerMinute == nil || *p.RequestsPerMinute != 600 || p.Level != 6000 {
		t.Fatalf("put: %+v %v", p, err)
	}
	if p, err = a.PutPool(ctx, "llm", client.PoolRequest{TokensPerMinute: 60000}); err != nil || p.BurstTokens != 60000 || p.RequestsPerMinute != nil {
		t.Fatalf("replace: %+v %v", p, err)
	}
	b, err := a.BindAgentPool(ctx, "sim", "llm", 1000)
	if err != nil || *b != (client.AgentPool{Agent: "sim", Pool: "llm", TokensPerStep: 1000}) {
		t.Fatalf("bind: %+v %v", b, err)
	}
	if b, err = a.GetAgentPool(ctx, "sim"); err != nil || b.TokensPerStep != 1000 {
		t.Fatalf("get binding: %+v %v", b, err)
	}
	if p, err = a.GetPool(ctx, "llm"); err != nil || len(p.Agents) != 1 || p.Agents[0] != (client.PoolAgent{Agent: "sim", TokensPerStep: 1000}) || p.EffectiveTokensPerMinute != 60000 {
		t.Fatalf("get: %+v %v", p, err)
	}
	ps, err := a.ListPools(ctx)
	if err != nil || len(ps) != 1 || ps[0].Name != "llm" {
		t.Fatalf("list: %+v %v", ps, err)
	}

	var ae *client.Error
	if _, err := a.PutPool(ctx, "llm", client.PoolRequest{TokensPerMinute: 100, BurstTokens: 200}); !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest || ae.Code != "INVALID_REQUEST" {
		t.Fatalf("burst above the rate: %v", err)
	}
	if _, err := a.BindAgentPool(ctx, "ghost", "llm", 1); !errors.As(err, &ae) || ae.StatusCode != http.StatusNotFound {
		t.Fatalf("bind an unknown agent: %v", err)
	}
	if _, err := a.BindAgentPool(ctx, "sim", "nope", 1); !errors.As(err, &ae) || ae.StatusCode != http.StatusNotFound {
		t.Fatalf("bind to an unknown pool: %v", err)
	}

	if err := a.DeletePool(ctx, "llm"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.GetAgentPool(ctx, "sim"); !errors.As(err, &ae) || ae.StatusCode != http.StatusNotFound {
		t.Fatalf("binding after its pool's deletion: %v", err)
	}
	if _, err := a.PutPool(ctx, "llm", client.PoolRequest{TokensPerMinute: 10}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.BindAgentPool(ctx, "sim", "llm", 5); err != nil {
		t.Fatal(err)
	}
	if err := a.UnbindAgentPool(ctx, "sim"); err != nil {
		t.Fatal(err)
	}
	if err := a.UnbindAgentPool(ctx, "sim"); !errors.As(err, &ae) || ae.StatusCode != http.StatusNotFound {
		t.Fatalf("unbind twice: %v", err)
	}
	if ps, err := a.ListPools(ctx); err != nil || len(ps) != 1 || len(ps[0].Agents) != 0 {
		t.Fatalf("list at the end: %+v %v", ps, err)
	}
}
