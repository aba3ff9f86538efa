package web

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
)

// Stop waits for in-flight requests up to ShutdownTimeout, then cuts off the ones
// still running; Addr says where Start listened, and a stopped server does not serve
// again.
func TestServerStopCutsOffRequestsAtTheShutdownTimeout(t *testing.T) {
	t.Parallel()
	rdb, keys := testenv.Redis(t, 1)
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	s := New(Deps{Plans: plans, Redis: rdb, Keys: keys, ListenAddr: "127.0.0.1:0", ShutdownTimeout: 200 * time.Millisecond})
	entered, cut := make(chan struct{}), make(chan struct{})
	s.Echo().GET("/hang", func(c echo.Context) error {
		close(entered)
		<-c.Request().Context().Done() // the connection closed
		close(cut)
		return nil
	})
	if s.Addr() != nil {
		t.Fatal("an address before Start")
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	go func() {
		resp, err := http.Get("http://" + s.Addr().String() + "/hang")
		if err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	began := time.Now()
	s.Stop()
	select {
	case <-cut:
	case <-time.After(5 * time.Second):
		t.Fatal("a request still running at the shutdown timeout was not cut off")
	}
	if took := time.Since(began); took < 150*time.Millisecond || took > 3*time.Second {
		t.Fatalf("Stop took %v with a 200ms shutdown timeout", took)
	}
	if err := s.Start(context.Background()); err == nil {
		t.Fatal("a stopped server started again")
	}
}
