package web

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentq/agentq/web/api"
	"github.com/agentq/agentq/web/internal/webtest"
)

// write sends an admin write and returns the row it appended.
func (f *auditFixture) write(method, path, body string) api.AuditEntryJSON {
	f.t.Helper()
	if st, b := f.call(method, path, f.admin, body); st < 200 || st > 299 {
		f.t.Fatalf("%s %s: %d %s", method, path, st, b)
	}
	return f.lastRow()
}

// revert reverts row id and returns the status and the error code ("" on success).
func (f *auditFixture) revert(id int64) (int, string, string) {
	f.t.Helper()
	st, body := f.call("POST", "/v1/admin/audit/"+strconv.FormatInt(id, 10)+"/revert", f.admin, "")
	if st == 200 {
		return st, "", ""
	}
	code, msg := webtest.ErrorOf(f.t, body)
	return st, code, msg
}

func (f *auditFixture) tenantJSON(id string) api.TenantJSON {
	f.t.Helper()
	st, body := f.call("GET", "/v1/admin/tenants/"+id, f.admin, "")
	var tj api.TenantJSON
	if err := json.Unmarshal(body, &tj); st != 200 || err != nil {
		f.t.Fatalf("tenant: %d %s", st, body)
	}
	return tj
}

// A tenant's update is reverted while the tenant is as the row left it; changed since,
// the revert is refused naming what changed; rows that change nothing a revert can
// restore are refused as such.
func TestRevertTenant(t *testing.T) {
	t.Parallel()
	f := newAuditFixture(t)
	created := f.write("POST", "/v1/admin/tenants", `{"id":"acme","plan":"pro"}`)
	weight := f.write("PATCH", "/v1/admin/tenants/acme", `{"weight":5}`)
	suspend := f.write("PATCH", "/v1/admin/tenants/acme", `{"status":"suspended"}`)
	if st, code, msg := f.revert(weight.ID); st != 409 || code != api.CodeRevertConflict || !strings.Contains(msg, "status") {
		t.Fatalf("revert of a row whose tenant changed since: %d %s %q", st, code, msg)
	}
	if st, code, msg := f.revert(suspend.ID); st != 200 {
		t.Fatalf("revert of the last change: %d %s %q", st, code, msg)
	}
	rev := f.lastRow()
	if rev.Action != "tenant.revert" || rev.Reverts == nil || *rev.Reverts != suspend.ID {
		t.Fatalf("the revert's row: %+v", rev)
	}
	if st, _, _ := f.revert(weight.ID); st != 200 {
		t.Fatalf("revert of the weight once the status is back: %d", st)
	}
	if tj := f.tenantJSON("acme"); tj.Weight != nil || tj.Status != "active" {
		t.Fatalf("tenant after the reverts: weight %v status %s, want the plan's weight, active", tj.Weight, tj.Status)
	}
	if st, code, msg := f.revert(created.ID); st != 400 || code != api.CodeNotRevertible || !strings.Contains(msg, "cannot be reverted") {
		t.Fatalf("revert of a creation: %d %s %q", st, code, msg)
	}
	key := f.write("POST", "/v1/admin/tenants/acme/keys", "")
	if st, code, _ := f.revert(key.ID); st != 400 || code != api.CodeNotRevertible {
		t.Fatalf("revert of a key's creation: %d %s", st, code)
	}
	if st, code, _ := f.revert(999999); st != 404 || code != api.CodeNotFound {
		t.Fatalf("revert of no row: %d %s", st, code)
	}
}

// A revert of an agent's replacement puts its URL back and leaves its headers and
// signing secret as they are now; a webhook endpoint's enablement is reverted without
// touching its secret.
func TestRevertKeepsSecrets(t *testing.T) {
	t.Parallel()
	f := newAuditFixture(t)
	ctx := context.Background()
	f.write("PUT", "/v1/admin/agents/scorer", `{"url":"https://one.example/run","headers":{"Authorization":"Bearer first-7f3a"}}`)
	put := f.write("PUT", "/v1/admin/agents/scorer", `{"url":"https://two.example/run","step_timeout_s":5,"headers":{"Authorization":"Bearer second-9c1e"}}`)
	before, err := f.Svc.Agents.Get(ctx, "scorer")
	if err != nil {
		t.Fatal(err)
	}
	if st, code, msg := f.revert(put.ID); st != 200 {
		t.Fatalf("revert of the agent's replacement: %d %s %q", st, code, msg)
	}
	after, err := f.Svc.Agents.Get(ctx, "scorer")
	if err != nil {
		t.Fatal(err)
	}
	if after.URL != "https://one.example/run" || after.StepTimeoutS != 30 {
		t.Errorf("agent after the revert: %s %v, want the first URL and the default timeout", after.URL, after.StepTimeoutS)
	}
	if after.SigningSecret != before.SigningSecret || after.Headers["Authorization"] != "Bearer second-9c1e" {
		t.Errorf("the revert changed the agent's secrets: headers %v", after.Headers)
	}

	st, body := f.call("POST", "/v1/admin/webhooks", f.admin, `{"url":"https://hooks.example/x","types":["usage.limit_hit"]}`)
	var wh api.WebhookWithSecret
	if err := json.Unmarshal(body, &wh); st != 201 || err != nil {
		t.Fatalf("webhook: %d %s", st, body)
	}
	off := f.write("PATCH", "/v1/admin/webhooks/"+wh.ID, `{"enabled":false}`)
	if st, code, msg := f.revert(off.ID); st != 200 {
		t.Fatalf("revert of the disablement: %d %s %q", st, code, msg)
	}
	var secret string
	var disabled *time.Time
	if err := f.Pool.QueryRow(ctx, `SELECT secret, disabled_at FROM webhook_endpoints WHERE id = $1`, wh.ID).Scan(&secret, &disabled); err != nil {
		t.Fatal(err)
	}
	if secret != wh.Secret || disabled != nil {
		t.Errorf("endpoint after the revert: disabled %v, secret kept %v", disabled, secret == wh.Secret)
	}
}

// Pools and bindings go back to the row's before: a creation's revert deletes, a
// deletion's creates again, a revert's revert redoes.
func TestRevertPoolsAndBindings(t *testing.T) {
	t.Parallel()
	f := newAuditFixture(t)
	created := f.write("PUT", "/v1/admin/pools/gpt", `{"tokens_per_minute":1000}`)
	if st, _, msg := f.revert(created.ID); st != 200 {
		t.Fatalf("revert of a pool's creation: %d %q", st, msg)
	}
	if st, _ := f.call("GET", "/v1/admin/pools/gpt", f.admin, ""); st != 404 {
		t.Fatalf("pool after its creation was reverted: %d", st)
	}
	if st, _, msg := f.revert(f.lastRow().ID); st != 200 {
		t.Fatalf("revert of the revert: %d %q", st, msg)
	}
	bound := f.write("PUT", "/v1/admin/agents/sim/pool", `{"pool":"gpt","tokens_per_step":10}`)
	moved := f.write("PUT", "/v1/admin/agents/sim/pool", `{"pool":"gpt","tokens_per_step":25}`)
	if st, code, _ := f.revert(bound.ID); st != 409 || code != api.CodeRevertConflict {
		t.Fatalf("revert of a binding changed since: %d %s", st, code)
	}
	if st, _, msg := f.revert(moved.ID); st != 200 {
		t.Fatalf("revert of the binding's change: %d %q", st, msg)
	}
	st, body := f.call("GET", "/v1/admin/agents/sim/pool", f.admin, "")
	if st != 200 || !strings.Contains(string(body), `"tokens_per_step":10`) {
		t.Fatalf("binding after the revert: %d %s", st, body)
	}
}

// A change of a tenant's limits writes its tenant.limits_changed twice: the
// operators' copy, in the admin feed, names who and why; the tenant's, in its feed,
// does not.
func TestLimitsChangedEvent(t *testing.T) {
	t.Parallel()
	f := newAuditFixture(t)
	f.write("POST", "/v1/admin/tenants", `{"id":"acme","plan":"pro"}`)
	key := f.write("POST", "/v1/admin/tenants/acme/keys", "")
	_ = key
	st, body := f.send("PATCH", "/v1/admin/tenants/acme", f.admin, `{"weight":7}`, map[string]string{"X-Agentq-Reason": "bigger share"})
	if st != 200 {
		t.Fatalf("patch: %d %s", st, body)
	}
	row := f.lastRow()
	st, body = f.call("POST", "/v1/admin/tenants/acme/keys", f.admin, "")
	var k api.KeyCreated
	if err := json.Unmarshal(body, &k); st != 201 || err != nil {
		t.Fatalf("key: %d %s", st, body)
	}
	admin := f.feed("/v1/admin/events?type=tenant.limits_changed", f.admin)
	own := f.feed("/v1/events?type=tenant.limits_changed", k.Key)
	var a, o struct {
		Data map[string]any `json:"data"`
	}
	_ = json.Unmarshal(admin, &a)
	_ = json.Unmarshal(own, &o)
	audit, _ := a.Data["audit"].(map[string]any)
	if a.Data["reason"] != "bigger share" || a.Data["actor"] == nil || audit["hash"] != row.Hash {
		t.Errorf("the operators' copy: %s", admin)
	}
	if _, ok := o.Data["actor"]; ok || o.Data["reason"] != nil || o.Data["claimed_actor"] != nil {
		t.Errorf("the tenant's copy names who or why: %s", own)
	}
	if after, _ := o.Data["after"].(map[string]any); after["weight"] != float64(7) {
		t.Errorf("the tenant's copy: %s", own)
	}
}

// feed reads path until it holds one event and returns it; the feeds show an event
// once every older transaction of the server has ended.
func (f *auditFixture) feed(path, token string) []byte {
	f.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st, body := f.call("GET", path, token, "")
		var page struct {
			Events []json.RawMessage `json:"events"`
		}
		if err := json.Unmarshal(body, &page); st != 200 || err != nil {
			f.t.Fatalf("%s: %d %s", path, st, body)
		}
		if len(page.Events) > 1 {
			f.t.Fatalf("%s: %d events, want one copy: %s", path, len(page.Events), body)
		}
		if len(page.Events) == 1 {
			return page.Events[0]
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%s: no event", path)
		}
	}
}

// Bad query parameters of the list are 400s with the error body.
func TestAuditListRefusesBadQueries(t *testing.T) {
	t.Parallel()
	f := newAuditFixture(t)
	for _, q := range []string{"?colour=red", "?since=yesterday", "?limit=0", "?limit=1001", "?object=planet", "?cursor=abc", "?cursor=-3"} {
		st, body := f.call("GET", "/v1/admin/audit"+q, f.admin, "")
		if code, _ := webtest.ErrorOf(t, body); st != 400 || code != api.CodeInvalidRequest {
			t.Errorf("%s: %d %s", q, st, body)
		}
	}
	st, body := f.call("GET", "/v1/admin/audit/head", f.admin, "")
	if st != 200 || string(body) != `{"id":0,"hash":"0000000000000000000000000000000000000000000000000000000000000000"}`+"\n" {
		t.Errorf("head of an empty log: %d %s", st, body)
	}
}

// The tenant panel shows changes to the tenant's own limits: what and when, not who
// or why.
func TestPanelShowsLimitChanges(t *testing.T) {
	t.Parallel()
	f := newAuditFixture(t)
	f.write("POST", "/v1/admin/tenants", `{"id":"acme","plan":"pro"}`)
	hdr := map[string]string{"X-Agentq-Actor": "alice-claims", "X-Agentq-Reason": "ticket-99"}
	if st, body := f.send("PATCH", "/v1/admin/tenants/acme", f.admin, `{"plan":"enterprise"}`, hdr); st != 200 {
		t.Fatalf("patch: %d %s", st, body)
	}
	f.write("PATCH", "/v1/admin/tenants/acme", `{"name":"Acme Inc."}`) // not a limit: not shown
	st, body := f.call("POST", "/v1/admin/tenants/acme/panel-links", f.admin, "")
	var link api.PanelLink
	if err := json.Unmarshal(body, &link); st != 201 || err != nil {
		t.Fatalf("panel link: %d %s", st, body)
	}
	u, _ := url.Parse(link.URL)
	st, page := f.call("GET", u.RequestURI(), "", "")
	html := string(page)
	if st != 200 || !strings.Contains(html, `id="limit-changes"`) ||
		!strings.Contains(html, `<code>plan</code> &#34;pro&#34; → &#34;enterprise&#34;`) {
		t.Fatalf("panel: %d, no plan change in %s", st, html)
	}
	for _, hidden := range []string{"alice-claims", "ticket-99", "Acme Inc.", "credential"} {
		if strings.Contains(html, hidden) {
			t.Errorf("the panel shows %q", hidden)
		}
	}
}
