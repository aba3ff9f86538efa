package e2e_test

import (
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Wrong admin tokens fired at once over the network: past a small burst they are
// answered 429 with Retry-After, nothing answers 5xx, and once Retry-After has passed
// the right token works again from the same address.
func TestAdminWrongTokensRefusedOverTheNetwork(t *testing.T) {
	t.Parallel()
	h := start(t)
	var mu sync.Mutex
	got := map[int]int{}
	retry := 0
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 60 {
		wg.Go(func() {
			<-start
			req, _ := http.NewRequest("GET", h.base+"/v1/admin/tenants", nil)
			req.Header.Set("Authorization", "Bearer wrong-"+strconv.Itoa(i))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			mu.Lock()
			got[resp.StatusCode]++
			if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); resp.StatusCode == http.StatusTooManyRequests {
				retry = max(retry, ra)
			}
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	if got[http.StatusTooManyRequests] == 0 || got[http.StatusUnauthorized]+got[http.StatusTooManyRequests] != 60 || retry < 1 {
		t.Fatalf("60 wrong admin tokens at once: %v (Retry-After up to %d), want some 429 with Retry-After and the rest 401", got, retry)
	}
	time.Sleep(time.Duration(retry) * time.Second)
	if st, _ := h.do("GET", "/v1/admin/tenants", h.admin, nil, nil); st != http.StatusOK {
		t.Fatalf("the right token %d s later: %d", retry, st)
	}
}
