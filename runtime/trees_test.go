package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/internal/testenv/testfactory"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/runtime"
	"github.com/agentq/agentq/scheduler"
)

// parentAgent answers its first step with the spawns its input names ("spawn", and
// itself with its own input after them with "spawn_self") and, unless "no_wait", a
// wait for them; its second step ends the task with what its
// step request said of them as its output.
func parentAgent(t testing.TB) stepFunc {
	return func(_ context.Context, req runtime.StepRequest) (runtime.StepResult, error) {
		if req.Step == 1 {
			var in struct {
				Spawn     []runtime.Spawn `json:"spawn"`
				NoWait    bool            `json:"no_wait"`
				SpawnSelf bool            `json:"spawn_self"`
			}
			if err := json.Unmarshal(req.Input, &in); err != nil {
				t.Errorf("parent input: %v", err)
			}
			if in.SpawnSelf { // a loop: itself, with its own input
				in.Spawn = append(in.Spawn, runtime.Spawn{Agent: req.Agent, Input: req.Input})
			}
			res := runtime.StepResult{State: json.RawMessage(`{"n":1}`), Spawn: in.Spawn}
			if !in.NoWait {
				res.Wait = runtime.WaitChildren
			}
			return res, nil
		}
		out, err := json.Marshal(parentOutput{Spawned: req.Spawned, Children: req.Children})
		return runtime.StepResult{Done: true, Output: out}, err
	}
}

// parentOutput is parentAgent's output.
type parentOutput struct {
	Spawned  []agentqtype.SpawnOutcome `json:"spawned"`
	Children []agentqtype.ChildResult  `json:"children"`
}

func (r *rig) output(id uuid.UUID) parentOutput {
	r.t.Helper()
	var out parentOutput
	if err := json.Unmarshal(r.task(id).Output, &out); err != nil {
		r.t.Fatalf("output of %s: %v", id, err)
	}
	return out
}

// spawnInput is a parentAgent's input spawning spawns.
func spawnInput(t testing.TB, spawns ...runtime.Spawn) string {
	b, err := json.Marshal(map[string]any{"spawn": spawns})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func leafAgent() stepFunc {
	return func(_ context.Context, req runtime.StepRequest) (runtime.StepResult, error) {
		var in struct {
			N    int     `json:"n"`
			Cost float64 `json:"cost_usd"`
		}
		_ = json.Unmarshal(req.Input, &in)
		out, _ := json.Marshal(map[string]int{"v": in.N * 10})
		return runtime.StepResult{Done: true, Output: out, Usage: runtime.StepUsage{Tokens: 5, CostUSD: in.Cost}}, nil
	}
}

// A parent waits for its children without its worker (one slot in all) and reads
// each child's end, whatever it was: completed with its output, failed, stopped at
// its budget, killed. Once every child ended, the tree holds what they used and no
// more: the rest of their budgets came back.
func TestParentReadsEveryChildEnd(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, tasks.LifecycleOptions{}, 1, nil)
	r.agents.Register("parent", parentAgent(t))
	r.agents.Register("leaf", leafAgent())
	r.agents.Register("boom", stepFunc(func(context.Context, runtime.StepRequest) (runtime.StepResult, error) {
		return runtime.StepResult{}, fmt.Errorf("%w: boom", runtime.ErrStepFailed)
	}))
	r.agents.Register("counter", counter(t))
	started := make(chan struct{}, 1)
	r.agents.Register("blocker", stepFunc(func(ctx context.Context, _ runtime.StepRequest) (runtime.StepResult, error) {
		started <- struct{}{}
		<-ctx.Done()
		return runtime.StepResult{}, ctx.Err()
	}))
	r.start()
	one := 1
	root := r.submit("parent", spawnInput(t,
		runtime.Spawn{Agent: "leaf", Input: json.RawMessage(`{"n":4,"cost_usd":0.01}`)},
		runtime.Spawn{Agent: "boom"},
		runtime.Spawn{Agent: "counter", Input: json.RawMessage(`{"steps":2}`), Budget: &runtime.SpawnBudget{MaxSteps: &one}},
		runtime.Spawn{Agent: "blocker", Input: json.RawMessage(`{}`)},
	), nil)
	<-started
	kids := r.liveChildren(root)
	if len(kids) != 1 {
		t.Fatalf("live children while the blocker runs: %d, want 1", len(kids))
	}
	if _, err := r.svc.Cancel(r.ctx, tenant, kids[0]); err != nil {
		t.Fatal(err)
	}
	r.waitState(root, agentqtype.TaskStateCompleted)
	out := r.output(root)
	want := []agentqtype.TaskState{agentqtype.TaskStateCompleted, agentqtype.TaskStateFailed, agentqtype.TaskStateBudgetExceeded,
		agentqtype.TaskStateKilled}
	if len(out.Children) != len(want) || len(out.Spawned) != len(want) {
		t.Fatalf("the parent read %d children and %d spawns, want %d each: %+v", len(out.Children), len(out.Spawned), len(want), out)
	}
	for i, c := range out.Children {
		if c.State != want[i] || c.ID != out.Spawned[i].ID {
			t.Errorf("child %d: %s %s, want %s, id %s", i, c.ID, c.State, want[i], out.Spawned[i].ID)
		}
		r.wantReleased(uuid.MustParse(c.ID))
	}
	var leafOut struct{ V int }
	if err := json.Unmarshal(out.Children[0].Output, &leafOut); err != nil || leafOut.V != 40 || out.Children[0].Usage.CostUSD != 0.01 {
		t.Errorf("the leaf's output %s, cost %v; want {\"v\":40} and 0.01", out.Children[0].Output, out.Children[0].Usage.CostUSD)
	}
	for i, c := range out.Children[1:] {
		if c.Error == nil || *c.Error == "" {
			t.Errorf("child %d ended %s without its reason", i+1, c.State)
		}
	}
	tree, err := r.svc.Tree(r.ctx, tenant, tasks.Scope{}, root)
	if err != nil {
		t.Fatal(err)
	}
	used := tree.Totals.CostMicroUSD
	budget := int64(math.Round(tree.Budget.MaxCostUSD * 1e6))
	if tree.Tasks != 5 || used != 10_000 || tree.Remaining.CostMicro != budget-used {
		t.Fatalf("tree: %d tasks, used %d µ$, %d µ$ left of %d; want 5 tasks, 10000 used, the rest left", tree.Tasks, used,
			tree.Remaining.CostMicro, budget)
	}
}

// liveChildren lists the live children of parent.
func (r *rig) liveChildren(parent uuid.UUID) []uuid.UUID {
	r.t.Helper()
	kids, err := r.st.UnscopedLiveChildrenOf(r.ctx, parent)
	if err != nil {
		r.t.Fatal(err)
	}
	ids := make([]uuid.UUID, len(kids))
	for i, k := range kids {
		ids[i] = k.ID
	}
	return ids
}

// A spawn is refused, and reported to its parent, when its agent is unknown, when it
// repeats an ancestor's agent and input, past the tree's max_depth and past its
// max_tasks; the others are made.
func TestSpawnRefusals(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.agents.Register("parent", parentAgent(t))
	r.agents.Register("leaf", leafAgent())
	r.start()
	self := spawnInput(t, runtime.Spawn{Agent: "leaf", Input: json.RawMessage(`{"n":9}`)})
	rootInput := spawnInput(t,
		runtime.Spawn{Agent: "leaf", Input: json.RawMessage(`{"n":1}`)},
		runtime.Spawn{Agent: "nobody"},
		runtime.Spawn{Agent: "parent", Input: json.RawMessage(self)},
		runtime.Spawn{Agent: "leaf", Input: json.RawMessage(`{"n":2}`)},
		runtime.Spawn{Agent: "leaf", Input: json.RawMessage(`{"n":3}`)},
	)
	var in map[string]any
	if err := json.Unmarshal([]byte(rootInput), &in); err != nil {
		t.Fatal(err)
	}
	in["spawn_self"] = true
	b, _ := json.Marshal(in)
	depth, four := 1, 4
	res, err := r.svc.Submit(r.ctx, tasks.SubmitParams{TenantID: tenant, Kid: "k", Agent: "parent", Input: b,
		TreeBudget: &quotas.TreeBudgetRequest{MaxDepth: &depth, MaxTasks: &four}})
	if err != nil {
		t.Fatal(err)
	}
	root := res.Task.ID
	r.waitState(root, agentqtype.TaskStateCompleted)
	out := r.output(root)
	wantRefused := []string{"", agentqtype.SpawnInvalid, "", "", quotas.TreeMaxTasks, agentqtype.SpawnLoopDetected}
	if len(out.Spawned) != len(wantRefused) {
		t.Fatalf("spawned: %+v, want %d outcomes", out.Spawned, len(wantRefused))
	}
	for i, s := range out.Spawned {
		got := ""
		if s.Refused != nil {
			got = s.Refused.LimitType
		}
		if got != wantRefused[i] || (got == "") != (s.ID != "") || s.Index != i {
			t.Errorf("spawn %d: %+v, want refused %q", i, s, wantRefused[i])
		}
	}
	if len(out.Children) != 3 {
		t.Fatalf("%d children, want 3", len(out.Children))
	}
	// The child at depth 1 asked for a grandchild at depth 2.
	mid := uuid.MustParse(out.Spawned[2].ID)
	if got := r.task(mid); got.Depth != 1 || *got.ParentID != root || got.Root() != root {
		t.Fatalf("the middle child: depth %d, parent %v, root %v", got.Depth, got.ParentID, got.Root())
	}
	sub := r.output(mid)
	if len(sub.Spawned) != 1 || sub.Spawned[0].Refused == nil || sub.Spawned[0].Refused.LimitType != quotas.TreeMaxDepth {
		t.Fatalf("the middle child's spawn: %+v, want refused %s", sub.Spawned, quotas.TreeMaxDepth)
	}
}

// Splitters spawning at once, each under its own claim and transaction, race for a
// tree's last dollars: the tree hands out exactly what it has, never more, and what
// its tasks spend stays within its budget.
func TestConcurrentSpawnsShareTheTreeBudget(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, tasks.LifecycleOptions{}, 4, nil)
	r.agents.Register("parent", parentAgent(t))
	r.agents.Register("leaf", leafAgent())
	r.start()
	// Budgets of a step or two: the tree's steps (ten times the plan's task
	// default) are not what runs out.
	cent, quarter, one, two := 0.01, 0.0025, 1, 2
	leaves := make([]runtime.Spawn, 4)
	for i := range leaves {
		leaves[i] = runtime.Spawn{Agent: "leaf", Input: json.RawMessage(fmt.Sprintf(`{"n":%d,"cost_usd":0.01}`, i)),
			Budget: &runtime.SpawnBudget{MaxCostUSD: &cent, MaxSteps: &one}}
	}
	splitters := make([]runtime.Spawn, 8)
	for i := range splitters {
		in, _ := json.Marshal(map[string]any{"spawn": leaves, "i": i})
		splitters[i] = runtime.Spawn{Agent: "parent", Input: in, Budget: &runtime.SpawnBudget{MaxCostUSD: &quarter, MaxSteps: &two}}
	}
	tenCents := 0.10
	res, err := r.svc.Submit(r.ctx, tasks.SubmitParams{TenantID: tenant, Kid: "k", Agent: "parent",
		Input: json.RawMessage(spawnInput(t, splitters...)), TreeBudget: &quotas.TreeBudgetRequest{MaxCostUSD: &tenCents}})
	if err != nil {
		t.Fatal(err)
	}
	root := res.Task.ID
	r.waitState(root, agentqtype.TaskStateCompleted)
	// The splitters hold $0.02 of the $0.10 while they live, and give it back as
	// they end (they spend nothing); the 32 leaves ask for $0.32 of what is left:
	// 8 of them fit, up to 10 with what ended splitters gave back.
	made, refused := 0, 0
	for _, s := range r.output(root).Children {
		for _, sp := range r.output(uuid.MustParse(s.ID)).Spawned {
			switch {
			case sp.ID != "":
				made++
			case sp.Refused.LimitType == quotas.TreeMaxCostUSD:
				refused++
			default:
				t.Errorf("a leaf refused %+v", sp.Refused)
			}
		}
	}
	tree, err := r.svc.Tree(r.ctx, tenant, tasks.Scope{}, root)
	if err != nil {
		t.Fatal(err)
	}
	if made < 8 || made > 10 || made+refused != 32 || tree.Totals.CostMicroUSD != int64(made)*10_000 || tree.Tasks != 9+made {
		t.Fatalf("%d leaves made, %d refused; the tree spent %d µ$ over %d tasks; want 8 to 10 made of 32, $0.01 each",
			made, refused, tree.Totals.CostMicroUSD, tree.Tasks)
	}
	if tree.Totals.CostMicroUSD > 100_000 {
		t.Fatalf("the $0.10 tree spent %d µ$", tree.Totals.CostMicroUSD)
	}
	// The refusals are one usage.limit_hit, naming the tree.
	var n int
	var data struct {
		LimitType  string `json:"limit_type"`
		RootID     string `json:"root_id"`
		LimitValue string `json:"limit_value"`
	}
	var payload []byte
	err = r.st.Pool().QueryRow(r.ctx, `SELECT count(*) OVER (), payload FROM events WHERE tenant_id = $1 AND type = 'usage.limit_hit'`,
		tenant).Scan(&n, &payload)
	if err == nil {
		var ev struct{ Data json.RawMessage }
		if err = json.Unmarshal(payload, &ev); err == nil {
			err = json.Unmarshal(ev.Data, &data)
		}
	}
	if err != nil || n != 1 || data.LimitType != quotas.TreeMaxCostUSD || data.RootID != root.String() || data.LimitValue != "0.100000" {
		t.Fatalf("%d limit_hit events (%v), the first %+v; want one, %s of tree %s at 0.100000", n, err, data, quotas.TreeMaxCostUSD, root)
	}
}

// Cancelling a root ends its whole tree at once: a child paused at its budget, a
// child parked waiting for its own child, and that grandchild running its step;
// each is killed, parent_ended, and holds nothing after.
func TestCancelEndsTheWholeTree(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, tasks.LifecycleOptions{}, 2, nil)
	r.agents.Register("parent", parentAgent(t))
	r.agents.Register("counter", counter(t))
	var running atomic.Int32
	r.agents.Register("blocker", stepFunc(func(ctx context.Context, _ runtime.StepRequest) (runtime.StepResult, error) {
		running.Add(1)
		<-ctx.Done()
		return runtime.StepResult{}, ctx.Err()
	}))
	r.start()
	cent := 0.01
	root := r.submit("parent", spawnInput(t,
		runtime.Spawn{Agent: "counter", Input: json.RawMessage(`{"steps":3,"cost_usd":0.01}`), Budget: &runtime.SpawnBudget{MaxCostUSD: &cent}},
		runtime.Spawn{Agent: "parent", Input: json.RawMessage(spawnInput(t, runtime.Spawn{Agent: "blocker"}))},
	), nil)
	kids := r.waitChildren(root, 2)
	paused := r.waitState(kids[0], agentqtype.TaskStatePaused)
	mid := r.waitParked(kids[1])
	grand := r.waitChildren(mid.ID, 1)[0]
	r.waitState(grand, agentqtype.TaskStateRunning)
	if paused.Pause.Reason == nil {
		t.Fatal("the paused child has no pause reason")
	}
	if _, err := r.svc.Cancel(r.ctx, tenant, root); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uuid.UUID{kids[0], kids[1], grand} {
		got := r.waitState(id, agentqtype.TaskStateKilled)
		if got.Error == nil || !strings.HasPrefix(*got.Error, "parent_ended") {
			t.Errorf("task %s killed with %v, want parent_ended", id, deref(got.Error))
		}
		r.wantReleased(id)
	}
	r.wantReleased(root)
}

// eventually polls cond until it holds, failing the test after five seconds.
func (r *rig) eventually(cond func() bool, format string, args ...any) {
	r.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			r.t.Fatalf("timed out waiting until "+format+"; log:\n%s", append(args, r.log)...)
		}
	}
}

// waitChildren waits until parent has n children and returns them in spawn order.
func (r *rig) waitChildren(parent uuid.UUID, n int) []uuid.UUID {
	r.t.Helper()
	var ids []uuid.UUID
	r.eventually(func() bool {
		kids, err := r.st.UnscopedChildren(r.ctx, parent)
		if err != nil {
			r.t.Fatal(err)
		}
		ids = ids[:0]
		for _, k := range kids {
			ids = append(ids, k.ID)
		}
		return len(ids) == n
	}, "task %s has %d children", parent, n)
	return ids
}

// waitParked waits until id is queued waiting for its children.
func (r *rig) waitParked(id uuid.UUID) store.Task {
	r.t.Helper()
	var t store.Task
	r.eventually(func() bool {
		t = r.task(id)
		return t.State == agentqtype.TaskStateQueued && t.Wait.Reason != nil && *t.Wait.Reason == string(agentqtype.WaitChildren)
	}, "task %s parks for its children", id)
	return t
}

// A step recorded twice (a retry after its commit's reply was lost) makes its
// children once: the retry returns what the first made.
func TestSpawnIsExactlyOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.agents.Register("parent", parentAgent(t))
	r.agents.Register("leaf", leafAgent())
	var calls atomic.Int32
	flaky := flakyTrees{Trees: r.trees, calls: &calls}
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	w := runtime.NewWorker(r.lc, r.st, r.agents, r.sched, r.q, r.rdb, runtime.WorkerOptions{
		Concurrency: 1, ShutdownTimeout: time.Second, Trees: flaky, Policies: tenants.NewPolicies(plans, 16),
	})
	root := r.submit("parent", spawnInput(t, runtime.Spawn{Agent: "leaf"}, runtime.Spawn{Agent: "leaf", Input: json.RawMessage(`{"n":1}`)}), nil)
	r.deliver(w) // the parent's first step: spawns, retried once, then parks
	if calls.Load() != 2 {
		t.Fatalf("%d spawn calls, want 2 (the first's answer lost)", calls.Load())
	}
	r.deliver(w)
	r.deliver(w) // the two leaves
	r.unparkNext()
	r.deliver(w) // the parent again
	if got := r.task(root); got.State != agentqtype.TaskStateCompleted || got.Children != 2 {
		t.Fatalf("the parent is %s with %d children, want completed with 2", got.State, got.Children)
	}
	if kids, _ := r.st.UnscopedChildren(r.ctx, root); len(kids) != 2 {
		t.Fatalf("%d children written, want 2", len(kids))
	}
}

// flakyTrees loses the answer of its first Spawn after it committed.
type flakyTrees struct {
	runtime.Trees
	calls *atomic.Int32
}

func (f flakyTrees) Spawn(ctx context.Context, p tasks.SpawnParams) (agentqtype.SpawnRecord, error) {
	rec, err := f.Trees.Spawn(ctx, p)
	if f.calls.Add(1) == 1 && err == nil {
		return agentqtype.SpawnRecord{}, errors.New("connection reset after the commit")
	}
	return rec, err
}

// A parent parked for its children through a loss of Redis's data: the recovery
// sweep pushes every queued task again (the parent among them, out of its wait);
// its delivery finds its children live and parks it again, without a step, and the
// last child's end wakes it to read their outputs.
func TestChildrenWaitSurvivesRedisLoss(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	parentSteps := r.countedParentAndLeaf()
	root := r.submit("parent", spawnInput(t, runtime.Spawn{Agent: "leaf", Input: json.RawMessage(`{"n":1}`)},
		runtime.Spawn{Agent: "leaf", Input: json.RawMessage(`{"n":2}`)}), nil)
	r.process() // spawns both, parks
	r.waitParked(root)

	testenv.DeletePrefix(r.ctx, r.rdb, r.keys.Prefix())
	queued, err := r.st.ListTasks(r.ctx, store.ListTasksParams{TenantID: tenant, State: agentqtype.TaskStateQueued, Limit: 10})
	if err != nil || len(queued) != 3 {
		t.Fatalf("%d tasks queued in Postgres (%v), want the parent and its 2 children", len(queued), err)
	}
	for _, q := range queued { // as the recovery sweep does
		if err := r.sched.Enqueue(r.ctx, scheduler.EnqueueParams{TenantID: tenant, TaskID: q.ID, Priority: q.Priority, CreatedAt: q.CreatedAt, Weight: 1}); err != nil {
			t.Fatal(err)
		}
	}
	r.process() // the parent, first in its queue: its children are live, it parks again
	if got := r.waitParked(root); parentSteps.Load() != 1 || got.Usage.Steps != 1 {
		t.Fatalf("the parent ran %d steps (%d recorded) before its children ended, want 1", parentSteps.Load(), got.Usage.Steps)
	}
	r.process()
	r.process() // the children; the last one's end wakes the parent
	r.unparkNext()
	r.process()
	out := r.output(root)
	if got := r.task(root); got.State != agentqtype.TaskStateCompleted || len(out.Children) != 2 {
		t.Fatalf("the parent is %s with %d children read, want completed with 2", got.State, len(out.Children))
	}
	for i, c := range out.Children {
		var v struct{ V int }
		if err := json.Unmarshal(c.Output, &v); err != nil || v.V != 10*(i+1) || c.State != agentqtype.TaskStateCompleted {
			t.Errorf("child %d: %s %s", i, c.State, c.Output)
		}
	}
}

// A root's own steps draw on what its tree has not handed out: once its children
// hold the rest, the root's next step takes its plan's on_limit (pro: pause) at
// tree_max_cost_usd, and the tree never spends past its budget.
func TestRootStepPastItsTreeBudget(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	cent := 0.01
	r.agents.Register("leaf", leafAgent())
	r.agents.Register("spender", stepFunc(func(_ context.Context, req runtime.StepRequest) (runtime.StepResult, error) {
		res := runtime.StepResult{State: json.RawMessage(fmt.Sprintf(`{"n":%d}`, req.Step)), Usage: runtime.StepUsage{CostUSD: 0.01},
			Done: req.Step == 5}
		if req.Step == 1 {
			res.Spawn = []runtime.Spawn{{Agent: "leaf", Input: json.RawMessage(`{"cost_usd":0.01}`), Budget: &runtime.SpawnBudget{MaxCostUSD: &cent}}}
		}
		return res, nil
	}))
	r.start()
	three := 0.03
	res, err := r.svc.Submit(r.ctx, tasks.SubmitParams{TenantID: tenant, Kid: "k", Agent: "spender", Input: json.RawMessage(`{}`),
		TreeBudget: &quotas.TreeBudgetRequest{MaxCostUSD: &three}})
	if err != nil {
		t.Fatal(err)
	}
	got := r.waitState(res.Task.ID, agentqtype.TaskStatePaused)
	if got.Usage.Steps != 2 || got.Pause.Reason == nil || *got.Pause.Reason != quotas.TreeMaxCostUSD {
		t.Fatalf("the root paused after %d steps at %v, want 2 steps, %s", got.Usage.Steps, deref(got.Pause.Reason), quotas.TreeMaxCostUSD)
	}
	kid := r.waitChildren(res.Task.ID, 1)[0]
	r.waitState(kid, agentqtype.TaskStateCompleted)
	tree, err := r.svc.Tree(r.ctx, tenant, tasks.Scope{}, res.Task.ID)
	if err != nil || tree.Totals.CostMicroUSD != 30_000 || tree.Remaining.CostMicro != 0 {
		t.Fatalf("the $0.03 tree spent %d µ$, %d left (%v)", tree.Totals.CostMicroUSD, tree.Remaining.CostMicro, err)
	}
}

// An agent answering the same state and output step after step is going round in
// circles: at the plan's max_repeat_steps (10) in a row its task ends failed,
// loop_detected, whatever its budget still allows.
func TestRepeatedAnswersEndTheTask(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.agents.Register("circle", stepFunc(func(context.Context, runtime.StepRequest) (runtime.StepResult, error) {
		return runtime.StepResult{State: json.RawMessage(`{"plan":"same"}`)}, nil
	}))
	r.start()
	id := r.submit("circle", `{}`, nil)
	got := r.waitState(id, agentqtype.TaskStateFailed)
	if got.Usage.Steps != quotas.DefaultMaxRepeatSteps || !strings.HasPrefix(deref(got.Error), "loop_detected") {
		t.Fatalf("failed after %d steps: %s; want %d steps, loop_detected", got.Usage.Steps, deref(got.Error), quotas.DefaultMaxRepeatSteps)
	}
	r.wantReleased(id)
}

// The built-in sim agent spawns the children its input names and, asked to, waits
// for them and counts those that completed.
func TestSimSpawnsAndWaits(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.start()
	id := r.submit("sim", `{"steps":2,"wait_children":true,"spawn":[{"agent":"sim"},{"agent":"sim","input":{"fail_at_step":1}}]}`, nil)
	got := r.waitState(id, agentqtype.TaskStateCompleted)
	var out struct {
		Done int `json:"children_completed"`
	}
	if err := json.Unmarshal(got.Output, &out); err != nil || out.Done != 1 || got.Children != 2 {
		t.Fatalf("sim's output %s with %d children, want children_completed 1 of 2", got.Output, got.Children)
	}
	if err := r.agents.ValidateTask(r.ctx, "sim", json.RawMessage(`{"spawn":[{"agent":"sim"}]}`)); err == nil {
		t.Fatal("sim took a spawn on a one-step task")
	}
}

// Children queue like submissions: a spawn that would take the tenant's queue past
// its queue_backlog is refused and reported, the others are made.
func TestSpawnsHeldToTheBacklog(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.setOverrides(map[string]quotas.Limit{quotas.QueueBacklog: 2})
	r.agents.Register("parent", parentAgent(t))
	r.agents.Register("leaf", leafAgent())
	r.start()
	root := r.submit("parent", spawnInput(t, runtime.Spawn{Agent: "leaf", Input: json.RawMessage(`{"n":1}`)},
		runtime.Spawn{Agent: "leaf", Input: json.RawMessage(`{"n":2}`)}, runtime.Spawn{Agent: "leaf", Input: json.RawMessage(`{"n":3}`)}), nil)
	r.waitState(root, agentqtype.TaskStateCompleted)
	out := r.output(root)
	if len(out.Spawned) != 3 || out.Spawned[2].Refused == nil || out.Spawned[2].Refused.LimitType != quotas.QueueBacklog ||
		out.Spawned[0].ID == "" || out.Spawned[1].ID == "" || len(out.Children) != 2 {
		t.Fatalf("spawned %+v, %d children; want the third refused %s", out.Spawned, len(out.Children), quotas.QueueBacklog)
	}
}

// A worker that dies right after the commit of a spawning step (its children made,
// its wait kept with the task) leaves the task running with a silent heartbeat; the
// redelivery takes it over, does not run that step again, finds the children live
// and parks; the children run once each, and the parent reads them.
func TestSpawnSurvivesAWorkerKilledAfterItsCommit(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	parentSteps := r.countedParentAndLeaf()
	root := r.submit("parent", `{}`, nil)
	// The dead worker: its delivery, its start, and its first step's record with two
	// spawns and a wait, committed; then nothing more of it.
	delivery := r.take()
	started, _, err := r.lc.Start(r.ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	pro, _ := plans.Plan("pro")
	if _, err := r.trees.Spawn(r.ctx, tasks.SpawnParams{
		Step:   store.RecordStepParams{ID: root, Attempt: started.Attempt, Step: 1, AgentState: json.RawMessage(`{"n":1}`)},
		Parent: started, Wait: true, Budget: pro.Budget, Tree: pro.Tree, Weight: 1, Limits: quotas.NoLimits(),
		Spawns: []tasks.SpawnRequest{{Agent: "leaf", Input: json.RawMessage(`{"n":1}`)}, {Agent: "leaf", Input: json.RawMessage(`{"n":2}`)}},
	}); err != nil {
		t.Fatal(err)
	}
	testfactory.TaskHeartbeatAgo(t, r.st.Pool(), root, time.Minute)
	if err := r.w.ProcessTask(r.ctx, delivery); err != nil { // asynq's redelivery of the same message
		t.Fatal(err)
	}
	if got := r.waitParked(root); got.Attempt != 2 || parentSteps.Load() != 0 {
		t.Fatalf("after the take-over: attempt %d, %d agent steps; want attempt 2, parked without a step", got.Attempt, parentSteps.Load())
	}
	r.process()
	r.process() // the two children
	r.unparkNext()
	r.process()
	out := r.output(root)
	kids, err := r.st.UnscopedChildren(r.ctx, root)
	if err != nil || len(kids) != 2 || len(out.Children) != 2 || parentSteps.Load() != 1 || r.task(root).State != agentqtype.TaskStateCompleted {
		t.Fatalf("%d children written (%v), %d read, %d agent steps, parent %s; want 2, 2, 1, completed", len(kids), err,
			len(out.Children), parentSteps.Load(), r.task(root).State)
	}
}

// A paused child resumes without a session lease of its own: its tree holds its
// root's, so a tenant whose concurrent_sessions the root fills can still resume it.
func TestPausedChildResumesWithoutASession(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, tasks.LifecycleOptions{}, 2, nil)
	r.agents.Register("parent", parentAgent(t))
	r.agents.Register("counter", counter(t))
	r.start()
	cent := 0.01
	root := r.submit("parent", spawnInput(t,
		runtime.Spawn{Agent: "counter", Input: json.RawMessage(`{"steps":3,"cost_usd":0.01}`), Budget: &runtime.SpawnBudget{MaxCostUSD: &cent}},
	), nil)
	kid := r.waitChildren(root, 1)[0]
	r.waitState(kid, agentqtype.TaskStatePaused)
	r.setOverrides(map[string]quotas.Limit{quotas.ConcurrentSessions: 1})
	if _, err := r.svc.Resume(r.ctx, tasks.ResumeParams{TenantID: tenant, ID: kid,
		Budget: &tasks.BudgetRequest{MaxCostUSD: ptr(0.05)}}); err != nil {
		t.Fatalf("resuming the child while its root holds the tenant's one session: %v", err)
	}
	if err := r.rdb.ZScore(r.ctx, r.keys.Sessions(tenant), kid.String()).Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("the resumed child holds a session lease (%v)", err)
	}
	r.waitState(kid, agentqtype.TaskStateCompleted)
	r.waitState(root, agentqtype.TaskStateCompleted)
}

// A spawn while one of the tenant's period quotas is used up is refused with the
// quota's limit_type and makes no child: the child could run no step.
func TestSpawnRefusedByAUsedUpPeriodQuota(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.setOverrides(map[string]quotas.Limit{quotas.AgentStepsDaily: 1}) // the root's first step uses it up
	r.agents.Register("parent", parentAgent(t))
	r.agents.Register("leaf", leafAgent())
	r.start()
	root := r.submit("parent", spawnInput(t, runtime.Spawn{Agent: "leaf", Input: json.RawMessage(`{"n":1}`)}), nil)
	var rec agentqtype.SpawnRecord
	r.eventually(func() bool {
		return json.Unmarshal(r.task(root).Spawned, &rec) == nil && rec.Spawned != nil
	}, "the root's spawning step is recorded")
	if len(rec.Spawned) != 1 || rec.Spawned[0].Refused == nil || rec.Spawned[0].Refused.LimitType != quotas.AgentStepsDaily {
		t.Fatalf("spawned %+v; want it refused %s", rec.Spawned, quotas.AgentStepsDaily)
	}
	if kids, err := r.st.UnscopedChildren(r.ctx, root); err != nil || len(kids) != 0 {
		t.Fatalf("children %v (%v), want none", kids, err)
	}
}

// countedParentAndLeaf registers the parent agent, counting its steps, and the leaf.
func (r *rig) countedParentAndLeaf() *atomic.Int32 {
	var steps atomic.Int32
	parent := parentAgent(r.t)
	r.agents.Register("parent", stepFunc(func(ctx context.Context, req runtime.StepRequest) (runtime.StepResult, error) {
		steps.Add(1)
		return parent(ctx, req)
	}))
	r.agents.Register("leaf", leafAgent())
	return &steps
}
