package web

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/internal/apikey"
	"github.com/agentq/agentq/internal/services"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
)

// A request's inflight_requests slot goes back however its handler ends: an answer,
// an error, or a panic.
func TestInflightSlotReleasedHoweverTheRequestEnds(t *testing.T) {
	t.Parallel()
	rdb, keys := testenv.Redis(t, 1)
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	g := admission.NewGuard(admission.New(rdb, keys, nil), admission.GuardOptions{Timeout: time.Second})
	svc := services.New(services.Deps{Pool: testenv.Postgres(t), Plans: plans, Redis: rdb, Keys: keys, Admission: g})
	s := New(Deps{Tenants: svc.Tenants, Redis: rdb, Keys: keys, Admission: g})
	ctx := context.Background()
	plan := "free"
	if _, err := svc.Tenants.Create(ctx, tenants.CreateParams{ID: "acme", Plan: &plan}); err != nil {
		t.Fatal(err)
	}
	held := func() int64 { return rdb.ZCard(ctx, keys.InflightRequests("acme")).Val() }

	run := func(h echo.HandlerFunc) (panicked bool, err error) {
		c := s.e.NewContext(httptest.NewRequest(http.MethodGet, "/v1/tasks", nil), httptest.NewRecorder())
		c.Set(ctxKeyRecord, apikey.Record{Kid: "k1", TenantID: "acme"})
		defer func() {
			if r := recover(); r != nil {
				panicked = true
			}
		}()
		return false, s.inflight(h)(c)
	}
	inside := int64(-1)
	for name, h := range map[string]echo.HandlerFunc{
		"answer": func(c echo.Context) error { inside = held(); return c.NoContent(http.StatusNoContent) },
		"error":  func(c echo.Context) error { inside = held(); return errors.New("boom") },
		"panic":  func(c echo.Context) error { inside = held(); panic("boom") },
	} {
		inside = -1
		panicked, err := run(h)
		if inside != 1 {
			t.Fatalf("%s: the handler ran with %d leases held, want 1", name, inside)
		}
		if n := held(); n != 0 {
			t.Fatalf("%s (err %v, panicked %v): %d leases held after the request", name, err, panicked, n)
		}
	}
}
