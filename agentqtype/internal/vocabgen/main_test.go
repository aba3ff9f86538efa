package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentq/agentq/agentqtype"
)

var update = flag.Bool("update", false, "rewrite the client's generated file")

// The client's generated vocabulary is what agentqtype says now.
func TestClientVocabularyIsCurrent(t *testing.T) {
	want, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("..", "..", "..", "client", "vocab_gen.go")
	if *update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is stale: run `go generate ./client/` (or this test with -update)", path)
	}
}

func TestConstName(t *testing.T) {
	for in, want := range map[string]string{"queued": "StateQueued", "budget_exceeded": "StateBudgetExceeded"} {
		if got := constName(agentqtype.TaskState(in)); got != want {
			t.Errorf("constName(%q) = %q, want %q", in, got, want)
		}
	}
}
