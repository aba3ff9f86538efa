package web

import (
	"context"
	"encoding/json"
	"io"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/internal/approval"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/testenv/testfactory"
	"github.com/agentq/agentq/web/api"
)

// auditFixture is a server whose writes the tests read back from the audit log, and
// the secrets its answers showed, which no row or event may hold.
type auditFixture struct {
	*serverFixture
	secrets []string
}

func newAuditFixture(t *testing.T) *auditFixture {
	t.Helper()
	f := newServerFixture(t)
	signer, err := approval.NewSigner([]byte("approval-secret-"+t.Name()), func() string { return "http://agentq.test" }, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.s = New(Deps{
		Tenants: f.Svc.Tenants, APIKeys: f.Svc.Keys, Tasks: f.Svc.Tasks, HTTPAgents: f.Svc.Agents,
		Pools: f.Svc.Pools, Audit: f.Svc.Audit, Webhooks: f.Svc.Webhooks, Events: f.Svc.Events, Postgres: f.Pool,
		Queue: f.Scheduler, Redis: f.Redis, Keys: f.Keys, Admission: f.Admission, AdminToken: f.AdminToken,
		Archetype: f.Arch, Approvals: signer, Credentials: f.Svc.Credentials,
	})
	return &auditFixture{serverFixture: f}
}

// send makes a request with headers h and returns the status and the body.
func (f *auditFixture) send(method, path, token, body string, h map[string]string) (int, []byte) {
	f.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, rd)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range h {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	f.s.Handler().ServeHTTP(rec, req)
	return rec.Code, rec.Body.Bytes()
}

// keep remembers the secrets a JSON answer shows (fields named key, secret,
// signing_secret, url of a panel link).
func (f *auditFixture) keep(body []byte) {
	var m map[string]any
	_ = json.Unmarshal(body, &m)
	for _, k := range []string{"key", "secret", "signing_secret", "token"} {
		if s, ok := m[k].(string); ok && s != "" {
			f.secrets = append(f.secrets, s)
			if _, secret, ok := strings.Cut(strings.TrimPrefix(s, "aq_"), "_"); ok && k == "key" {
				f.secrets = append(f.secrets, secret[strings.LastIndex(secret, "_")+1:])
			}
		}
	}
	if u, ok := m["url"].(string); ok && strings.Contains(u, "token=") {
		f.secrets = append(f.secrets, u[strings.Index(u, "token=")+len("token="):])
	}
}

// lastRow is the newest row of the log.
func (f *auditFixture) lastRow() api.AuditEntryJSON {
	f.t.Helper()
	st, body := f.call("GET", "/v1/admin/audit?limit=1", f.admin, "")
	var page api.AuditPageJSON
	if err := json.Unmarshal(body, &page); st != 200 || err != nil || len(page.Entries) != 1 {
		f.t.Fatalf("GET /v1/admin/audit: %d %s", st, body)
	}
	return page.Entries[0]
}

// noSecretAnywhere fails when a secret the answers showed is in a row of the audit log
// or in an event.
func (f *auditFixture) noSecretAnywhere() {
	f.t.Helper()
	var rows, events string
	err := f.Pool.QueryRow(context.Background(), `SELECT
		(SELECT COALESCE(string_agg(a::text, E'\n'), '') FROM audit_log a),
		(SELECT COALESCE(string_agg(convert_from(payload, 'UTF8'), E'\n'), '') FROM events)`).Scan(&rows, &events)
	if err != nil {
		f.t.Fatal(err)
	}
	if len(f.secrets) < 5 {
		f.t.Fatalf("only %d secrets kept: the test lost track of them", len(f.secrets))
	}
	for _, s := range f.secrets {
		if strings.Contains(rows, s) || strings.Contains(events, s) {
			f.t.Errorf("a secret the API showed once (%.6s…) is in an audit row or an event", s)
		}
	}
}

// adminWrite is one admin write route driven over HTTP: its path (with the values of
// the objects made before it), body, and the action its row records.
type adminWrite struct {
	route, path, body, action string
}

// Every admin write route the router serves appends a row naming its action, in the
// table below, driven in order over HTTP; a write route missing from the table fails
// the test. No row or event holds a secret the answers showed.
func TestEveryAdminWriteIsAudited(t *testing.T) {
	t.Parallel()
	f := newAuditFixture(t)
	hdr := map[string]string{"X-Agentq-Actor": "alice@example.com", "X-Agentq-Reason": "ticket 42", "X-Request-Id": "req-audit-1"}
	var kid, webhook string
	var weightRow int64
	writes := []adminWrite{
		{"POST /v1/admin/tenants", "/v1/admin/tenants", `{"id":"acme","plan":"pro"}`, "tenant.create"},
		{"PATCH /v1/admin/tenants/{id}", "/v1/admin/tenants/acme", `{"weight":5}`, "tenant.update"},
		{"POST /v1/admin/tenants/{id}/keys", "/v1/admin/tenants/acme/keys", "", "key.create"},
		{"POST /v1/admin/keys/{kid}/rotate", "/v1/admin/keys/{kid}/rotate", "", "key.rotate"},
		{"POST /v1/admin/tenants/{id}/panel-links", "/v1/admin/tenants/acme/panel-links", "", "panel_links.create"},
		{"POST /v1/admin/tenants/{id}/panel-links/revoke", "/v1/admin/tenants/acme/panel-links/revoke", "", "panel_links.revoke"},
		{"PUT /v1/admin/agents/{name}", "/v1/admin/agents/scorer", `{"url":"https://agent.example/run","headers":{"Authorization":"Bearer header-secret-7f3a9c"}}`, "agent.put"},
		{"POST /v1/admin/agents/{name}/rotate-secret", "/v1/admin/agents/scorer/rotate-secret", "", "agent.rotate_secret"},
		{"PUT /v1/admin/pools/{name}", "/v1/admin/pools/gpt", `{"tokens_per_minute":1000}`, "pool.put"},
		{"PUT /v1/admin/agents/{name}/pool", "/v1/admin/agents/scorer/pool", `{"pool":"gpt","tokens_per_step":10}`, "binding.put"},
		{"DELETE /v1/admin/agents/{name}/pool", "/v1/admin/agents/scorer/pool", "", "binding.delete"},
		{"POST /v1/admin/webhooks", "/v1/admin/webhooks", `{"url":"https://hooks.example/x","types":["tenant.limits_changed"]}`, "webhook.create"},
		{"PATCH /v1/admin/webhooks/{id}", "/v1/admin/webhooks/{webhook}", `{"enabled":false}`, "webhook.update"},
		{"POST /v1/admin/webhooks/{id}/rotate", "/v1/admin/webhooks/{webhook}/rotate", "", "webhook.rotate_secret"},
		{"DELETE /v1/admin/webhooks/{id}", "/v1/admin/webhooks/{webhook}", "", "webhook.delete"},
		{"DELETE /v1/admin/pools/{name}", "/v1/admin/pools/gpt", "", "pool.delete"},
		{"DELETE /v1/admin/agents/{name}", "/v1/admin/agents/scorer", "", "agent.delete"},
		{"POST /v1/admin/audit/{id}/revert", "/v1/admin/audit/{weightRow}/revert", "", "tenant.revert"},
		{"DELETE /v1/admin/keys/{kid}", "/v1/admin/keys/{kid}", "", "key.revoke"},
		{"POST /v1/admin/credentials", "/v1/admin/credentials", `{"name":"deploy","role":"operator"}`, "credential.create"},
		{"POST /v1/admin/credentials/{name}/rotate", "/v1/admin/credentials/deploy/rotate", "", "credential.rotate"},
		{"DELETE /v1/admin/credentials/{name}", "/v1/admin/credentials/deploy", "", "credential.revoke"},
	}
	driven := map[string]bool{}
	for _, w := range writes {
		method, _, _ := strings.Cut(w.route, " ")
		path := strings.NewReplacer("{kid}", kid, "{webhook}", webhook, "{weightRow}", jsonInt(weightRow)).Replace(w.path)
		st, body := f.send(method, path, f.admin, w.body, hdr)
		if st < 200 || st > 299 {
			t.Fatalf("%s: %d %s", w.route, st, body)
		}
		f.keep(body)
		row := f.lastRow()
		if row.Action != w.action || row.Actor.Kind != "credential" || row.ClaimedActor != "alice@example.com" ||
			row.Reason != "ticket 42" || row.RequestID != "req-audit-1" {
			t.Errorf("%s: row %+v, want action %s with the request's actor, reason and id", w.route, row, w.action)
		}
		switch w.action {
		case "key.create":
			var k api.KeyCreated
			_ = json.Unmarshal(body, &k)
			kid = k.Kid
		case "webhook.create":
			var wh api.WebhookWithSecret
			_ = json.Unmarshal(body, &wh)
			webhook = wh.ID
		case "tenant.update":
			weightRow = row.ID
		}
		driven[w.route] = true
	}
	for r := range registeredRoutes(f.s) {
		method, path, _ := strings.Cut(r, " ")
		if strings.HasPrefix(path, "/v1/admin/") && slices.Contains([]string{"POST", "PUT", "PATCH", "DELETE"}, method) && !driven[r] {
			t.Errorf("admin write route %s is not driven by this test: add it to the table, with the action its row records", r)
		}
	}
	f.secrets = append(f.secrets, "header-secret-7f3a9c")
	f.noSecretAnywhere()
	if st, body := f.call("GET", "/v1/admin/audit/verify-me", f.admin, ""); st != 404 {
		t.Errorf("a row id that is no number: %d %s", st, body)
	}
}

func jsonInt(n int64) string { b, _ := json.Marshal(n); return string(b) }

// A tenant's own changes are recorded as its key's: its webhook endpoints and a
// resume that raises a task's budget; an approval link's raise as the link's.
func TestTenantChangesAreAudited(t *testing.T) {
	t.Parallel()
	f := newAuditFixture(t)
	if st, body := f.call("POST", "/v1/admin/tenants", f.admin, `{"id":"acme","plan":"pro"}`); st != 201 {
		t.Fatalf("tenant: %d %s", st, body)
	}
	st, body := f.call("POST", "/v1/admin/tenants/acme/keys", f.admin, "")
	var k api.KeyCreated
	if err := json.Unmarshal(body, &k); st != 201 || err != nil {
		t.Fatalf("key: %d %s", st, body)
	}
	f.keep(body)
	want := func(action, kind, name string) api.AuditEntryJSON {
		t.Helper()
		row := f.lastRow()
		if row.Action != action || row.Actor.Kind != kind || row.Actor.Name != name || row.Object.Tenant != "acme" {
			t.Fatalf("row %+v, want %s by %s %s on acme", row, action, kind, name)
		}
		return row
	}
	st, body = f.call("POST", "/v1/webhooks", k.Key, `{"url":"https://acme.example/hook","types":["usage.limit_hit"]}`)
	var wh api.WebhookWithSecret
	if err := json.Unmarshal(body, &wh); st != 201 || err != nil {
		t.Fatalf("tenant webhook: %d %s", st, body)
	}
	f.keep(body)
	want("webhook.create", "key", k.Kid)
	if st, body = f.call("POST", "/v1/webhooks/"+wh.ID+"/rotate", k.Key, ""); st != 200 {
		t.Fatalf("tenant webhook rotate: %d %s", st, body)
	}
	f.keep(body)
	want("webhook.rotate_secret", "key", k.Kid)
	if st, _ := f.call("DELETE", "/v1/webhooks/"+wh.ID, k.Key, ""); st != 204 {
		t.Fatalf("tenant webhook delete: %d", st)
	}
	want("webhook.delete", "key", k.Kid)

	id := f.pausedTask(t, "acme", k.Kid)
	if st, body := f.call("POST", "/v1/tasks/"+id.String()+"/resume", k.Key, `{"budget":{"max_steps":20}}`); st != 200 {
		t.Fatalf("resume with a raise: %d %s", st, body)
	}
	row := want("task.resume_budget", "key", k.Kid)
	if !strings.Contains(string(row.Before), `"max_steps":10`) || !strings.Contains(string(row.After), `"max_steps":20`) {
		t.Errorf("resume row: before %s after %s", row.Before, row.After)
	}

	id = f.pausedTask(t, "acme", k.Kid)
	tok := f.s.Approvals.Sign(approval.Claims{TenantID: "acme", TaskID: id, Pause: 1, Expires: time.Now().Add(time.Hour)})
	req := httptest.NewRequest("POST", "/approve?token="+url.QueryEscape(tok), strings.NewReader("max_steps=15"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec := httptest.NewRecorder()
	f.s.Handler().ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Fatalf("approval: %d %s", rec.Code, rec.Body)
	}
	want("task.resume_budget", "link", "approval:"+id.String())
	f.secrets = append(f.secrets, tok, "whsec_", "aq_"+k.Kid+"_")
	f.noSecretAnywhere()
}

// pausedTask stores a task of tenant paused at its step budget (10 of 10).
func (f *auditFixture) pausedTask(t *testing.T, tenant, kid string) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	st := store.New(f.Pool)
	id := uuid.Must(uuid.NewV7())
	if _, _, err := st.InsertTask(ctx, store.InsertTaskParams{ID: id, TenantID: tenant, Kid: kid, Agent: "sim",
		Input: json.RawMessage(`{}`), Budget: json.RawMessage(`{"max_steps":10,"max_wallclock_s":300,"max_cost_usd":1}`),
		RequestHash: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	running, _, err := st.UnscopedStartTask(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.UnscopedPauseTask(ctx, store.UnscopedPauseTaskParams{Claim: store.Claim{ID: id, Attempt: running.Attempt},
		Reason: "task_max_steps", Limit: 10, Used: 10}); err != nil {
		t.Fatal(err)
	}
	testfactory.TaskPausedAgo(t, f.Pool, id, time.Second, time.Hour)
	return id
}
