package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv"
)

// A pool round-trips with its optional fields unset or set, a PUT replaces the whole
// configuration, and deleting it takes its bindings along.
func TestPoolsAndBindingsRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := store.New(testenv.Postgres(t))

	p, created, err := st.PutPool(ctx, store.PutPoolParams{Name: "llm", TokensPerMinute: 120000, BurstTokens: 6000, RequestsPerMinute: 600})
	if err != nil || !created || p.BurstTokens != 6000 || p.RequestsPerMinute != 600 {
		t.Fatalf("put new: %+v %v %v", p, created, err)
	}
	p, created, err = st.PutPool(ctx, store.PutPoolParams{Name: "llm", TokensPerMinute: 60000})
	if err != nil || created || p.TokensPerMinute != 60000 || p.BurstTokens != 0 || p.RequestsPerMinute != 0 {
		t.Fatalf("replace: %+v %v %v", p, created, err)
	}
	if got, err := st.GetPool(ctx, "llm"); err != nil || got.TokensPerMinute != 60000 || got.UpdatedAt.Before(got.CreatedAt) {
		t.Fatalf("get: %+v %v", got, err)
	}
	if _, err := st.GetPool(ctx, "nope"); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("get unknown: %v", err)
	}
	if _, _, err := st.PutPool(ctx, store.PutPoolParams{Name: "bad", TokensPerMinute: 0}); !errors.Is(err, store.ErrCheckViolation) {
		t.Fatalf("zero rate: %v", err)
	}

	b, created, err := st.PutAgentPool(ctx, store.PutAgentPoolParams{Agent: "sim", Pool: "llm", TokensPerStep: 1000})
	if err != nil || !created || b.Pool != "llm" || b.TokensPerStep != 1000 {
		t.Fatalf("bind: %+v %v %v", b, created, err)
	}
	if _, created, err = st.PutAgentPool(ctx, store.PutAgentPoolParams{Agent: "sim", Pool: "llm", TokensPerStep: 500}); err != nil || created {
		t.Fatalf("rebind: %v %v", created, err)
	}
	if _, _, err := st.PutAgentPool(ctx, store.PutAgentPoolParams{Agent: "echo", Pool: "nope", TokensPerStep: 1}); !errors.Is(err, store.ErrMissingReference) {
		t.Fatalf("bind to an unknown pool: %v", err)
	}
	jb, err := st.GetAgentBinding(ctx, "sim")
	if err != nil || jb.Pool.Name != "llm" || jb.Pool.TokensPerMinute != 60000 || jb.TokensPerStep != 500 {
		t.Fatalf("binding: %+v %v", jb, err)
	}
	if _, err := st.GetAgentBinding(ctx, "echo"); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("binding of an unbound agent: %v", err)
	}
	if as, err := st.ListPoolAgents(ctx, "llm"); err != nil || len(as) != 1 || as[0].Agent != "sim" {
		t.Fatalf("pool agents: %+v %v", as, err)
	}

	if _, _, err := st.PutPool(ctx, store.PutPoolParams{Name: "aaa", TokensPerMinute: 1}); err != nil {
		t.Fatal(err)
	}
	if ps, err := st.ListPools(ctx); err != nil || len(ps) != 2 || ps[0].Name != "aaa" || ps[1].Name != "llm" {
		t.Fatalf("list: %+v %v", ps, err)
	}
	if err := st.DeletePool(ctx, "llm"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetAgentPool(ctx, "sim"); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("binding after its pool's deletion: %v", err)
	}
	if err := st.DeletePool(ctx, "llm"); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	if err := st.DeleteAgentPool(ctx, "sim"); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Fatalf("unbind twice: %v", err)
	}
	if bs, err := st.ListAgentPools(ctx); err != nil || len(bs) != 0 {
		t.Fatalf("bindings left: %+v %v", bs, err)
	}
}
