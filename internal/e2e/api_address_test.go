package e2e_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agentq/agentq"
)

// A worker run apart from the API with no public URL of its own refuses to start
// while no process serving the API has advertised its address, saying what to set;
// once one has, the worker starts and the approval links of the tasks it pauses lead
// to that API, which serves them.
func TestSplitWorkerLearnsTheAPIAddress(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	workerOnly := func(o *agentq.Options) { o.Config.Roles = []string{agentq.RoleWorker} }
	ctx := context.Background()
	lone, err := agentq.New(ctx, e.options(t, workerOnly))
	if err != nil {
		t.Fatal(err)
	}
	startErr := lone.Start(ctx)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := lone.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	var ce *agentq.ConfigError
	if !errors.As(startErr, &ce) || ce.Field != "PublicURL" || !strings.Contains(startErr.Error(), "AGENTQ_PUBLIC_URL") {
		t.Fatalf("a worker with no API address to use: Start() = %v, want a *ConfigError naming PublicURL", startErr)
	}

	api := e.start(t, func(o *agentq.Options) {
		o.Config.Roles = []string{agentq.RoleAPI, agentq.RoleScheduler, agentq.RoleJanitor}
	})
	e.run(t, e.options(t, workerOnly)) // no PublicURL: it learns the API's
	key := api.tenantWith("pz-split", "pro", nil, nil)
	id := api.submitSim(key, `{"agent":"sim","budget":{"max_cost_usd":0.05},"input":{"steps":5,"step_ms":5,"cost_usd_per_step":0.02}}`)
	if p := api.waitState(key, id, 20*time.Second, "paused", "completed", "budget_exceeded"); p.State != "paused" {
		t.Fatalf("at its budget: %+v, want paused", p)
	}
	link := api.approvalLink(key, id)
	if !strings.HasPrefix(link, api.base+"/approve?token=") {
		t.Fatalf("approval link %q, want one on the API at %s", link, api.base)
	}
	if st, page := getPage(t, "GET", link, nil); st != 200 || !strings.Contains(page, id) {
		t.Fatalf("approval page: %d %s", st, page)
	}
}
