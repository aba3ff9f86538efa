package e2e_test

import (
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"
)

// BenchmarkHTTPCost measures the API process's cost of one submission (POST /v1/tasks)
// and one usage report (GET /v1/usage?days=1, as a client waiting for its tasks to
// end polls it), over HTTP with keep-alive; allocations include the client's.
func BenchmarkHTTPCost(b *testing.B) {
	base, admin, count, _ := countedAPI(b)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	call := func(method, path, token, body string, want int, out any) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			b.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, raw)
		}
		if out != nil {
			if err := json.NewDecoder(bytes.NewReader(raw)).Decode(out); err != nil {
				b.Fatal(err)
			}
		}
	}
	ov := maps.Clone(generous)
	call("POST", "/v1/admin/tenants", admin, toJSON(map[string]any{"id": "hc", "plan": "pro", "overrides": ov}), 201, nil)
	var k struct{ Key string }
	call("POST", "/v1/admin/tenants/hc/keys", admin, "{}", 201, &k)
	b.Run("submit", func(b *testing.B) {
		b.ReportAllocs()
		before := count.snapshot()
		for b.Loop() {
			call("POST", "/v1/tasks", k.Key, `{"agent":"sim","input":{"steps":1}}`, 202, nil)
		}
		reportRedis(b, count, before)
	})
	b.Run("usage", func(b *testing.B) {
		b.ReportAllocs()
		before := count.snapshot()
		for b.Loop() {
			call("GET", "/v1/usage?days=1", k.Key, "", 200, nil)
		}
		reportRedis(b, count, before)
	})
}

// reportRedis reports the Redis round trips, commands and script calls per operation
// since before.
func reportRedis(b *testing.B, count *redisCount, before [3]int64) {
	after := count.snapshot()
	for i, unit := range []string{"redis-trips/op", "redis-cmds/op", "redis-scripts/op"} {
		b.ReportMetric(float64(after[i]-before[i])/float64(b.N), unit)
	}
}
