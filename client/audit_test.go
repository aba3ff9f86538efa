package client

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"
)

// auditRow is a row exactly as the server renders it (api.AuditEntryJSON of web/api).
const auditRow = `{"id":12,"at":"2026-12-07T10:00:00Z","actor":{"kind":"credential","name":"admin","role":"admin"},` +
	`"claimed_actor":"alice","reason":"upgrade","action":"tenant.update","object":{"kind":"tenant","id":"acme","tenant":"acme"},` +
	`"before":{"plan":"free"},"after":{"plan":"pro"},"request_id":"r1","reverts":null,"prev_hash":"aa","hash":"bb"}`

// The audit calls: their paths, queries and headers (the claimed actor on every
// request, the reason of the context), and their answers decoded.
func TestAuditCalls(t *testing.T) {
	t.Parallel()
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, n int) {
		switch r.URL.Path {
		case "/v1/admin/audit":
			reply(200, `{"entries":[`+auditRow+`],"next_cursor":"12"}`)(w, r, n)
		case "/v1/admin/audit/head":
			reply(200, `{"id":12,"hash":"bb"}`)(w, r, n)
		case "/v1/admin/webhooks/0190d7f2-4c1e-7b3a-9d2e-5f6a7b8c9d0e":
			reply(200, `{"id":"0190d7f2-4c1e-7b3a-9d2e-5f6a7b8c9d0e","url":"https://h.example/x","types":["usage.limit_hit"]}`)(w, r, n)
		case "/v1/admin/audit/12/revert":
			reply(409, `{"error":{"code":"REVERT_CONFLICT","message":"Audit row 12 cannot be reverted: tenant acme changed since (status)."}}`)(w, r, n)
		default:
			reply(200, auditRow)(w, r, n)
		}
	})
	a := NewAdmin(f.URL, testAdmin, WithClaimedActor("alice"))
	ctx := WithReason(context.Background(), "upgrade")
	since := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	page, err := a.ListAudit(ctx, AuditQuery{Tenant: "acme", Object: "tenant:acme", Since: since, Limit: 5})
	if err != nil || len(page.Entries) != 1 || page.NextCursor != "12" || page.Entries[0].Actor.Role != "admin" ||
		string(page.Entries[0].After) != `{"plan":"pro"}` || page.Entries[0].Reverts != nil {
		t.Fatalf("ListAudit: %+v %v", page, err)
	}
	r := f.last(t)
	checkAuth(t, r, testAdmin)
	if r.RawQuery != "limit=5&object=tenant%3Aacme&since=2026-12-01T00%3A00%3A00Z&tenant=acme" ||
		r.Header.Get("X-Agentq-Actor") != "alice" || r.Header.Get("X-Agentq-Reason") != "upgrade" {
		t.Errorf("list request: %q %v", r.RawQuery, r.Header)
	}
	if e, err := a.GetAudit(context.Background(), 12); err != nil || e.ID != 12 || f.last(t).Path != "/v1/admin/audit/12" ||
		f.last(t).Header.Get("X-Agentq-Reason") != "" {
		t.Fatalf("GetAudit: %+v %v", e, err)
	}
	if h, err := a.AuditHead(ctx); err != nil || h.ID != 12 || h.Hash != "bb" {
		t.Fatalf("AuditHead: %+v %v", h, err)
	}
	_, err = a.RevertAudit(ctx, 12)
	var ae *Error
	if !errors.As(err, &ae) || ae.StatusCode != 409 || ae.Code != "REVERT_CONFLICT" || f.last(t).Method != "POST" {
		t.Fatalf("RevertAudit: %v", err)
	}
	if _, err := a.UpdateWebhook(ctx, "0190d7f2-4c1e-7b3a-9d2e-5f6a7b8c9d0e", false); err != nil {
		t.Fatal(err)
	}
	if r := f.last(t); r.Method != "PATCH" || r.Path != "/v1/admin/webhooks/0190d7f2-4c1e-7b3a-9d2e-5f6a7b8c9d0e" {
		t.Errorf("UpdateWebhook: %s %s", r.Method, r.Path)
	} else {
		jsonEqual(t, r.Body, `{"enabled":false}`)
	}
}

// A tenant.limits_changed decodes through LimitsChanged; another type does not.
func TestLimitsChangedEvent(t *testing.T) {
	t.Parallel()
	raw := `{"specversion":"1.0","id":"e1","source":"/agentq","type":"tenant.limits_changed","subject":"acme",` +
		`"time":"2026-12-07T10:00:00Z","datacontenttype":"application/json","data":{"tenant_id":"acme","changed":["plan"],` +
		`"before":{"plan":"free","weight":null,"status":"active","overrides":{},"billing_day":1,"time_zone":"UTC"},` +
		`"after":{"plan":"pro","weight":3,"status":"active","overrides":{"tenant_rate":"unlimited"},"billing_day":1,"time_zone":"UTC"},` +
		`"audit":{"id":12,"hash":"bb"}}}`
	var e Event
	if err := e.UnmarshalJSON([]byte(raw)); err != nil {
		t.Fatal(err)
	}
	d, err := e.LimitsChanged()
	if err != nil || d.After.Plan != "pro" || *d.After.Weight != 3 || d.Before.Weight != nil || d.Audit.ID != 12 || d.Actor != nil ||
		d.After.Overrides["tenant_rate"] != Unlimited {
		t.Fatalf("LimitsChanged: %+v %v", d, err)
	}
	e.Type = EventLimitHit
	if _, err := e.LimitsChanged(); err == nil {
		t.Error("a usage.limit_hit decoded as a tenant.limits_changed")
	}
}
