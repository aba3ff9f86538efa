package migrations_test

import (
	"context"
	"regexp"
	"slices"
	"testing"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/testenv"
)

// quoted is a string literal of a constraint's definition, as pg_get_constraintdef
// prints it: 'queued'::text.
var quoted = regexp.MustCompile(`'((?:[^']|'')*)'`)

// The CHECK on tasks.state that the migrations leave allows exactly agentqtype's task
// states: a state that either side gains alone fails here (a migration's state the
// code never names, or a state the code writes and Postgres refuses).
func TestTaskStateCheckIsTheVocabulary(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := context.Background()
	rows, err := pool.Query(ctx, `
		SELECT c.conname, pg_get_constraintdef(c.oid)
		FROM pg_constraint c
		JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
		WHERE c.conrelid = 'tasks'::regclass AND c.contype = 'c' AND a.attname = 'state'`)
	if err != nil {
		t.Fatal(err)
	}
	defs := map[string]string{}
	for rows.Next() {
		var name, def string
		if err := rows.Scan(&name, &def); err != nil {
			t.Fatal(err)
		}
		defs[name] = def
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	def, ok := defs["tasks_state_check"]
	if !ok || len(defs) != 1 {
		t.Fatalf("CHECK constraints on tasks.state: %v, want tasks_state_check alone", defs)
	}
	got := checkedStates(def)
	want := make([]string, 0, len(agentqtype.TaskStates()))
	for _, s := range agentqtype.TaskStates() {
		want = append(want, string(s))
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("tasks.state CHECK allows %v, agentqtype.TaskStates() is %v (CHECK: %s)", got, want, def)
	}
}

// checkedStates is the sorted set of string literals of a CHECK's definition.
func checkedStates(def string) []string {
	var states []string
	for _, m := range quoted.FindAllStringSubmatch(def, -1) {
		if s := m[1]; !slices.Contains(states, s) {
			states = append(states, s)
		}
	}
	slices.Sort(states)
	return states
}

func TestCheckedStates(t *testing.T) {
	def := `CHECK ((state = ANY (ARRAY['queued'::text, 'running'::text, 'queued'::text, 'it''s'::text])))`
	if got, want := checkedStates(def), []string{"it''s", "queued", "running"}; !slices.Equal(got, want) {
		t.Errorf("checkedStates = %v, want %v", got, want)
	}
}
