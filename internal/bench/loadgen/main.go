// Command loadgen puts one load through agentq over HTTP, through River (a durable
// Postgres queue) or through plain asynq, and prints one JSON line of what it
// measured, so that agentq's end-to-end throughput stands beside the two baselines:
//
//	loadgen [flags] agentq <base-url> <admin-token>
//	loadgen [flags] river <postgres-url>
//	loadgen [flags] asynq <redis-addr or redis-url>
//
// The load is the same in each mode: -concurrency producers submit -tasks sim tasks
// (-steps steps of -step-ms each) one at a time, and the clock runs from the first
// submission until the last task has ended. agentq's tenants are created through the
// admin API with every limit lifted, and the wait polls GET /v1/usage; River runs one
// client of -workers slots fetching at most every -fetch-cooldown, on tables it
// migrates into the database named; asynq one server of as many, checking every
// 10 ms as agentq's workers do, on a queue of its own deleted afterwards. It exits 1
// when a submission failed or a task did not complete: such a run is not a figure.
//
// It is a module of its own so that the product's dependencies do not include River.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// config is the command line: the mode, its targets and the load's shape.
type config struct {
	mode       string
	target     string // agentq's base URL, River's Postgres URL, asynq's Redis
	adminToken string // agentq only

	tasks       int
	tenants     int // agentq only: each gets a key and every tasks/tenants-th task
	concurrency int // producers, each submitting one task at a time
	workers     int // River and asynq only: agentq's are the server's own
	steps       int
	stepMs      int

	poll          time.Duration // agentq only: GET /v1/usage interval while waiting
	fetchCooldown time.Duration // River only
	timeout       time.Duration // the whole run
}

// result is the JSON line every mode prints.
type result struct {
	System string `json:"system"`
	// Tasks ran to an end (accepted ones: submissions that failed are Errors);
	// figures per task divide by it.
	Tasks      int64   `json:"tasks"`
	Seconds    float64 `json:"seconds"`
	TasksPerS  float64 `json:"tasks_per_s"`
	Submitted  int     `json:"submitted"`
	SubmitPerS float64 `json:"submit_per_s"`
	Errors     int64   `json:"errors"`
	FirstError string  `json:"first_error,omitempty"`
	// NotCompleted ended otherwise than completed (failed, killed, …).
	NotCompleted int64 `json:"not_completed"`
	Concurrency  int   `json:"concurrency"`
	Workers      int   `json:"workers,omitempty"`
	Tenants      int   `json:"tenants,omitempty"`
	Steps        int   `json:"steps"`
	StepMs       int   `json:"step_ms"`
}

const usage = `usage:
  loadgen [flags] agentq <base-url> <admin-token>
  loadgen [flags] river <postgres-url>
  loadgen [flags] asynq <redis-addr or redis://host:port/db>

flags (before or after the mode):
`

// parseArgs reads flags wherever they stand among the mode and its arguments.
func parseArgs(args []string, errOut io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.Usage = func() {
		fmt.Fprint(errOut, usage)
		fs.PrintDefaults()
	}
	fs.IntVar(&c.tasks, "tasks", 4000, "tasks (or jobs) to submit")
	fs.IntVar(&c.tenants, "tenants", 4, "agentq: tenants, each with every limit lifted and one key")
	fs.IntVar(&c.concurrency, "concurrency", 32, "producers, each submitting one task at a time")
	fs.IntVar(&c.workers, "workers", 20, "river, asynq: worker slots (agentq's are the server's)")
	fs.IntVar(&c.steps, "steps", 1, "steps per task (the sim agent's steps)")
	fs.IntVar(&c.stepMs, "step-ms", 0, "milliseconds each step sleeps (the sim agent's step_ms)")
	fs.DurationVar(&c.poll, "poll", 25*time.Millisecond, "agentq: how often GET /v1/usage is asked while tasks remain")
	fs.DurationVar(&c.fetchCooldown, "fetch-cooldown", 10*time.Millisecond, "river: the least time between fetches")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Minute, "the whole run's limit")
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return c, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if err := c.setPositional(pos); err != nil {
		return c, err
	}
	return c, c.validate()
}

func (c *config) setPositional(pos []string) error {
	if len(pos) == 0 {
		return errors.New("no mode: want agentq, river or asynq")
	}
	c.mode = pos[0]
	want := map[string]int{"agentq": 3, "river": 2, "asynq": 2}[c.mode]
	switch {
	case want == 0:
		return fmt.Errorf("unknown mode %q: want agentq, river or asynq", c.mode)
	case len(pos) != want && c.mode == "agentq":
		return errors.New("agentq wants <base-url> <admin-token>")
	case len(pos) != want:
		return fmt.Errorf("%s wants one address", c.mode)
	}
	c.target = pos[1]
	if c.mode == "agentq" {
		c.adminToken = pos[2]
	}
	return nil
}

func (c config) validate() error {
	switch {
	case c.tasks < 1 || c.concurrency < 1 || c.tenants < 1 || c.workers < 1:
		return errors.New("-tasks, -concurrency, -tenants and -workers must be at least 1")
	case c.steps < 1 || c.steps > 100000:
		return errors.New("-steps must be between 1 and 100000")
	case c.stepMs < 0 || c.stepMs > 600000:
		return errors.New("-step-ms must be between 0 and 600000")
	case c.poll <= 0 || c.timeout <= 0 || c.fetchCooldown < time.Millisecond:
		return errors.New("-poll and -timeout must be above 0, -fetch-cooldown at least 1ms")
	}
	return nil
}

// newResult fills in the load's shape and the rates of what ran.
func newResult(c config, ran int64, elapsed, submitting time.Duration, errs int64, firstErr error) result {
	r := result{
		System: c.mode, Tasks: ran, Seconds: round(elapsed.Seconds(), 3), Submitted: c.tasks, Errors: errs,
		Concurrency: c.concurrency, Steps: c.steps, StepMs: c.stepMs,
	}
	if elapsed > 0 {
		r.TasksPerS = round(float64(ran)/elapsed.Seconds(), 1)
	}
	if submitting > 0 {
		r.SubmitPerS = round(float64(c.tasks)/submitting.Seconds(), 1)
	}
	if firstErr != nil {
		r.FirstError = firstErr.Error()
	}
	if c.mode == "agentq" {
		r.Tenants = c.tenants
	} else {
		r.Workers = c.workers
	}
	return r
}

func round(f float64, places int) float64 {
	p := math.Pow(10, float64(places))
	return math.Round(f*p) / p
}

func run(ctx context.Context, args []string, out, errOut io.Writer) int {
	c, err := parseArgs(args, errOut)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	} else if err != nil {
		fmt.Fprintln(errOut, "loadgen:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	modes := map[string]func(context.Context, config) (result, error){"agentq": runAgentq, "river": runRiver, "asynq": runAsynq}
	r, err := modes[c.mode](ctx, c)
	if err != nil {
		fmt.Fprintf(errOut, "loadgen %s: %v\n", c.mode, err)
		return 1
	}
	line, _ := json.Marshal(r)
	fmt.Fprintf(out, "%s\n", line)
	// A run with refused submissions or tasks that did not complete is not a figure.
	if r.Errors > 0 || r.NotCompleted > 0 {
		fmt.Fprintf(errOut, "loadgen %s: %d submissions failed, %d tasks did not complete\n", c.mode, r.Errors, r.NotCompleted)
		return 1
	}
	return 0
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
