// Package client is a small Go client for the agentq HTTP API.
//
// It speaks HTTP only and imports nothing but the standard library, so tenant apps
// can depend on it without pulling in the runtime.
//
// A tenant app submits tasks with its API key (aq_<kid>_<secret>):
//
//	c := client.New("https://agentq.example.com", os.Getenv("AGENTQ_API_KEY"))
//	task, err := c.SubmitTask(ctx, client.SubmitTaskRequest{
//		Agent:          "sim",
//		Input:          map[string]any{"steps": 3},
//		User:           "u1",
//		IdempotencyKey: "order-1234",
//	})
//	if err != nil {
//		var ae *client.Error
//		if errors.As(err, &ae) && ae.StatusCode == http.StatusTooManyRequests {
//			time.Sleep(ae.RetryAfter) // then retry
//		}
//		return err
//	}
//	done, err := c.WaitTask(ctx, task.ID, time.Second)
//
// An operator manages tenants and keys with the admin token (AGENTQ_ADMIN_TOKEN):
//
//	a := client.NewAdmin("https://agentq.example.com", os.Getenv("AGENTQ_ADMIN_TOKEN"))
//	t, err := a.CreateTenant(ctx, client.CreateTenantRequest{ID: "acme", Plan: "pro"})
//	k, err := a.CreateKey(ctx, t.ID, &client.Scopes{Agents: []string{"sim"}})
//	// k.Key is the plaintext key; it is shown once.
//
// and the webhook endpoints the usage events are delivered to, each request signed
// per Standard Webhooks with the endpoint's secret (shown once, like a key):
//
//	w, err := a.CreateWebhook(ctx, client.CreateWebhookRequest{
//		URL: "https://billing.example.com/agentq", Types: []string{client.EventLimitHit},
//	})
//	page, err := a.ListWebhookAttempts(ctx, w.ID, client.WebhookAttemptsQuery{})
//
// Every answer outside 2xx is returned as a *Error carrying the HTTP status, the
// error code and message of the API's error body, the raw error object, the
// response headers (rate-limit headers included) and Retry-After. No error this
// package returns contains the API key or admin token.
//
// The package's examples run these calls, compiled and checked by go test, against a
// stand-in for the server: ExampleClient_SubmitTask, ExampleClient_WaitTask,
// ExampleClient_ListTasks, ExampleClient_GetUsage, ExampleClient_CreateWebhook and,
// for the errors, ExampleError.
//
// The API is described by the OpenAPI document the server serves at /openapi.json.
package client
