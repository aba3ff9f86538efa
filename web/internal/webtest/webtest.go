// Package webtest holds what the tests of the web packages share: real services on
// the test's own schema and Redis prefix, and the calls and answers of their HTTP
// handlers.
package webtest

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/services"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
	"github.com/agentq/agentq/runtime"
	"github.com/agentq/agentq/scheduler"
)

// Env is real services over the test's own schema and Redis prefix, with an admin
// token for the server under test (the bootstrap credential of Svc.Credentials).
type Env struct {
	Svc        *services.Services
	Pool       *pgxpool.Pool
	Redis      redis.UniversalClient
	Keys       rkeys.Keys
	Plans      *quotas.Catalogue
	Admission  *admission.Guard
	Scheduler  *scheduler.Scheduler
	Arch       *baseservice.Archetype // logs nowhere
	AdminToken string
}

// New builds the services of one test.
func New(t *testing.T) Env {
	t.Helper()
	pool := testenv.Postgres(t)
	rdb, rk := testenv.Redis(t, 1)
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	arch := &baseservice.Archetype{Logger: Quiet()}
	guard := admission.NewGuard(admission.New(rdb, rk, nil), admission.GuardOptions{Timeout: 2 * time.Second, Archetype: arch})
	sched := scheduler.New(rdb, rk, scheduler.Options{})
	admin := "admin-" + testenv.ID()
	svc := services.New(services.Deps{
		Pool: pool, Plans: plans, Redis: rdb, Keys: rk, Scheduler: sched, Admission: guard,
		Agents: runtime.NewRegistry(), Archetype: arch, AdminToken: admin,
	})
	return Env{Svc: svc, Pool: pool, Redis: rdb, Keys: rk, Plans: plans, Admission: guard, Scheduler: sched,
		Arch: arch, AdminToken: admin}
}

// Quiet is a logger that logs nowhere.
func Quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// Call sends a request to h from the client address addr ("" keeps httptest's) with
// the bearer token (none when empty) and a JSON body (none when empty), and returns
// the status, the headers and the raw body.
func Call(h http.Handler, addr, method, path, token, body string) (int, http.Header, []byte) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, rd)
	if addr != "" {
		req.RemoteAddr = addr
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Header(), rec.Body.Bytes()
}

// ErrorOf is the code and message of an error body.
func ErrorOf(t *testing.T, body []byte) (string, string) {
	t.Helper()
	var eb struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal(body, &eb); err != nil {
		t.Fatalf("%q is not an error body: %v", body, err)
	}
	return eb.Error.Code, eb.Error.Message
}

// TopKeys is the keys of a JSON object, in the order they appear.
func TopKeys(t *testing.T, body []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("%q is not a JSON object", body)
	}
	var out []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// Concurrently sends n requests at once and counts the answers by status.
func Concurrently(n int, do func() int) map[int]int {
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
