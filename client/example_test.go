package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/agentq/agentq/client"
)

// fakeAPI answers the few routes the examples call the way agentq does, so that the
// examples run without a server: a task submitted is queued, then completed on the
// second read; a task the tenant does not have is 404 NOT_FOUND; a submission of
// agent "busy" is refused 429 with a Retry-After.
func fakeAPI() *httptest.Server {
	reads := 0
	task := func(state string) map[string]any {
		t := map[string]any{"id": "0193f0c2-7b1e-7a10-9c2e-000000000001", "tenant_id": "acme", "agent": "sim",
			"state": state, "priority": 5, "input": map[string]any{"steps": 3}, "output": nil,
			"usage": map[string]any{"steps": 0}, "created_at": "2026-12-01T10:00:00Z"}
		if state == "completed" {
			t["usage"] = map[string]any{"steps": 3, "tokens": 1200}
			t["output"] = map[string]any{"done": 3}
		}
		return t
	}
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, status int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("POST /v1/tasks", func(w http.ResponseWriter, r *http.Request) {
		var req client.SubmitTaskRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		if req.Agent == "busy" {
			w.Header().Set("Retry-After", "2")
			reply(w, http.StatusTooManyRequests, map[string]any{"error": map[string]any{
				"code": "RATE_LIMIT_EXCEEDED", "message": "Tenant rate limit reached. Retry in 2 seconds.", "limit_type": "tenant_rate"}})
			return
		}
		reply(w, http.StatusCreated, task("queued"))
	})
	mux.HandleFunc("GET /v1/tasks/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "0193f0c2-7b1e-7a10-9c2e-000000000001" {
			reply(w, http.StatusNotFound, map[string]any{"error": map[string]any{"code": "NOT_FOUND", "message": "no such task"}})
			return
		}
		if reads++; reads < 2 {
			reply(w, http.StatusOK, task("running"))
			return
		}
		reply(w, http.StatusOK, task("completed"))
	})
	mux.HandleFunc("GET /v1/tasks", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, map[string]any{"tasks": []any{task("completed")}, "next_cursor": nil})
	})
	mux.HandleFunc("GET /v1/usage", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, map[string]any{"tenant_id": "acme", "plan": "pro", "as_of": "2026-12-01T10:00:00Z",
			"limits": map[string]any{"agent_steps_daily": map[string]any{"limit": 1000, "used": 3, "remaining": 997}}})
	})
	mux.HandleFunc("POST /v1/webhooks", func(w http.ResponseWriter, r *http.Request) {
		var req client.CreateTenantWebhookRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		reply(w, http.StatusCreated, map[string]any{"id": "wh_1", "url": req.URL, "types": req.Types,
			"tenant": "acme", "owner": "tenant", "secret": "whsec_example"})
	})
	mux.HandleFunc("PUT /v1/admin/pools/{name}", func(w http.ResponseWriter, r *http.Request) {
		var req client.PoolRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		burst := req.BurstTokens
		if burst == 0 {
			burst = req.TokensPerMinute
		}
		reply(w, http.StatusCreated, map[string]any{"name": r.PathValue("name"), "tokens_per_minute": req.TokensPerMinute,
			"burst_tokens": burst, "requests_per_minute": nil, "effective_tokens_per_minute": req.TokensPerMinute,
			"used_last_minute": 0, "level": burst, "throttled": false, "waiting": []any{}, "agents": []any{}})
	})
	mux.HandleFunc("PUT /v1/admin/agents/{name}/pool", func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		_ = json.NewDecoder(r.Body).Decode(&req)
		reply(w, http.StatusCreated, map[string]any{"agent": r.PathValue("name"), "pool": req["pool"], "tokens_per_step": req["tokens_per_step"]})
	})
	mux.HandleFunc("GET /v1/admin/pools/{name}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, map[string]any{"name": r.PathValue("name"), "tokens_per_minute": 120000,
			"burst_tokens": 6000, "requests_per_minute": 600, "effective_tokens_per_minute": 84000,
			"used_last_minute": 91000, "level": 0, "throttled": true,
			"waiting": []any{map[string]any{"tenant_id": "acme", "weight": 3, "share": 0.75}, map[string]any{"tenant_id": "globex", "weight": 1, "share": 0.25}},
			"agents":  []any{map[string]any{"agent": "sim", "tokens_per_step": 1000}}})
	})
	return httptest.NewServer(mux)
}

// A tenant app submits a task with its API key; an idempotency key makes a retried
// submission return the first task rather than a second one.
func ExampleClient_SubmitTask() {
	srv := fakeAPI()
	defer srv.Close()
	c := client.New(srv.URL, "aq_example_secret")
	task, err := c.SubmitTask(context.Background(), client.SubmitTaskRequest{
		Agent:          "sim",
		Input:          map[string]any{"steps": 3},
		User:           "u1",
		IdempotencyKey: "order-1234",
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(task.State, task.Agent)
	// Output: queued sim
}

// GetTask reads a task once; WaitTask polls it until it ends (or ctx does), waiting
// out the Retry-After of a 429 or 503 on the way.
func ExampleClient_WaitTask() {
	srv := fakeAPI()
	defer srv.Close()
	c := client.New(srv.URL, "aq_example_secret")
	ctx := context.Background()
	id := "0193f0c2-7b1e-7a10-9c2e-000000000001"
	t, err := c.GetTask(ctx, id)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(t.State, t.Terminal())
	done, err := c.WaitTask(ctx, id, 10*time.Millisecond)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(done.State, done.Usage.Steps, string(done.Output))
	// Output:
	// running false
	// completed 3 {"done":3}
}

// ListTasks pages through the tenant's tasks, newest first; NextCursor is nil on the
// last page.
func ExampleClient_ListTasks() {
	srv := fakeAPI()
	defer srv.Close()
	c := client.New(srv.URL, "aq_example_secret")
	p := client.ListTasksParams{State: "completed", Limit: 50}
	for {
		page, err := c.ListTasks(context.Background(), p)
		if err != nil {
			fmt.Println(err)
			return
		}
		for _, t := range page.Tasks {
			fmt.Println(t.ID, t.State)
		}
		if page.NextCursor == nil {
			break
		}
		p.Cursor = *page.NextCursor
	}
	// Output: 0193f0c2-7b1e-7a10-9c2e-000000000001 completed
}

// GetUsage reports each limit as admission enforces it: what is used and what
// remains.
func ExampleClient_GetUsage() {
	srv := fakeAPI()
	defer srv.Close()
	c := client.New(srv.URL, "aq_example_secret")
	u, err := c.GetUsage(context.Background(), client.UsageQuery{Days: 7})
	if err != nil {
		fmt.Println(err)
		return
	}
	l := u.Limits["agent_steps_daily"]
	fmt.Println(u.Plan, l.Used, *l.Remaining)
	// Output: pro 3 997
}

// A tenant registers an endpoint for its usage events; the secret that signs the
// deliveries (Standard Webhooks) is shown once, in this answer.
func ExampleClient_CreateWebhook() {
	srv := fakeAPI()
	defer srv.Close()
	c := client.New(srv.URL, "aq_example_secret")
	w, err := c.CreateWebhook(context.Background(), client.CreateTenantWebhookRequest{
		URL:   "https://billing.example.com/agentq",
		Types: []string{client.EventLimitHit},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(w.ID, w.URL, strings.Join(w.Types, ","), w.Secret != "")
	// Output: wh_1 https://billing.example.com/agentq usage.limit_hit true
}

// Every answer outside 2xx is a *client.Error: errors.As gives the status, the API's
// error code and, for a refusal by a limit, the limit and when to retry.
func ExampleError() {
	srv := fakeAPI()
	defer srv.Close()
	c := client.New(srv.URL, "aq_example_secret")
	ctx := context.Background()
	_, err := c.SubmitTask(ctx, client.SubmitTaskRequest{Agent: "busy", Input: map[string]any{"steps": 1}})
	var ae *client.Error
	if errors.As(err, &ae) && ae.StatusCode == http.StatusTooManyRequests {
		fmt.Println(ae.Code, ae.LimitType, ae.RetryAfter)
	}
	_, err = c.GetTask(ctx, "0193f0c2-7b1e-7a10-9c2e-00000000dead")
	if errors.As(err, &ae) {
		fmt.Println(ae.StatusCode, ae.Code)
	}
	// Output:
	// RATE_LIMIT_EXCEEDED tenant_rate 2s
	// 404 NOT_FOUND
}

// An operator declares a model pool (an upstream model's rate limit, shared by every
// tenant) and binds an agent to it: each of the agent's steps then reserves its
// tokens from the pool before it runs. GetPool shows the pool's live state: its
// effective rate (lowered while the upstream throttles) and the tenants waiting on it
// with their shares.
func ExampleAdmin_PutPool() {
	srv := fakeAPI()
	defer srv.Close()
	a := client.NewAdmin(srv.URL, "admin-token")
	ctx := context.Background()
	p, err := a.PutPool(ctx, "llm", client.PoolRequest{TokensPerMinute: 120000, BurstTokens: 6000, RequestsPerMinute: 600})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(p.Name, p.TokensPerMinute, p.BurstTokens)
	b, err := a.BindAgentPool(ctx, "sim", "llm", 1000)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(b.Agent, b.Pool, b.TokensPerStep)
	p, err = a.GetPool(ctx, "llm")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(p.EffectiveTokensPerMinute, p.Throttled)
	for _, w := range p.Waiting {
		fmt.Println(w.TenantID, w.Share)
	}
	// Output:
	// llm 120000 6000
	// sim llm 1000
	// 84000 true
	// acme 0.75
	// globex 0.25
}
