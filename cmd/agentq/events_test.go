package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// `agentq admin events` prints what GET /v1/admin/events answers, byte for byte, with
// the same filters, and refuses what the API refuses.
func TestCLIEventsPrintTheAdminFeed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newAdminHarness(t)
	for _, id := range []string{"acme", "globex"} {
		if st, msg := h.api("POST", "/v1/admin/tenants", `{"id":"`+id+`","plan":"pro"}`); st != 201 {
			t.Fatalf("create %s: %d %s", id, st, msg)
		}
		period := outbox.Span{Start: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), End: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
		evs, err := outbox.Events{}.Crossings(outbox.Quota{TenantID: id, Plan: "pro", LimitType: quotas.AITokensMonthly, Limit: 10, Period: period}, 0, 10, period.Start)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.store.InTx(ctx, func(tx *store.Store) error {
			for _, ev := range evs {
				if _, err := outbox.WriteEvent(ctx, tx, ev); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	get := func(query string) string {
		t.Helper()
		req, _ := http.NewRequest("GET", h.base+"/v1/admin/events"+query, nil)
		req.Header.Set("Authorization", "Bearer "+h.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	count := func(body string) int {
		var page struct{ Events []json.RawMessage }
		if err := json.Unmarshal([]byte(body), &page); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
		return len(page.Events)
	}
	// Another test's open transaction can hold the feed back: wait for all six.
	for deadline := time.Now().Add(15 * time.Second); count(get("")) < 6 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	for _, tc := range []struct {
		query string
		args  []string
		want  int
	}{
		{"", nil, 6},
		{"?tenant=globex&type=usage.approaching_limit", []string{"--tenant", "globex", "--type", "usage.approaching_limit"}, 2},
		{"?limit=4", []string{"--limit", "4"}, 4},
	} {
		out, err := h.cli(append([]string{"events"}, tc.args...)...)
		if err != nil {
			t.Fatalf("events %v: %v", tc.args, err)
		}
		if api := get(tc.query); out != api || count(out) != tc.want {
			t.Fatalf("events %v printed\n%s\nthe API answered\n%s\nwant %d events", tc.args, out, api, tc.want)
		}
	}
	// The next page from the CLI's cursor is the API's next page.
	var first struct {
		Next string `json:"next_cursor"`
	}
	out, _ := h.cli("events", "--limit", "4")
	_ = json.Unmarshal([]byte(out), &first)
	if rest, err := h.cli("events", "--after", first.Next); err != nil || count(rest) != 2 || rest != get("?after="+first.Next) {
		t.Fatalf("the page after %s: %v\n%s", first.Next, err, rest)
	}
	for _, bad := range [][]string{{"--type", "usage.other"}, {"--limit", "0"}, {"--limit", "1001"}, {"--after", "nope"}} {
		if _, err := h.cli(append([]string{"events"}, bad...)...); err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(bad[0], "--")) {
			t.Errorf("events %v: %v, want an error naming the flag", bad, err)
		}
	}
}
