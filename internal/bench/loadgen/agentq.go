package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// lifted are the overrides every load tenant gets: the run measures the task path,
// not a limit.
var lifted = map[string]float64{
	"concurrent_sessions": 1e6, "user_tasks_hourly": 1e8, "queue_backlog": 1e6, "agent_steps_daily": 1e8,
	"tenant_rate": 1e6, "tenant_rate_burst": 1e6, "running": 1000, "long_running_inflight": 1e6,
	"key_rate": 1e6, "key_rate_burst": 1e6,
}

// endedOtherwise are the end states other than completed.
var endedOtherwise = []string{"failed", "killed", "budget_exceeded", "abandoned", "expired"}

// agentqAPI is the few calls of agentq's HTTP API the load needs.
type agentqAPI struct {
	base string
	hc   *http.Client
}

func runAgentq(ctx context.Context, c config) (result, error) {
	a := &agentqAPI{base: strings.TrimRight(c.target, "/"), hc: &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256},
	}}
	keys, err := a.setup(ctx, c.adminToken, c.tenants, runID())
	if err != nil {
		return result{}, err
	}
	body, _ := json.Marshal(map[string]any{"agent": "sim", "input": simArgs{Steps: c.steps, StepMs: c.stepMs}})
	start := time.Now()
	took, errs, firstErr := produce(c.tasks, c.concurrency, func(i int) error {
		return a.call(ctx, http.MethodPost, "/v1/tasks", keys[i%len(keys)], body, http.StatusAccepted, nil)
	})
	if err := a.waitIdle(ctx, keys, c.poll); err != nil {
		return result{}, err
	}
	elapsed := time.Since(start)
	r := newResult(c, int64(c.tasks)-errs, elapsed, took, errs, firstErr)
	if r.NotCompleted, err = a.countEndedOtherwise(ctx, keys); err != nil {
		return result{}, err
	}
	return r, nil
}

// setup creates n tenants on the pro plan with every limit lifted, and a key for each.
func (a *agentqAPI) setup(ctx context.Context, admin string, n int, id string) ([]string, error) {
	keys := make([]string, 0, n)
	for i := range n {
		tid := fmt.Sprintf("load%d-%s", i, id)
		t, _ := json.Marshal(map[string]any{"id": tid, "plan": "pro", "overrides": lifted})
		if err := a.call(ctx, http.MethodPost, "/v1/admin/tenants", admin, t, http.StatusCreated, nil); err != nil {
			return nil, fmt.Errorf("creating tenant %s: %w", tid, err)
		}
		var k struct {
			Key string `json:"key"`
		}
		if err := a.call(ctx, http.MethodPost, "/v1/admin/tenants/"+tid+"/keys", admin, []byte(`{}`), http.StatusCreated, &k); err != nil {
			return nil, fmt.Errorf("creating a key of %s: %w", tid, err)
		}
		keys = append(keys, k.Key)
	}
	return keys, nil
}

// waitIdle polls each tenant's GET /v1/usage in turn until it has no task queued or
// running. Every submission has been answered by then, so a tenant found idle stays
// idle, and one poll at a time is all the load it adds.
func (a *agentqAPI) waitIdle(ctx context.Context, keys []string, every time.Duration) error {
	for _, k := range keys {
		for {
			var rep struct {
				Queue struct {
					Depth   int64 `json:"depth"`
					Running int64 `json:"running"`
				} `json:"queue"`
			}
			if err := a.call(ctx, http.MethodGet, "/v1/usage?days=1", k, nil, http.StatusOK, &rep); err != nil {
				return fmt.Errorf("waiting for the tasks to end: %w", err)
			}
			if rep.Queue.Depth+rep.Queue.Running == 0 {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for the tasks to end: %w", ctx.Err())
			case <-time.After(every):
			}
		}
	}
	return nil
}

// countEndedOtherwise counts the tenants' tasks in an end state other than completed.
func (a *agentqAPI) countEndedOtherwise(ctx context.Context, keys []string) (int64, error) {
	var n int64
	for _, k := range keys {
		for _, st := range endedOtherwise {
			cursor := ""
			for {
				var page struct {
					Tasks      []json.RawMessage `json:"tasks"`
					NextCursor *string           `json:"next_cursor"`
				}
				q := url.Values{"state": {st}, "limit": {"500"}}
				if cursor != "" {
					q.Set("cursor", cursor)
				}
				if err := a.call(ctx, http.MethodGet, "/v1/tasks?"+q.Encode(), k, nil, http.StatusOK, &page); err != nil {
					return n, fmt.Errorf("counting %s tasks: %w", st, err)
				}
				n += int64(len(page.Tasks))
				if page.NextCursor == nil {
					break
				}
				cursor = *page.NextCursor
			}
		}
	}
	return n, nil
}

// call sends one request with a bearer token and decodes the answer into out (when
// not nil); any status but want is an error carrying the start of the body.
func (a *agentqAPI) call(ctx context.Context, method, path, token string, body []byte, want int, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != want {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return fmt.Errorf("%s %s: status %d: %s", method, path, resp.StatusCode, bytes.TrimSpace(msg))
	}
	if out == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	return json.NewDecoder(resp.Body).Decode(out)
}
