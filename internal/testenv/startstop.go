package testenv

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"
)

// Stress starts and stops svc over and over from several goroutines at once, as
// rivershared/startstoptest.Stress does (without its testify dependency), so that the
// race detector sees a service whose Start and Stop race with each other. A start that
// fails with an error allowed returns (errors.Is) or an I/O timeout of the shared test
// servers is tolerated.
func Stress(t testing.TB, svc startstop.Service, allowed ...error) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			for range 50 {
				if err := svc.Start(ctx); err != nil && !allowedStartErr(err, allowed) {
					t.Errorf("start: %v", err)
					return
				}
				stopped := make(chan struct{})
				go func() {
					defer close(stopped)
					svc.Stop()
				}()
				select {
				case <-stopped:
				case <-time.After(5 * time.Second):
					t.Errorf("%T did not stop within 5s", svc)
					return
				}
			}
		})
	}
	wg.Wait()
}

func allowedStartErr(err error, allowed []error) bool {
	for _, a := range allowed {
		if errors.Is(err, a) {
			return true
		}
	}
	return strings.HasSuffix(err.Error(), "i/o timeout")
}
