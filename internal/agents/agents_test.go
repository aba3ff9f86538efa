package agents_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/agents"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/runtime"
)

func newService(t *testing.T) *agents.Service {
	t.Helper()
	return agents.New(store.New(testenv.Postgres(t)), runtime.NewRegistry())
}

func TestPutRefusesWhatCannotRun(t *testing.T) {
	t.Parallel()
	s := newService(t)
	ctx := context.Background()
	nan, neg := math.NaN(), -1.0
	for _, tc := range []struct {
		name  string
		p     agents.PutParams
		field string
	}{
		{"empty name", agents.PutParams{URL: "http://a.example"}, "name"},
		{"name too long", agents.PutParams{Name: "a234567890123456789012345678901234567890123456789012345678901234", URL: "http://a.example"}, "name"},
		{"no URL", agents.PutParams{Name: "a"}, "url"},
		{"NaN timeout", agents.PutParams{Name: "a", URL: "http://a.example", StepTimeoutS: &nan}, "step_timeout_s"},
		{"negative timeout", agents.PutParams{Name: "a", URL: "http://a.example", StepTimeoutS: &neg}, "step_timeout_s"},
		{"empty header name", agents.PutParams{Name: "a", URL: "http://a.example", Headers: map[string]string{"": "v"}}, "headers"},
		{"Host header", agents.PutParams{Name: "a", URL: "http://a.example", Headers: map[string]string{"host": "b"}}, "headers"},
	} {
		var inv *agentqtype.InvalidError
		if _, err := s.Put(ctx, tc.p); !errors.As(err, &inv) || inv.Field != tc.field {
			t.Errorf("%s: %v, want an *agentqtype.InvalidError of %s", tc.name, err, tc.field)
		}
	}
	var builtin *agents.BuiltinError
	if _, err := s.Put(ctx, agents.PutParams{Name: "sim", URL: "http://a.example"}); !errors.As(err, &builtin) {
		t.Errorf("the built-in sim's name: %v", err)
	}
	if as, _ := s.List(ctx); len(as) != 0 {
		t.Errorf("agents after the refusals: %+v", as)
	}
	// Without an in-process registry, only the name's form is judged.
	if err := agents.New(nil, nil).CheckName("sim"); err != nil {
		t.Errorf("CheckName(sim) without a registry: %v", err)
	}
}

func TestPutKeepsTheSecretAndRotateReplacesIt(t *testing.T) {
	t.Parallel()
	s := newService(t)
	ctx := context.Background()
	first, err := s.Put(ctx, agents.PutParams{Name: "a", URL: "http://a.example"})
	if err != nil || !first.Created || first.SigningSecret == "" || first.Agent.StepTimeoutS != agents.DefaultTimeoutS {
		t.Fatalf("first put: %+v %v", first, err)
	}
	again, err := s.Put(ctx, agents.PutParams{Name: "a", URL: "http://b.example"})
	if err != nil || again.Created || again.SigningSecret != "" || again.Agent.SigningSecret != first.SigningSecret {
		t.Fatalf("second put: %+v %v", again, err)
	}
	a, secret, err := s.RotateSecret(ctx, "a")
	if err != nil || secret == first.SigningSecret || a.SigningSecret != secret {
		t.Fatalf("rotate: %+v %q %v", a, secret, err)
	}
	if _, _, err := s.RotateSecret(ctx, "b"); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Errorf("rotating no agent: %v", err)
	}
	if err := s.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "a"); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Errorf("a deleted agent: %v", err)
	}
}

// The resolver caches what it read for ResolverTTL, the agent found and the agent
// missing alike, and signs with the agent's own secret.
func TestResolverCachesForItsTTL(t *testing.T) {
	t.Parallel()
	s := newService(t)
	ctx := context.Background()
	put, err := s.Put(ctx, agents.PutParams{Name: "a", URL: "http://a.example"})
	if err != nil {
		t.Fatal(err)
	}
	resolve := s.Resolver([]byte("shared"), nil)
	e, found, err := resolve(ctx, "a")
	if ha, ok := e.(*runtime.HTTPAgent); err != nil || !found || !ok || string(ha.Secret) != put.SigningSecret || ha.URL != "http://a.example" {
		t.Fatalf("resolve a: %+v %v %v", e, found, err)
	}
	if _, found, err := resolve(ctx, "b"); err != nil || found {
		t.Fatalf("resolve b: %v %v", found, err)
	}
	if err := s.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, agents.PutParams{Name: "b", URL: "http://b.example"}); err != nil {
		t.Fatal(err)
	}
	if _, found, _ := resolve(ctx, "a"); !found {
		t.Error("a deleted agent left the cache before its TTL")
	}
	if _, found, _ := resolve(ctx, "b"); found {
		t.Error("a missing agent left the cache before its TTL")
	}
	time.Sleep(agents.ResolverTTL + 100*time.Millisecond)
	if _, found, _ := resolve(ctx, "a"); found {
		t.Error("a deleted agent is still found after the TTL")
	}
	if _, found, _ := resolve(ctx, "b"); !found {
		t.Error("a new agent is not found after the TTL")
	}
}
