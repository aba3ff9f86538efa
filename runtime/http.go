package runtime

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// SignatureHeader carries "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">", keyed
// with the deployment's agent secret (AGENTQ_AGENT_SECRET), so an agent can check that
// a step request comes from agentq and is fresh.
const SignatureHeader = "X-Agentq-Signature"

// Sign returns the SignatureHeader value for body at t.
func Sign(secret, body []byte, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

// HTTPAgent runs steps by POSTing them to an agent's URL. The agent answers
// {"output","state","done","usage":{"tokens","cost_usd"}}.
type HTTPAgent struct {
	Name        string
	URL         string
	Timeout     time.Duration // per attempt
	Headers     map[string]string
	Secret      []byte
	Client      *http.Client
	MaxAttempts int           // default 3
	Backoff     time.Duration // first retry delay, doubled each time; default 200ms
}

// retryable marks a failure worth another attempt: timeouts, connection errors, 408,
// 429 and 5xx answers, and malformed answers.
type retryable struct{ error }

// Step runs one step, retrying retryable failures with exponential backoff. It returns
// ErrStepFailed (wrapped, with what went wrong) when the agent refuses or keeps failing.
func (a *HTTPAgent) Step(ctx context.Context, req StepRequest) (StepResult, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return StepResult{}, err
	}
	attempts, backoff := max(a.MaxAttempts, 1), a.Backoff
	if a.MaxAttempts == 0 {
		attempts = 3
	}
	if backoff <= 0 {
		backoff = 200 * time.Millisecond
	}
	var last error
	for attempt := 1; attempt <= attempts; attempt++ {
		res, err := a.try(ctx, req, body, attempt)
		if err == nil {
			return res, nil
		}
		if ctx.Err() != nil {
			return StepResult{}, ctx.Err()
		}
		last = err
		var r retryable
		if !errors.As(err, &r) {
			return StepResult{}, fmt.Errorf("%w: agent %q, step %d: %v", ErrStepFailed, a.Name, req.Step, err)
		}
		if attempt < attempts {
			t := time.NewTimer(backoff << (attempt - 1))
			select {
			case <-ctx.Done():
				t.Stop()
				return StepResult{}, ctx.Err()
			case <-t.C:
			}
		}
	}
	return StepResult{}, fmt.Errorf("%w: agent %q, step %d: %v (after %d attempts)", ErrStepFailed, a.Name, req.Step, last, attempts)
}

func (a *HTTPAgent) try(ctx context.Context, req StepRequest, body []byte, attempt int) (StepResult, error) {
	actx := ctx
	if a.Timeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, a.Timeout)
		defer cancel()
	}
	hreq, err := http.NewRequestWithContext(actx, http.MethodPost, a.URL, bytes.NewReader(body))
	if err != nil {
		return StepResult{}, err
	}
	for k, v := range a.Headers {
		hreq.Header.Set(k, v)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("User-Agent", "agentq")
	hreq.Header.Set("X-Agentq-Task-Id", req.TaskID)
	hreq.Header.Set("X-Agentq-Step", strconv.Itoa(req.Step))
	hreq.Header.Set("X-Agentq-Attempt", strconv.Itoa(attempt))
	hreq.Header.Set(SignatureHeader, Sign(a.Secret, body, time.Now()))
	injectTrace(ctx, hreq.Header, req.TaskID)
	client := a.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(hreq)
	if err != nil {
		if ctx.Err() != nil {
			return StepResult{}, ctx.Err()
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return StepResult{}, retryable{fmt.Errorf("no answer within %v", a.Timeout)}
		}
		return StepResult{}, retryable{fmt.Errorf("request failed: %v", err)}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return StepResult{}, retryable{fmt.Errorf("reading the answer: %v", err)}
	}
	switch {
	case resp.StatusCode == http.StatusRequestTimeout || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return StepResult{}, retryable{fmt.Errorf("HTTP %d: %s", resp.StatusCode, snippet(raw))}
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return StepResult{}, fmt.Errorf("HTTP %d: %s", resp.StatusCode, snippet(raw))
	}
	var res StepResult
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&res); err != nil {
		return StepResult{}, retryable{fmt.Errorf("malformed answer (%v): %s", err, snippet(raw))}
	}
	if res.Usage.Tokens < 0 || res.Usage.CostUSD < 0 {
		return StepResult{}, retryable{fmt.Errorf("malformed answer: negative usage")}
	}
	return res, nil
}

func snippet(b []byte) string {
	const n = 200
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// injectTrace writes the W3C traceparent of the step: the caller's span if there is
// one, else a trace whose id is the task id, so every step of a task shares a trace.
func injectTrace(ctx context.Context, h http.Header, taskID string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		var tid trace.TraceID
		if id, err := uuid.Parse(taskID); err == nil {
			copy(tid[:], id[:])
		}
		var sid trace.SpanID
		_, _ = rand.Read(sid[:])
		ctx = trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled,
		}))
	}
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(h))
}
