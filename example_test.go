package agentq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"
	"time"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/internal/testenv"
	agentrt "github.com/agentq/agentq/runtime" // renamed: it would shadow the standard runtime
)

// exampleOptions gives an Example its own Postgres schema and Redis key prefix on the
// test services. A program of yours leaves Pool and Redis nil and sets
// Config.DatabaseURL and Config.RedisURL (or the environment) instead.
func exampleOptions(cfg agentq.Config) (agentq.Options, func()) {
	_, pool, drop, err := testenv.OpenSchema()
	if err != nil {
		log.Fatal(err)
	}
	rdb, keys, done, err := testenv.OpenRedis(1)
	if err != nil {
		drop()
		log.Fatal(err)
	}
	cfg.RedisPrefix = keys.Prefix()
	return agentq.Options{
		Config: cfg, Pool: pool, Redis: rdb, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, func() { done(); drop() }
}

// A whole agentq in one process: the API, the scheduler and the workers. A tenant is
// created, a task of the built-in sim agent submitted and followed to its end.
func Example() {
	ctx := context.Background()
	cfg := agentq.DefaultConfig()
	cfg.HTTPAddr = "127.0.0.1:0" // any free port; app.Addr says which
	opts, cleanup := exampleOptions(cfg)
	defer cleanup()

	app, err := agentq.New(ctx, opts)
	if err != nil {
		log.Fatal(err)
	}
	if err := app.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer app.Stop()

	if _, err := app.CreateTenant(ctx, agentq.NewTenant{ID: "acme", Plan: "pro"}); err != nil {
		log.Fatal(err)
	}
	task, err := app.SubmitTask(ctx, agentq.NewTask{
		TenantID: "acme", Agent: "sim", Input: json.RawMessage(`{"steps":2,"step_ms":10,"tokens_per_step":50}`),
	})
	if err != nil {
		log.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !task.Ended() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		if task, err = app.GetTask(ctx, "acme", task.ID); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println(task.State, task.Usage.Steps, "steps", task.Usage.Tokens, "tokens")
	// Output: completed 2 steps 100 tokens
}

// upper is an agent written in Go: it upper-cases input.text in one step.
type upper struct{}

func (upper) Step(_ context.Context, req agentrt.StepRequest) (agentrt.StepResult, error) {
	var in struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal(req.Input, &in); err != nil {
		return agentrt.StepResult{}, fmt.Errorf("%w: bad input: %v", agentrt.ErrStepFailed, err)
	}
	out, _ := json.Marshal(map[string]string{"text": strings.ToUpper(in.Text)})
	return agentrt.StepResult{Output: out, Done: true, Usage: agentrt.StepUsage{Tokens: int64(len(in.Text))}}, nil
}

// Agents written in Go run in the process's workers: register them before Start, and
// tasks name them as they name any agent.
func ExampleApp_Agents() {
	ctx := context.Background()
	cfg := agentq.DefaultConfig()
	cfg.Roles = []string{agentq.RoleScheduler, agentq.RoleWorker} // no HTTP API
	// The approval links of tasks paused here are served by an API elsewhere: its
	// address, and the secret it verifies them with.
	cfg.PublicURL, cfg.PanelSecret = "https://agentq.example.com", "shared-with-the-api"
	opts, cleanup := exampleOptions(cfg)
	defer cleanup()
	app, err := agentq.New(ctx, opts)
	if err != nil {
		log.Fatal(err)
	}
	app.Agents().Register("upper", upper{})
	if err := app.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer app.Stop()

	if _, err := app.CreateTenant(ctx, agentq.NewTenant{ID: "acme", Plan: "pro"}); err != nil {
		log.Fatal(err)
	}
	task, err := app.SubmitTask(ctx, agentq.NewTask{TenantID: "acme", Agent: "upper", Input: json.RawMessage(`{"text":"hello agentq"}`)})
	if err != nil {
		log.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !task.Ended() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		if task, err = app.GetTask(ctx, "acme", task.ID); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println(task.State, string(task.Output), task.Usage.Tokens, "tokens")
	// Output: completed {"text": "HELLO AGENTQ"} 12 tokens
}

// Tenants are held to the rules of the admin API, and refused with its sentences.
func ExampleApp_CreateTenant() {
	ctx := context.Background()
	opts, cleanup := exampleOptions(agentq.DefaultConfig())
	defer cleanup()
	app, err := agentq.New(ctx, opts) // not started: tenants need only Postgres
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = app.Shutdown(ctx) }()

	t, err := app.CreateTenant(ctx, agentq.NewTenant{ID: "acme", Plan: "pro"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(t.ID, t.Plan, t.Status, "weight", t.EffectiveWeight)

	weight := 0
	_, err = app.CreateTenant(ctx, agentq.NewTenant{ID: "globex", Plan: "pro", Weight: &weight})
	var invalid *agentq.InvalidError
	if errors.As(err, &invalid) {
		fmt.Println(invalid.Field+":", invalid.Message)
	}
	_, err = app.CreateTenant(ctx, agentq.NewTenant{ID: "acme", Plan: "free"})
	fmt.Println(errors.Is(err, agentq.ErrExists))
	// Output:
	// acme pro active weight 2
	// weight: weight must be between 1 and 1000.
	// true
}

// A submission waits in its tenant's queue until a worker takes it; resubmitting with
// the same idempotency key returns the task the first submission made.
func ExampleApp_SubmitTask() {
	ctx := context.Background()
	opts, cleanup := exampleOptions(agentq.DefaultConfig())
	defer cleanup()
	app, err := agentq.New(ctx, opts) // not started: no worker takes the task
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = app.Shutdown(ctx) }()
	if _, err := app.CreateTenant(ctx, agentq.NewTenant{ID: "acme", Plan: "free"}); err != nil {
		log.Fatal(err)
	}

	submit := func() agentq.Task {
		t, err := app.SubmitTask(ctx, agentq.NewTask{
			TenantID: "acme", Agent: "sim", Input: json.RawMessage(`{"steps":1}`), IdempotencyKey: "order-42",
		})
		if err != nil {
			log.Fatal(err)
		}
		return t
	}
	first, again := submit(), submit()
	fmt.Println(first.State, again.ID == first.ID, first.Budget.MaxSteps > 0)

	_, err = app.SubmitTask(ctx, agentq.NewTask{TenantID: "acme", Agent: "nope"})
	var unknown *agentq.UnknownAgentError
	fmt.Println(errors.As(err, &unknown))
	// Output:
	// queued true true
	// true
}

// Cancelling ends a queued or running task as killed; a task that ended cannot be
// cancelled again.
func ExampleApp_CancelTask() {
	ctx := context.Background()
	opts, cleanup := exampleOptions(agentq.DefaultConfig())
	defer cleanup()
	app, err := agentq.New(ctx, opts)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = app.Shutdown(ctx) }()
	if _, err := app.CreateTenant(ctx, agentq.NewTenant{ID: "acme", Plan: "free"}); err != nil {
		log.Fatal(err)
	}
	task, err := app.SubmitTask(ctx, agentq.NewTask{TenantID: "acme", Agent: "sim", Input: json.RawMessage(`{"steps":1}`)})
	if err != nil {
		log.Fatal(err)
	}

	killed, err := app.CancelTask(ctx, "acme", task.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(killed.State, killed.Error)
	_, err = app.CancelTask(ctx, "acme", task.ID)
	var ended *agentq.TaskEndedError
	fmt.Println(errors.As(err, &ended), ended.State)
	_, err = app.CancelTask(ctx, "globex", task.ID) // another tenant's task is not found
	fmt.Println(errors.Is(err, agentq.ErrNotFound))
	// Output:
	// killed cancelled by the tenant
	// true killed
	// true
}

// Tasks are listed newest first, a page at a time.
func ExampleApp_ListTasks() {
	ctx := context.Background()
	opts, cleanup := exampleOptions(agentq.DefaultConfig())
	defer cleanup()
	app, err := agentq.New(ctx, opts)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = app.Shutdown(ctx) }()
	if _, err := app.CreateTenant(ctx, agentq.NewTenant{ID: "acme", Plan: "pro"}); err != nil {
		log.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		input := json.RawMessage(fmt.Sprintf(`{"steps":%d}`, i))
		if _, err := app.SubmitTask(ctx, agentq.NewTask{TenantID: "acme", Agent: "sim", Input: input}); err != nil {
			log.Fatal(err)
		}
	}

	q := agentq.TaskQuery{TenantID: "acme", Limit: 2}
	for page := 1; ; page++ {
		p, err := app.ListTasks(ctx, q)
		if err != nil {
			log.Fatal(err)
		}
		for _, t := range p.Tasks {
			fmt.Println("page", page, string(t.Input)) // as Postgres keeps JSON
		}
		if p.Next == nil {
			break
		}
		q.Before = *p.Next
	}
	// Output:
	// page 1 {"steps": 3}
	// page 1 {"steps": 2}
	// page 2 {"steps": 1}
}

// Validate names the field it refuses; New refuses the same configuration.
func ExampleConfig_Validate() {
	cfg := agentq.DefaultConfig()
	cfg.Shards = 0
	fmt.Println(cfg.Validate())
	// Output: agentq: config: Shards is 0; want at least 1
}
