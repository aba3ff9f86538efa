package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestParseArgsFlagsEitherSideOfTheMode(t *testing.T) {
	c, err := parseArgs([]string{"-tasks", "16000", "agentq", "http://127.0.0.1:8080", "-concurrency", "8", "tok"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.mode != "agentq" || c.target != "http://127.0.0.1:8080" || c.adminToken != "tok" || c.tasks != 16000 || c.concurrency != 8 {
		t.Fatalf("parsed %+v", c)
	}
	// The defaults are the load the benchmarks describe.
	c, err = parseArgs([]string{"river", "postgres://x/y"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.tasks != 4000 || c.concurrency != 32 || c.workers != 20 || c.tenants != 4 || c.steps != 1 || c.stepMs != 0 ||
		c.fetchCooldown != 10*time.Millisecond {
		t.Fatalf("defaults %+v", c)
	}
}

func TestParseArgsRefusals(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"kafka", "x"},
		{"agentq", "http://x"},
		{"river"},
		{"asynq", "a", "b"},
		{"-tasks", "0", "asynq", "x"},
		{"-steps", "0", "asynq", "x"},
		{"-step-ms", "-1", "asynq", "x"},
		{"-fetch-cooldown", "0s", "river", "x"},
		{"-nope", "asynq", "x"},
	} {
		if _, err := parseArgs(args, io.Discard); err == nil {
			t.Errorf("%q: parsed, want an error", args)
		}
	}
	if _, err := parseArgs([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
}

// The scripts read the line's system, tasks, tasks_per_s and errors.
func TestResultLine(t *testing.T) {
	c, err := parseArgs([]string{"-tasks", "100", "agentq", "http://x", "t"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	r := newResult(c, 98, 2*time.Second, time.Second, 2, errors.New("status 429"))
	line, _ := json.Marshal(r)
	var got map[string]any
	if err := json.Unmarshal(line, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"system": "agentq", "tasks": 98.0, "seconds": 2.0, "tasks_per_s": 49.0, "submitted": 100.0,
		"submit_per_s": 100.0, "errors": 2.0, "first_error": "status 429", "not_completed": 0.0, "concurrency": 32.0,
		"tenants": 4.0, "steps": 1.0, "step_ms": 0.0}
	if len(got) != len(want) {
		t.Fatalf("line %s, want the fields %v", line, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (line %s)", k, got[k], v, line)
		}
	}
	r = newResult(config{mode: "asynq", tasks: 10, workers: 20}, 10, time.Second, time.Second, 0, nil)
	if line, _ := json.Marshal(r); !strings.Contains(string(line), `"workers":20`) || strings.Contains(string(line), "tenants") ||
		strings.Contains(string(line), "first_error") {
		t.Errorf("asynq line %s", line)
	}
}

func TestRunPrintsNothingOnStdoutForBadArgs(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"river"}, &out, &errOut); code != 2 || out.Len() != 0 || errOut.Len() == 0 {
		t.Fatalf("code %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
}

func TestProduceCountsEverySubmission(t *testing.T) {
	seen := make([]int, 50)
	_, errs, first := produce(50, 7, func(i int) error {
		seen[i]++
		if i%10 == 0 {
			return errors.New("refused")
		}
		return nil
	})
	if errs != 5 || first == nil {
		t.Fatalf("errors %d, first %v", errs, first)
	}
	for i, n := range seen {
		if n != 1 {
			t.Fatalf("submission %d ran %d times", i, n)
		}
	}
}

func TestSimRunAndWaitEnds(t *testing.T) {
	if err := simRun(context.Background(), simArgs{Steps: 3, StepMs: 1}); err != nil {
		t.Fatal(err)
	}
	ends := make(chan bool, 3)
	ends <- true
	ends <- false
	ends <- true
	if n, err := waitEnds(context.Background(), ends, 3); err != nil || n != 1 {
		t.Fatalf("not completed %d, %v", n, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := waitEnds(ctx, ends, 1); err == nil {
		t.Fatal("waitEnds returned without an end")
	}
}
