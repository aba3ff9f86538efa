//go:build cluster

// The Redis Cluster suite (`make test-cluster`): every test starts a local cluster of
// three masters and runs agentq's roles as separate processes (Apps) on it.

package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/testenv"
)

const clusterShards = 16

// newClusterEnv is an env on a fresh 3-master cluster, its keys spread over
// clusterShards shards (so over all three nodes).
func newClusterEnv(t *testing.T) (*env, *testenv.Cluster) {
	c := testenv.StartCluster(t, 3)
	rdb := c.Client()
	e := &env{pool: testenv.Postgres(t), rdb: rdb, keys: rkeys.New("c"+testenv.ID()+":", clusterShards), admin: "admin-" + testenv.ID()}
	// the shards must land on every node, or the cluster is not really exercised
	nodes := map[string]bool{}
	for shard := range clusterShards {
		slot, err := rdb.ClusterKeySlot(context.Background(), e.keys.ShardGeneration(shard)).Result()
		if err != nil {
			t.Fatal(err)
		}
		nodes[nodeOfSlot(t, rdb, slot)] = true
	}
	if len(nodes) != 3 {
		t.Fatalf("%d shards cover %d of 3 nodes", clusterShards, len(nodes))
	}
	return e, c
}

func nodeOfSlot(t *testing.T, rdb *redis.ClusterClient, slot int64) string {
	shards, err := rdb.ClusterShards(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if r.Start <= slot && slot <= r.End {
				return fmt.Sprintf("127.0.0.1:%d", sh.Nodes[0].Port)
			}
		}
	}
	t.Fatalf("slot %d has no node", slot)
	return ""
}

// roles runs a process with only the given roles, on the cluster's shards.
func roles(rs ...string) func(*agentq.Options) {
	return func(o *agentq.Options) {
		o.Config.Roles = rs
		o.Config.Shards = clusterShards
		o.Config.WorkerConcurrency = 4
	}
}

// clusterProcesses starts two API, two scheduler (one of them the janitor) and two
// worker processes, as `agentq serve --roles` would on six machines.
func clusterProcesses(t *testing.T, e *env) (apis []*harness) {
	a1 := e.start(t, roles("api"))
	a2 := e.start(t, roles("api"))
	e.start(t, roles("scheduler", "janitor"))
	e.start(t, roles("scheduler"))
	e.start(t, roles("worker"))
	e.start(t, roles("worker"))
	return []*harness{a1, a2}
}

// A model pool on a 3-master cluster: one slot of its own, shared by the workers of
// every process and by tenants on different shards.
func TestClusterPoolShared(t *testing.T) {
	e, _ := newClusterEnv(t)
	apis := clusterProcesses(t, e)
	poolSharedByReplicas(t, apis[0], apis[1])
}

// waitCompleted waits until every task is completed and returns them.
func waitCompleted(t *testing.T, c *client.Client, ids []string, within time.Duration) []*client.Task {
	t.Helper()
	deadline := time.Now().Add(within)
	out := make([]*client.Task, len(ids))
	for i, id := range ids {
		out[i] = waitState(t, c, id, "completed", max(time.Until(deadline), 0))
	}
	return out
}

// Split roles on a 3-master cluster: every task runs exactly once, a tenant's rate
// limit holds across both API processes, and two backlogged tenants on different
// shards share the workers by their weights.
func TestClusterSplitRoles(t *testing.T) {
	e, _ := newClusterEnv(t)
	apis := clusterProcesses(t, e)
	ctx := context.Background()

	t.Run("every task runs exactly once", func(t *testing.T) {
		// each tenant's key on both APIs: submissions alternate between them
		var cs [2][2]*client.Client
		for j := range 2 {
			_, k := apis[0].tenantClient(fmt.Sprint("once", j), "pro", nil)
			cs[j] = [2]*client.Client{client.New(apis[0].base, k.Key), client.New(apis[1].base, k.Key)}
		}
		var ids [2][]string
		for i := range 50 {
			for j := range 2 {
				task, err := cs[j][i%2].SubmitTask(ctx, sim(2, 20))
				if err != nil {
					t.Fatalf("submit %d: %v", i, err)
				}
				ids[j] = append(ids[j], task.ID)
			}
		}
		for j := range 2 {
			for _, task := range waitCompleted(t, cs[j][0], ids[j], 60*time.Second) {
				if task.Usage.Steps != 2 || task.Attempt != 1 {
					t.Errorf("task %s: %d steps in %d attempts, want 2 in 1", task.ID, task.Usage.Steps, task.Attempt)
				}
			}
		}
		var ledger int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM usage_ledger WHERE meter = 'steps' AND tenant_id IN ('once0', 'once1')`).Scan(&ledger); err != nil {
			t.Fatal(err)
		}
		if ledger != 200 {
			t.Fatalf("ledger holds %d steps of 100 two-step tasks, want 200", ledger)
		}
	})

	t.Run("a rate limit is global", func(t *testing.T) {
		_, k := apis[0].tenantClient("rated", "pro", map[string]client.Limit{"tenant_rate": 10, "tenant_rate_burst": 10})
		cs := []*client.Client{client.New(apis[0].base, k.Key), client.New(apis[1].base, k.Key)}
		start := time.Now()
		var mu sync.Mutex
		admitted := 0
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for range 15 {
					_, err := cs[w%2].SubmitTask(ctx, sim(1, 0))
					if err == nil {
						mu.Lock()
						admitted++
						mu.Unlock()
					} else if st, _ := statusOf(err); st != 429 {
						t.Errorf("submit: %v", err)
					}
				}
			})
		}
		wg.Wait()
		el := time.Since(start).Seconds()
		if max := 10 + int(10*el) + 1; admitted > max || admitted < 10 {
			t.Fatalf("two APIs admitted %d of 60 in %.2f s for a 10/s burst-10 tenant, want 10..%d", admitted, el, max)
		}
	})
}

// Two backlogged tenants on different shards (so, here, on different nodes) share
// the workers by their weights. All their tasks are queued before the workers start,
// so both are backlogged from the first dispatch however slowly submissions go.
func TestClusterFairSharesAcrossShards(t *testing.T) {
	e, _ := newClusterEnv(t)
	api := e.start(t, roles("api"))
	e.start(t, roles("scheduler", "janitor"))
	e.start(t, roles("scheduler"))
	ctx := context.Background()

	// two tenants on different shards (so, here, on different nodes)
	var light, heavy string
	for i := 0; light == "" || heavy == ""; i++ {
		id := fmt.Sprint("fair", i)
		switch {
		case light == "":
			light = id
		case e.keys.Shard(id) != e.keys.Shard(light):
			heavy = id
		}
	}
	cl, ch := api.weightedTenant(light, 1), api.weightedTenant(heavy, 3)
	// 80 tasks of 100 ms each, queued with no worker running.
	var lightIDs, heavyIDs []string
	for range 80 {
		for _, p := range []struct {
			c   *client.Client
			ids *[]string
		}{{cl, &lightIDs}, {ch, &heavyIDs}} {
			task, err := p.c.SubmitTask(ctx, sim(1, 100))
			if err != nil {
				t.Fatal(err)
			}
			*p.ids = append(*p.ids, task.ID)
		}
	}
	e.start(t, roles("worker"))
	e.start(t, roles("worker"))
	waitCompleted(t, cl, lightIDs, 90*time.Second)
	waitCompleted(t, ch, heavyIDs, 90*time.Second)
	// While both were backlogged (the first 80 tasks to finish), weight 3 gets
	// three quarters of them.
	type fin struct {
		at    time.Time
		heavy bool
	}
	var fins []fin
	for _, p := range []struct {
		c     *client.Client
		ids   []string
		heavy bool
	}{{cl, lightIDs, false}, {ch, heavyIDs, true}} {
		for _, id := range p.ids {
			task, err := p.c.GetTask(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			fins = append(fins, fin{at: *task.FinishedAt, heavy: p.heavy})
		}
	}
	slices.SortFunc(fins, func(a, b fin) int { return a.at.Compare(b.at) })
	h := 0
	for _, f := range fins[:80] {
		if f.heavy {
			h++
		}
	}
	if share := float64(h) / 80; share < 0.65 || share > 0.85 {
		t.Fatalf("weight 3 against weight 1 got %.2f of the first 80 completions, want 0.75 ± 0.1", share)
	}
}

// A master killed and restarted empty mid-run (its shards' queues, leases, counters
// and the asynq tasks on it are gone) loses no accepted task: the janitor sees the
// shards' generation markers gone and rebuilds from Postgres.
func TestClusterMasterLossLosesNoTask(t *testing.T) {
	e, c := newClusterEnv(t)
	apis := clusterProcesses(t, e)
	ctx := context.Background()
	var cs []*client.Client
	for i := range 4 {
		cl, _ := apis[0].tenantClient(fmt.Sprint("loss", i), "pro", nil)
		cs = append(cs, cl)
	}
	ids := make([][]string, len(cs))
	submit := func(n int) {
		for range n {
			for i, cl := range cs {
				task, err := cl.SubmitTask(ctx, sim(3, 30))
				if err != nil {
					continue // refused while the node is down: not accepted, not owed
				}
				ids[i] = append(ids[i], task.ID)
			}
		}
	}
	// Kill the node holding asynq's queue: its messages go too, the hardest case.
	slot, err := e.rdb.(*redis.ClusterClient).ClusterKeySlot(ctx, "asynq:{"+e.keys.AsynqQueue("default")+"}:pending").Result()
	if err != nil {
		t.Fatal(err)
	}
	victim := slices.Index(c.Addrs(), nodeOfSlot(t, e.rdb.(*redis.ClusterClient), slot))
	if victim < 0 {
		t.Fatal("no node holds asynq's queue")
	}
	submit(20)
	time.Sleep(500 * time.Millisecond) // some run, some wait in queues and in asynq
	c.Kill(victim)
	time.Sleep(time.Second)
	c.Restart(victim)
	submit(10)
	accepted := 0
	for i, cl := range cs {
		accepted += len(ids[i])
		for _, task := range waitCompleted(t, cl, ids[i], 120*time.Second) {
			if task.Usage.Steps != 3 {
				t.Errorf("task %s recorded %d steps, want 3", task.ID, task.Usage.Steps)
			}
		}
	}
	if accepted < 80 {
		t.Fatalf("only %d of 120 submissions accepted around the restart", accepted)
	}
}

// While the master holding a tenant's keys is down (killed, then restarted empty),
// the tenant's reads answer within a few of admission's Redis deadlines, without
// what Redis alone holds, saying so (degraded): they neither wait on the cluster
// client's retries nor fail.
func TestClusterReadsAnswerWhileAMasterIsDown(t *testing.T) {
	e, c := newClusterEnv(t)
	api := e.start(t, roles("api"), func(o *agentq.Options) { o.Config.RedisTimeout = redisStallTimeout })
	ctx := context.Background()
	cl, k := api.tenantClient("down", "pro", nil)
	for range 3 {
		if _, err := cl.SubmitTask(ctx, sim(1, 1)); err != nil {
			t.Fatal(err)
		}
	}
	rdb := e.rdb.(*redis.ClusterClient)
	slot, err := rdb.ClusterKeySlot(ctx, e.keys.Rejections("down")).Result()
	if err != nil {
		t.Fatal(err)
	}
	victim := slices.Index(c.Addrs(), nodeOfSlot(t, rdb, slot))
	if victim < 0 {
		t.Fatal("no node holds the tenant's keys")
	}
	c.Kill(victim)
	for _, r := range []struct {
		name, path string
		check      func(*testing.T, map[string]any, bool)
	}{
		{"task list", "/v1/tasks?state=queued", func(t *testing.T, b map[string]any, whole bool) {
			tasks, _ := b["tasks"].([]any)
			if len(tasks) != 3 {
				t.Fatalf("%d queued tasks listed, want 3: %v", len(tasks), b)
			}
			for _, x := range tasks {
				checkWaitReason(t, x.(map[string]any), whole)
			}
		}},
		{"usage", "/v1/usage", checkUsage},
	} {
		for range 3 { // the first one meets the cluster client's stale view, the others its retries
			var body map[string]any
			t0 := time.Now()
			st, _ := api.do("GET", r.path, k.Key, nil, &body)
			took := time.Since(t0)
			t.Logf("%s answered %d in %v with a master down", r.name, st, took)
			if st != 200 || took > readBudget {
				t.Fatalf("%s answered %d in %v with a master down: want 200 within %v", r.name, st, took, readBudget)
			}
			r.check(t, body, false)
		}
	}
	c.Restart(victim)
}
