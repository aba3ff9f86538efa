package runtime

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestVerifyChecksSecretMethodURLTimestampAndBody(t *testing.T) {
	secretA, secretB := []byte("aqsig_agent-a"), []byte("aqsig_agent-b")
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"task_id":"t","step":1}`)
	ts, sig := Sign(secretA, "POST", "/step?v=1", body, now)
	if err := Verify(secretA, "POST", "/step?v=1", ts, sig, body, now); err != nil {
		t.Fatalf("a request signed for agent A does not verify with A's secret: %v", err)
	}
	for name, err := range map[string]error{
		"agent B's secret":  Verify(secretB, "POST", "/step?v=1", ts, sig, body, now),
		"another method":    Verify(secretA, "PUT", "/step?v=1", ts, sig, body, now),
		"another path":      Verify(secretA, "POST", "/other?v=1", ts, sig, body, now),
		"another query":     Verify(secretA, "POST", "/step?v=2", ts, sig, body, now),
		"another body":      Verify(secretA, "POST", "/step?v=1", ts, sig, []byte(`{"task_id":"t","step":2}`), now),
		"another timestamp": Verify(secretA, "POST", "/step?v=1", "1800000001", sig, body, now),
		"a stale request":   Verify(secretA, "POST", "/step?v=1", ts, sig, body, now.Add(SignatureTolerance+time.Second)),
		"a future request":  Verify(secretA, "POST", "/step?v=1", ts, sig, body, now.Add(-SignatureTolerance-time.Second)),
		"no timestamp":      Verify(secretA, "POST", "/step?v=1", "", sig, body, now),
		"no version prefix": Verify(secretA, "POST", "/step?v=1", ts, strings.TrimPrefix(sig, "v1="), body, now),
	} {
		if !errors.Is(err, ErrBadSignature) {
			t.Errorf("%s: verify = %v, want ErrBadSignature", name, err)
		}
	}
}

// The signature an HTTPAgent sends verifies on the agent's side with VerifyRequest,
// and only with that agent's secret.
func TestHTTPAgentRequestsVerifyWithTheAgentsOwnSecret(t *testing.T) {
	secret := []byte("aqsig_own")
	var good, withOther atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(raw))
		if _, err := VerifyRequest(secret, r); err == nil {
			good.Add(1)
		}
		r.Body = io.NopCloser(bytes.NewReader(raw))
		if _, err := VerifyRequest([]byte("aqsig_other"), r); err == nil {
			withOther.Add(1)
		}
		_, _ = io.WriteString(w, `{"done":true,"usage":{"tokens":1,"cost_usd":0}}`)
	}))
	defer srv.Close()
	a := &HTTPAgent{Name: "own", URL: srv.URL + "/run?x=1&y=%20z", Secret: secret, Timeout: 5 * time.Second}
	if _, err := a.Step(context.Background(), StepRequest{TaskID: "t1", Step: 1}); err != nil {
		t.Fatal(err)
	}
	if good.Load() != 1 || withOther.Load() != 0 {
		t.Fatalf("verified with own secret %d, with another's %d; want 1 and 0", good.Load(), withOther.Load())
	}
}

// A redirect is a failed step: the client never follows it, whatever the status, and
// the target never sees a request.
func TestHTTPAgentDoesNotFollowRedirects(t *testing.T) {
	var target atomic.Int64
	second := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		target.Add(1)
		_, _ = io.WriteString(w, `{"done":true}`)
	}))
	defer second.Close()
	for _, code := range []int{301, 302, 303, 307, 308} {
		var calls atomic.Int64
		first := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			http.Redirect(w, r, second.URL+"/stolen?token=abc", code)
		}))
		for _, client := range []*http.Client{nil, {}} { // the default client and a caller's own
			a := &HTTPAgent{Name: "hop", URL: first.URL, Secret: []byte("s"), Client: client,
				Headers: map[string]string{"Authorization": "Bearer cred"}, Backoff: time.Millisecond}
			_, err := a.Step(context.Background(), StepRequest{TaskID: "t", Step: 2})
			var se *StepError
			if !errors.As(err, &se) || !errors.Is(err, ErrStepFailed) || se.Attempts != 1 ||
				!strings.Contains(err.Error(), `agent "hop", step 2: answered a redirect (`) {
				t.Errorf("%d: %v", code, err)
			}
			if se != nil && strings.Contains(se.Detail, "abc") {
				t.Errorf("%d: detail shows the Location's query: %s", code, se.Detail)
			}
		}
		first.Close()
		if calls.Load() != 2 {
			t.Errorf("%d: %d calls to the agent, want 1 per client", code, calls.Load())
		}
	}
	if target.Load() != 0 {
		t.Fatalf("the redirect target was called %d times", target.Load())
	}
}

func TestAgentWithoutSecretIsRefused(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	defer srv.Close()
	_, err := (&HTTPAgent{Name: "legacy", URL: srv.URL}).Step(context.Background(), StepRequest{Step: 1})
	if !errors.Is(err, ErrStepFailed) || !strings.Contains(err.Error(), "signing secret") || calls.Load() != 0 {
		t.Fatalf("err %v, %d calls", err, calls.Load())
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://u:pw@host:1/run?api_key=s3cret&b=2#frag": "http://host:1/run?api_key=REDACTED&b=REDACTED",
		"https://host/step": "https://host/step",
		"":                  "",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCheckUsage(t *testing.T) {
	for _, u := range []StepUsage{{Tokens: -1}, {Tokens: MaxStepTokens + 1}, {CostUSD: -0.01}, {CostUSD: MaxStepCostUSD * 2}, {CostUSD: 1e300}, {CostUSD: math.NaN()}, {CostUSD: math.Inf(1)}} {
		if checkUsage(u) == nil {
			t.Errorf("%+v accepted", u)
		}
	}
	for _, u := range []StepUsage{{}, {Tokens: MaxStepTokens, CostUSD: MaxStepCostUSD}, {Tokens: 7, CostUSD: 0.001}} {
		if err := checkUsage(u); err != nil {
			t.Errorf("%+v refused: %v", u, err)
		}
	}
}
