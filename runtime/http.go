package runtime

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/agentq/agentq/internal/telemetry"
)

// Step requests are signed with the agent's own signing secret (shown once, when the
// agent is registered or its secret rotated), so an agent can check that a request
// comes from agentq, is fresh, and was meant for it:
//
//	X-Agentq-Timestamp: <unix seconds>
//	X-Agentq-Signature: v1=<hex HMAC-SHA256(secret, method "\n" request-uri "\n" timestamp "\n" body)>
//
// The key is the secret string exactly as shown; request-uri is the path and query as
// sent (the request line's target). Verify and VerifyRequest check both headers.
const (
	TimestampHeader = "X-Agentq-Timestamp"
	SignatureHeader = "X-Agentq-Signature"
)

// SignatureTolerance is how far a request's timestamp may be from the verifier's clock.
const SignatureTolerance = 5 * time.Minute

// signature is the hex HMAC-SHA256 a step request is signed with.
func signature(secret []byte, method, requestURI, ts string, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(method + "\n" + requestURI + "\n" + ts + "\n"))
	mac.Write(body)
	return hex.EncodeToString(mac.Sum(nil))
}

// Sign returns the TimestampHeader and SignatureHeader values of a request.
func Sign(secret []byte, method, requestURI string, body []byte, t time.Time) (timestamp, sig string) {
	ts := strconv.FormatInt(t.Unix(), 10)
	return ts, "v1=" + signature(secret, method, requestURI, ts, body)
}

// ErrBadSignature is returned by Verify for a request that is not signed with the
// secret, or whose timestamp is missing or too far from now.
var ErrBadSignature = errors.New("agentq signature does not verify")

// Verify checks a step request's signature headers against the agent's secret, at
// now: the signature must match method, requestURI, timestamp and body, and the
// timestamp must be within SignatureTolerance. The comparison is constant-time.
func Verify(secret []byte, method, requestURI, timestamp, sig string, body []byte, now time.Time) error {
	sec, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: malformed %s", ErrBadSignature, TimestampHeader)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > SignatureTolerance || d < -SignatureTolerance {
		return fmt.Errorf("%w: timestamp %s is %v away from now", ErrBadSignature, timestamp, d.Round(time.Second))
	}
	got, ok := strings.CutPrefix(sig, "v1=")
	if !ok || !hmac.Equal([]byte(got), []byte(signature(secret, method, requestURI, timestamp, body))) {
		return ErrBadSignature
	}
	return nil
}

// VerifyRequest reads r's body (at most 4 MiB) and verifies r's signature with secret;
// it returns the body. An agent written in Go calls it first in its step handler:
//
//	body, err := runtime.VerifyRequest([]byte(os.Getenv("AGENT_SIGNING_SECRET")), r)
//	if err != nil { http.Error(w, "bad signature", http.StatusUnauthorized); return }
func VerifyRequest(secret []byte, r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("reading the request: %w", err)
	}
	return body, Verify(secret, r.Method, r.URL.RequestURI(), r.Header.Get(TimestampHeader), r.Header.Get(SignatureHeader), body, time.Now())
}

// HTTPAgent runs steps by POSTing them to an agent's URL. The agent answers
// {"output","state","done","usage":{"tokens","cost_usd"}}.
type HTTPAgent struct {
	Name        string
	URL         string
	Timeout     time.Duration // per attempt
	Headers     map[string]string
	Secret      []byte // the agent's signing secret; empty refuses every step
	Client      *http.Client
	MaxAttempts int           // default 3
	Backoff     time.Duration // first retry delay, doubled each time; default 200ms
}

// StepError is a failed step of an HTTP agent. Its message, which the tenant sees as
// the task's error, names the agent, the step and the kind of failure only; Detail
// says more for the operator's log, with the agent URL's credentials redacted.
type StepError struct {
	Agent    string
	Step     int
	Kind     string
	Attempts int
	Detail   string
}

func (e *StepError) Error() string {
	msg := fmt.Sprintf("%v: agent %q, step %d: %s", ErrStepFailed, e.Agent, e.Step, e.Kind)
	if e.Attempts > 1 {
		msg += fmt.Sprintf(" (after %d attempts)", e.Attempts)
	}
	return msg
}

func (e *StepError) Unwrap() error { return ErrStepFailed }

// failure is one attempt's failure: kind for the tenant, detail for the log.
type failure struct {
	kind, detail string
	retry        bool // worth another attempt: timeouts, connection errors, 408, 429, 5xx, malformed answers
}

func (f *failure) Error() string { return f.kind + ": " + f.detail }

// noRedirects makes the client hand back a redirect instead of following it: a
// follow would send the agent's credential headers, and on 307/308 the signed body,
// to wherever the answer points.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

var defaultClient = &http.Client{CheckRedirect: noRedirects}

// Step runs one step, retrying retryable failures with exponential backoff. It returns
// a *StepError (which wraps ErrStepFailed) when the agent refuses or keeps failing.
func (a *HTTPAgent) Step(ctx context.Context, req StepRequest) (StepResult, error) {
	if len(a.Secret) == 0 {
		return StepResult{}, &StepError{Agent: a.Name, Step: req.Step, Kind: "has no signing secret (an operator must rotate it)",
			Attempts: 1, Detail: "no signing secret: POST /v1/admin/agents/" + a.Name + "/rotate-secret"}
	}
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
	client := defaultClient
	if a.Client != nil {
		c := *a.Client
		c.CheckRedirect = noRedirects
		client = &c
	}
	var last *failure
	for attempt := 1; attempt <= attempts; attempt++ {
		res, err := a.try(ctx, client, req, body, attempt)
		if err == nil {
			return res, nil
		}
		if ctx.Err() != nil {
			return StepResult{}, ctx.Err()
		}
		var f *failure
		if !errors.As(err, &f) {
			return StepResult{}, err
		}
		last = f
		if !f.retry {
			return StepResult{}, &StepError{Agent: a.Name, Step: req.Step, Kind: f.kind, Attempts: attempt, Detail: f.detail}
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
	return StepResult{}, &StepError{Agent: a.Name, Step: req.Step, Kind: last.kind, Attempts: attempts, Detail: last.detail}
}

func (a *HTTPAgent) try(ctx context.Context, client *http.Client, req StepRequest, body []byte, attempt int) (StepResult, error) {
	actx := ctx
	if a.Timeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, a.Timeout)
		defer cancel()
	}
	hreq, err := http.NewRequestWithContext(actx, http.MethodPost, a.URL, bytes.NewReader(body))
	if err != nil {
		return StepResult{}, &failure{kind: "its URL is not usable", detail: RedactURL(a.URL)}
	}
	for k, v := range a.Headers {
		hreq.Header.Set(k, v)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("User-Agent", "agentq")
	hreq.Header.Set("X-Agentq-Agent", a.Name)
	hreq.Header.Set("X-Agentq-Task-Id", req.TaskID)
	hreq.Header.Set("X-Agentq-Step", strconv.Itoa(req.Step))
	hreq.Header.Set("X-Agentq-Attempt", strconv.Itoa(attempt))
	ts, sig := Sign(a.Secret, hreq.Method, hreq.URL.RequestURI(), body, time.Now())
	hreq.Header.Set(TimestampHeader, ts)
	hreq.Header.Set(SignatureHeader, sig)
	injectTrace(ctx, hreq.Header, req.TaskID)
	resp, err := client.Do(hreq)
	if err != nil {
		if ctx.Err() != nil {
			return StepResult{}, ctx.Err()
		}
		detail := a.redactErr(err)
		if errors.Is(err, context.DeadlineExceeded) {
			return StepResult{}, &failure{kind: fmt.Sprintf("no answer within %v", a.Timeout), detail: detail, retry: true}
		}
		return StepResult{}, &failure{kind: connFailure(err), detail: detail, retry: true}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return StepResult{}, &failure{kind: "the answer was cut off", detail: a.redactErr(err), retry: true}
	}
	status := fmt.Sprintf("HTTP %d from %s: %s", resp.StatusCode, RedactURL(a.URL), snippet(raw))
	switch {
	case resp.StatusCode >= 300 && resp.StatusCode <= 399:
		return StepResult{}, &failure{kind: fmt.Sprintf("answered a redirect (%d)", resp.StatusCode),
			detail: fmt.Sprintf("HTTP %d from %s to %s; redirects are not followed", resp.StatusCode, RedactURL(a.URL), RedactURL(resp.Header.Get("Location")))}
	case resp.StatusCode == http.StatusRequestTimeout || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return StepResult{}, &failure{kind: fmt.Sprintf("answered HTTP %d", resp.StatusCode), detail: status, retry: true}
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return StepResult{}, &failure{kind: fmt.Sprintf("answered HTTP %d", resp.StatusCode), detail: status}
	}
	var res StepResult
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&res); err != nil {
		detail := fmt.Sprintf("%v: %s", err, snippet(raw))
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) {
			// Well-formed JSON with a wrong value (a string for a number, a cost of
			// 1e400): the agent would answer the same again.
			return StepResult{}, &failure{kind: fmt.Sprintf("malformed answer: %s cannot hold %s", ute.Field, ute.Value), detail: detail}
		}
		return StepResult{}, &failure{kind: "malformed answer", detail: detail, retry: true}
	}
	return res, nil
}

// connFailure names the kind of a transport failure without its addresses.
func connFailure(err error) string {
	var op *net.OpError
	var dns *net.DNSError
	var tlsErr *tls.CertificateVerificationError
	var recErr tls.RecordHeaderError
	switch {
	case errors.As(err, &dns):
		return "could not connect (name lookup failed)"
	case errors.As(err, &op) && op.Op == "dial":
		return "could not connect"
	case errors.As(err, &tlsErr) || errors.As(err, &recErr):
		return "TLS handshake failed"
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "closed the connection without an answer"
	}
	return "the connection failed"
}

// redactErr is a transport error's text for the log, with the agent URL redacted.
func (a *HTTPAgent) redactErr(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Sprintf("%s %s: %v", ue.Op, RedactURL(a.URL), ue.Err)
	}
	return err.Error()
}

// RedactURL drops a URL's user info and fragment and replaces every query value, so
// that credentials carried in the URL never reach a log line.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	u.User, u.Fragment, u.RawFragment = nil, "", ""
	if u.RawQuery != "" {
		q := u.Query()
		keys := make([]string, 0, len(q))
		for k := range q {
			keys = append(keys, url.QueryEscape(k)+"=REDACTED")
		}
		sort.Strings(keys)
		u.RawQuery = strings.Join(keys, "&")
	}
	return u.String()
}

func snippet(b []byte) string {
	const n = 200
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// injectTrace writes the W3C traceparent (and baggage) of the step's span, so the
// agent's own spans join the task's trace. Without a span in ctx nothing is written.
func injectTrace(ctx context.Context, h http.Header, _ string) {
	telemetry.Propagator.Inject(ctx, propagation.HeaderCarrier(h))
}
