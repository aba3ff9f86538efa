package web

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/testenv"
)

// callFrom is call from the client address addr.
func (f *apiFixture) callFrom(addr, method, path, token string) (int, http.Header, []byte) {
	f.t.Helper()
	req := httptest.NewRequest(method, path, nil)
	req.RemoteAddr = addr
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	f.s.Handler().ServeHTTP(rec, req)
	return rec.Code, rec.Header(), rec.Body.Bytes()
}

// concurrently sends n requests at once and counts the answers by status.
func concurrently(n int, do func() int) map[int]int {
	var mu sync.Mutex
	var wg sync.WaitGroup
	got := map[int]int{}
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			st := do()
			mu.Lock()
			got[st]++
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	return got
}

// Wrong admin tokens sent at once from one address: a small burst is answered 401, the
// rest 429 with Retry-After and the rate-limit error body. While the address is
// refused even the right token is (or the answers would tell a right guess from a
// wrong one); other addresses are not affected, and right tokens never count.
func TestAdminWrongTokensLimitedPerAddress(t *testing.T) {
	t.Parallel()
	f := newAPIFixture(t)
	got := concurrently(60, func() int {
		st, _, _ := f.callFrom("192.0.2.1:4000", http.MethodGet, "/v1/admin/tenants", "wrong-"+testenv.ID())
		return st
	})
	if got[http.StatusTooManyRequests] == 0 || got[http.StatusUnauthorized] > 10 || got[http.StatusUnauthorized]+got[http.StatusTooManyRequests] != 60 {
		t.Fatalf("60 wrong admin tokens at once: %v, want at most 10 answered 401 and the rest 429", got)
	}
	st, h, body := f.callFrom("192.0.2.1:4001", http.MethodGet, "/v1/admin/tenants", "wrong")
	var eb struct {
		Error struct {
			Code              string   `json:"code"`
			Message           string   `json:"message"`
			LimitType         string   `json:"limit_type"`
			RetryAfterSeconds int64    `json:"retry_after_seconds"`
			Violated          []string `json:"violated"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &eb); err != nil || st != http.StatusTooManyRequests {
		t.Fatalf("a wrong token past the burst: %d %s", st, body)
	}
	ra, _ := strconv.Atoi(h.Get("Retry-After"))
	if ra < 1 || eb.Error.Code != "RATE_LIMIT_EXCEEDED" || eb.Error.LimitType != "admin_auth_failures" ||
		eb.Error.RetryAfterSeconds != int64(ra) || len(eb.Error.Violated) != 1 || eb.Error.Message == "" {
		t.Fatalf("the refusal: Retry-After %q, body %s", h.Get("Retry-After"), body)
	}
	if st, _, body := f.callFrom("192.0.2.1:4002", http.MethodGet, "/v1/admin/tenants", f.admin); st != http.StatusTooManyRequests {
		t.Fatalf("the right token from the refused address: %d %s, want 429", st, body)
	}
	if st, _, body := f.callFrom("198.51.100.2:4000", http.MethodGet, "/v1/admin/tenants", f.admin); st != http.StatusOK {
		t.Fatalf("the right token from another address: %d %s", st, body)
	}
	// Right tokens, however many and however fast, are never refused.
	ok := concurrently(300, func() int {
		st, _, _ := f.callFrom("198.51.100.3:4000", http.MethodGet, "/v1/admin/plans", f.admin)
		return st
	})
	if ok[http.StatusOK] != 300 {
		t.Fatalf("300 admin requests with the right token at once: %v, want all 200", ok)
	}
	// A request without a token guesses nothing and is not counted.
	for range 20 {
		if st, _, _ := f.callFrom("198.51.100.3:4000", http.MethodGet, "/v1/admin/plans", ""); st != http.StatusUnauthorized {
			t.Fatalf("no token: %d", st)
		}
	}
	if st, _, _ := f.callFrom("198.51.100.3:4000", http.MethodGet, "/v1/admin/plans", f.admin); st != http.StatusOK {
		t.Fatalf("the right token after requests without one: %d", st)
	}
}

// Wrong admin tokens count per address across replicas (the count is in Redis) and
// across the admin API and the operator view's sign-in: guesses spread over both, or
// over several replicas, get no larger burst.
func TestAdminTokenFailuresSharedAcrossReplicasAndSignIn(t *testing.T) {
	t.Parallel()
	f := newAPIFixture(t)
	other := New(Deps{Tenants: f.s.Tenants, APIKeys: f.s.APIKeys, Redis: f.s.Redis, Keys: f.s.Keys,
		Admission: f.s.Admission, AdminToken: f.admin,
		Archetype: &baseservice.Archetype{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}})
	const addr = "192.0.2.9:5000"
	for i := range 5 {
		if st, _, body := f.callFrom(addr, http.MethodGet, "/v1/admin/tenants", "wrong"); st != http.StatusUnauthorized {
			t.Fatalf("wrong token %d on replica A: %d %s", i+1, st, body)
		}
	}
	login := func(s *Server, token string) int {
		r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1:8080/panel/admin/login", nil)
		r.RemoteAddr = addr
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, r)
		var csrf *http.Cookie
		for _, c := range rec.Result().Cookies() {
			if c.Name == operatorLoginName {
				csrf = c
			}
		}
		if csrf == nil {
			t.Fatal("no CSRF cookie")
		}
		form := url.Values{"token": {token}, "csrf": {csrf.Value}}
		r = httptest.NewRequest(http.MethodPost, "http://127.0.0.1:8080/panel/admin/login", strings.NewReader(form.Encode()))
		r.RemoteAddr = addr
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Origin", "http://127.0.0.1:8080")
		r.AddCookie(csrf)
		rec = httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, r)
		return rec.Code
	}
	for i := range 5 {
		if st := login(other, "wrong"); st != http.StatusUnauthorized {
			t.Fatalf("wrong sign-in %d on replica B: %d", i+1, st)
		}
	}
	if st := login(other, "wrong"); st != http.StatusTooManyRequests {
		t.Fatalf("the 11th wrong token from one address, on replica B's sign-in: %d, want 429", st)
	}
	if st, _, body := f.callFrom(addr, http.MethodGet, "/v1/admin/tenants", "wrong"); st != http.StatusTooManyRequests {
		t.Fatalf("the 12th, on replica A's admin API: %d %s, want 429", st, body)
	}
	if st := login(other, f.admin); st != http.StatusTooManyRequests {
		t.Fatalf("the right token's sign-in from the refused address: %d, want 429", st)
	}
	if st, _, _ := f.callFrom("192.0.2.10:5000", http.MethodGet, "/v1/admin/tenants", f.admin); st != http.StatusOK {
		t.Fatalf("another address: %d", st)
	}
}

// Concurrent wrong sign-ins from one address: only the burst is compared and answered
// 401, the rest are refused, however they interleave.
func TestOperatorLoginConcurrentWrongGuesses(t *testing.T) {
	t.Parallel()
	s := operatorServer(t, opToken)
	csrf := loginCSRF(t, s)
	got := concurrently(60, func() int {
		form := url.Values{"token": {"wrong"}, "csrf": {csrf.Value}}
		r := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:8080/panel/admin/login", strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Origin", "http://127.0.0.1:8080")
		r.AddCookie(csrf)
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, r)
		return rec.Code
	})
	if got[http.StatusUnauthorized] > 10 || got[http.StatusTooManyRequests] == 0 {
		t.Fatalf("60 wrong sign-ins at once: %v, want at most 10 answered 401 and the rest 429", got)
	}
}
