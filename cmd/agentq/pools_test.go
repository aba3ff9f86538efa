package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentq/agentq/web/api"
)

// The pool commands refuse what the API refuses, with its words, and what they write
// is what the API shows.
func TestCLIPoolsMatchTheAPI(t *testing.T) {
	t.Parallel()
	h := newAdminHarness(t)
	for _, tc := range []struct {
		name, path, body string
		status           int
		args             []string
	}{
		{"bad name", "/v1/admin/pools/LLM", `{"tokens_per_minute":10}`, 400, []string{"pools", "put", "LLM", "--tokens-per-minute", "10"}},
		{"zero rate", "/v1/admin/pools/llm", `{"tokens_per_minute":0}`, 400, []string{"pools", "put", "llm", "--tokens-per-minute", "0"}},
		{"burst above the rate", "/v1/admin/pools/llm", `{"tokens_per_minute":10,"burst_tokens":11}`, 400, []string{"pools", "put", "llm", "--tokens-per-minute", "10", "--burst-tokens", "11"}},
		{"requests 0", "/v1/admin/pools/llm", `{"tokens_per_minute":10,"requests_per_minute":0}`, 400, []string{"pools", "put", "llm", "--tokens-per-minute", "10", "--requests-per-minute", "0"}},
		{"unknown pool", "/v1/admin/pools/nope", ``, 404, []string{"pools", "get", "nope"}},
		{"bind an unknown agent", "/v1/admin/agents/ghost/pool", `{"pool":"llm","tokens_per_step":1}`, 404, []string{"agents", "pool", "ghost", "--pool", "llm", "--tokens-per-step", "1"}},
		{"bind to an unknown pool", "/v1/admin/agents/sim/pool", `{"pool":"nope","tokens_per_step":1}`, 404, []string{"agents", "pool", "sim", "--pool", "nope", "--tokens-per-step", "1"}},
		{"no binding", "/v1/admin/agents/sim/pool", ``, 404, []string{"agents", "pool", "sim"}},
	} {
		method := "PUT"
		if tc.body == "" {
			method = "GET"
		}
		st, apiMsg := h.api(method, tc.path, tc.body)
		if st != tc.status || apiMsg == "" {
			t.Errorf("%s: API %d %q, want %d", tc.name, st, apiMsg, tc.status)
		}
		if out, err := h.cli(tc.args...); err == nil || err.Error() != apiMsg {
			t.Errorf("%s: CLI %v (output %q), want the API's refusal %q", tc.name, err, out, apiMsg)
		}
	}

	out, err := h.cli("pools", "put", "llm", "--tokens-per-minute", "120000", "--burst-tokens", "6000", "--requests-per-minute", "600")
	var p api.PoolJSON
	if err != nil || json.Unmarshal([]byte(out), &p) != nil || p.BurstTokens != 6000 || p.RequestsPerMinute == nil || p.Level != 6000 {
		t.Fatalf("CLI put printed %q (%v)", out, err)
	}
	if st, msg := h.api("GET", "/v1/admin/pools/llm", ""); st != 200 {
		t.Fatalf("API get of the CLI's pool: %d %s", st, msg)
	}
	if out, err = h.cli("agents", "pool", "sim", "--pool", "llm", "--tokens-per-step", "1000"); err != nil ||
		out != "{\n  \"agent\": \"sim\",\n  \"pool\": \"llm\",\n  \"tokens_per_step\": 1000\n}\n" {
		t.Fatalf("CLI bind printed %q (%v)", out, err)
	}
	if _, err := h.cli("agents", "pool", "sim", "--pool", "llm"); err == nil {
		t.Error("CLI bind without --tokens-per-step passed")
	}
	out, err = h.cli("pools", "list")
	var list struct{ Pools []api.PoolJSON }
	if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list.Pools) != 1 || len(list.Pools[0].Agents) != 1 {
		t.Fatalf("CLI list printed %q (%v)", out, err)
	}
	if out, err = h.cli("agents", "unbind", "sim"); err != nil || !strings.Contains(out, "unbound sim") {
		t.Fatalf("CLI unbind %q %v", out, err)
	}
	if st, _ := h.api("GET", "/v1/admin/agents/sim/pool", ""); st != 404 {
		t.Errorf("API binding after the CLI's unbind: %d, want 404", st)
	}
	if _, err := h.cli("pools", "delete", "llm"); err != nil {
		t.Fatal(err)
	}
	if st, _ := h.api("GET", "/v1/admin/pools/llm", ""); st != 404 {
		t.Errorf("API get after the CLI's delete: %d, want 404", st)
	}
	if _, err := h.cli("pools", "delete", "llm"); err == nil || !strings.Contains(err.Error(), `No pool "llm"`) {
		t.Errorf("CLI second delete: %v", err)
	}
}
