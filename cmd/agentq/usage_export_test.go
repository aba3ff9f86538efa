package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/billing/usage"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/store"
)

// The usage export, through the API (JSON, CSV by format= and by Accept), the client
// and the CLI, gives the same totals: the ledger's. A bad period is refused alike.
func TestUsageExportAPIClientCLI(t *testing.T) {
	ctx := context.Background()
	h := newAdminHarness(t)
	if st, msg := h.api("POST", "/v1/admin/tenants", `{"id":"ev","plan":"pro"}`); st != 201 {
		t.Fatalf("create: %d %s", st, msg)
	}
	task := uuid.Must(uuid.NewV7())
	if _, err := h.store.Pool().Exec(ctx, `INSERT INTO tasks (id, tenant_id, kid, agent, request_hash, state, attempt)
		VALUES ($1, 'ev', 'k', 'sim', '\x01', 'running', 1)`, task); err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= 3; n++ {
		if _, _, err := h.store.UnscopedRecordStep(ctx, store.RecordStepParams{ID: task, Attempt: 1, Step: n, Tokens: 100, CostMicro: 2000}); err != nil {
			t.Fatal(err)
		}
	}
	month := time.Now().UTC().Format("2006-01")

	admin := client.NewAdmin(h.base, h.token)
	exp, err := admin.UsageExport(ctx, month)
	if err != nil {
		t.Fatal(err)
	}
	if len(exp.Tenants) != 1 || exp.Tenants[0].TenantID != "ev" || len(exp.Tenants[0].Meters) != 3 ||
		exp.Tenants[0].Meters[0].Quantity != 3 || exp.Tenants[0].Meters[1].Quantity != 300 ||
		exp.Tenants[0].Meters[2].Quantity != 6000 || exp.Tenants[0].Meters[2].USD != "0.006000" {
		t.Fatalf("client export %+v", exp)
	}
	csvBody, err := admin.UsageExportCSV(ctx, month)
	if err != nil {
		t.Fatal(err)
	}
	wantCSV := "period,tenant_id,plan,period_id,period_start,period_end,meter,quantity,usd\n"
	for _, l := range []string{"steps,3,", "tokens,300,", "cost_micro_usd,6000,0.006000"} {
		if !strings.Contains(string(csvBody), l+"\n") {
			t.Errorf("csv lacks %q:\n%s", l, csvBody)
		}
	}
	if !strings.HasPrefix(string(csvBody), wantCSV) {
		t.Errorf("csv header: %q", csvBody)
	}
	// Accept: text/csv gives the same bytes as format=csv.
	req, _ := http.NewRequest("GET", h.base+"/v1/admin/usage?period="+month, nil)
	req.Header.Set("Authorization", "Bearer "+h.token)
	req.Header.Set("Accept", "text/csv")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/csv") || string(body) != string(csvBody) {
		t.Errorf("Accept: text/csv: %d %s\n%s", res.StatusCode, res.Header.Get("Content-Type"), body)
	}

	out, err := h.cli("usage-export", "--period", month)
	if err != nil {
		t.Fatal(err)
	}
	var cliExp usage.UsageExport
	if err := json.Unmarshal([]byte(out), &cliExp); err != nil || len(cliExp.Tenants) != 1 || cliExp.Totals[2].Quantity != 6000 {
		t.Fatalf("CLI export %q %v", out, err)
	}
	if out, err := h.cli("usage-export", "--period", month, "--format", "csv"); err != nil || out != string(csvBody) {
		t.Errorf("CLI csv %q %v, want the API's", out, err)
	}

	for _, bad := range []string{"2026-13", "bogus", "2026-1"} {
		st, msg := h.api("GET", "/v1/admin/usage?period="+bad, "")
		if st != 400 || msg != usage.BadPeriodMessage {
			t.Errorf("API period %q: %d %q", bad, st, msg)
		}
		if _, err := h.cli("usage-export", "--period", bad); err == nil || err.Error() != msg {
			t.Errorf("CLI period %q: %v, want %q", bad, err, msg)
		}
	}
	for _, q := range []string{"", "?period=" + month + "&format=xml", "?period=" + month + "&tenant=ev"} {
		if st, _ := h.api("GET", "/v1/admin/usage"+q, ""); st != 400 {
			t.Errorf("GET /v1/admin/usage%s: %d, want 400", q, st)
		}
	}
}
