package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	webapi "github.com/agentq/agentq/web/api"
)

// The CLI's changes are recorded as "cli:<os user>" with the --reason given, and its
// audit commands list, show, revert, print the head and verify: verify fails on a
// row altered behind the table's back, and on a tail cut off against a kept head.
func TestCLIAudit(t *testing.T) {
	t.Parallel()
	h := newAdminHarness(t)
	ctx := context.Background()
	pool := h.store.Pool()
	if _, err := h.cli("tenant-create", "--id", "acme", "--plan", "pro", "--reason", "onboarding"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.cli("tenant-update", "acme", "--weight", "3"); err != nil {
		t.Fatal(err)
	}
	out, err := h.cli("audit", "list", "--tenant", "acme")
	var page webapi.AuditPageJSON
	if err != nil || json.Unmarshal([]byte(out), &page) != nil || len(page.Entries) != 2 {
		t.Fatalf("audit list: %v %s", err, out)
	}
	update, create := page.Entries[0], page.Entries[1]
	if create.Action != "tenant.create" || create.Actor.Kind != "cli" || cliActor("").Name != create.Actor.Name ||
		!strings.HasPrefix(create.Actor.Name, "cli:") || create.Reason != "onboarding" || update.Action != "tenant.update" {
		t.Fatalf("rows: %+v / %+v", create, update)
	}
	if out, err := h.cli("audit", "show", strconv.FormatInt(update.ID, 10)); err != nil || !strings.Contains(out, `"tenant.update"`) {
		t.Fatalf("audit show: %v %s", err, out)
	}
	if out, err := h.cli("audit", "revert", strconv.FormatInt(update.ID, 10)); err != nil || !strings.Contains(out, `"tenant.revert"`) {
		t.Fatalf("audit revert: %v %s", err, out)
	}
	if _, err := h.cli("audit", "revert", strconv.FormatInt(create.ID, 10)); err == nil || !strings.Contains(err.Error(), "cannot be reverted") {
		t.Fatalf("audit revert of a creation: %v", err)
	}
	out, err = h.cli("audit", "head")
	var head webapi.AuditEntryJSON
	if err != nil || json.Unmarshal([]byte(out), &head) != nil || head.ID == 0 || len(head.Hash) != 64 {
		t.Fatalf("audit head: %v %s", err, out)
	}
	if out, err := h.cli("audit", "verify", "--expect-head", head.Hash); err != nil || !strings.HasPrefix(out, "ok: 3 rows") {
		t.Fatalf("audit verify: %v %s", err, out)
	}

	// A tail cut off, with the head put back where the chain now ends.
	for _, q := range []string{
		`ALTER TABLE audit_log DISABLE TRIGGER USER`, `DELETE FROM audit_log WHERE id = ` + strconv.FormatInt(head.ID, 10),
		`ALTER TABLE audit_log ENABLE TRIGGER USER`, `ALTER TABLE audit_head DISABLE TRIGGER USER`,
		`UPDATE audit_head SET last_id = ` + strconv.FormatInt(update.ID, 10) + `, hash = (SELECT hash FROM audit_log WHERE id = ` + strconv.FormatInt(update.ID, 10) + `)`,
		`ALTER TABLE audit_head ENABLE TRIGGER USER`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if _, err := h.cli("audit", "verify"); err != nil {
		t.Fatalf("a cut chain without a kept head: %v", err)
	}
	if _, err := h.cli("audit", "verify", "--expect-head", head.Hash); err == nil || !strings.Contains(err.Error(), "cut off") {
		t.Fatalf("verify --expect-head after the tail was cut: %v", err)
	}

	// A row altered behind the trigger's back.
	for _, q := range []string{`ALTER TABLE audit_log DISABLE TRIGGER USER`,
		`UPDATE audit_log SET reason = 'nothing happened' WHERE id = ` + strconv.FormatInt(create.ID, 10),
		`ALTER TABLE audit_log ENABLE TRIGGER USER`} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	_, err = h.cli("audit", "verify")
	if err == nil || !strings.Contains(err.Error(), "row "+strconv.FormatInt(create.ID, 10)+":") {
		t.Fatalf("verify after a row was altered: %v", err)
	}
}
