package e2e_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/internal/testenv"
)

// With a replica URL the usage export reads the replica, not the primary. The
// "replica" here is another, empty schema: the export over it shows no tenant, while
// the primary holds one that used steps.
func TestUsageExportReadsTheReplica(t *testing.T) {
	t.Parallel()
	replica, _ := testenv.Schema(t)
	u, err := url.Parse(testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", replica)
	u.RawQuery = q.Encode()
	e := newEnv(t)
	h := e.start(t, func(o *agentq.Options) { o.Config.ReplicaDatabaseURL = u.String() })
	c, _ := h.tenantClient("acme", "pro", nil)
	task, err := c.SubmitTask(context.Background(), sim(2, 1))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, c, task.ID, "completed", 30*time.Second)
	month := time.Now().UTC().Format("2006-01")
	exp, err := h.adminClient().UsageExport(context.Background(), month)
	if err != nil {
		t.Fatal(err)
	}
	if len(exp.Tenants) != 0 {
		t.Fatalf("export %+v: read the primary, want the (empty) replica", exp)
	}
	// the same export on a process without a replica reads the primary
	plain := e.start(t)
	exp, err = plain.adminClient().UsageExport(context.Background(), month)
	if err != nil || len(exp.Tenants) != 1 {
		t.Fatalf("export without a replica: %+v, %v; want acme", exp, err)
	}
}
