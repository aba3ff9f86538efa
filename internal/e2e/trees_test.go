package e2e_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/client"
	"github.com/agentq/agentq/runtime"
)

// treePlanner spawns one "tree-leaf" per word of its input and joins their outputs;
// with "plus", also an agent its key may not run.
type treePlanner struct{}

func (treePlanner) Step(_ context.Context, req runtime.StepRequest) (runtime.StepResult, error) {
	var in struct {
		Words []string `json:"words"`
		Plus  string   `json:"plus"`
	}
	if err := json.Unmarshal(req.Input, &in); err != nil {
		return runtime.StepResult{}, err
	}
	if req.Step == 1 {
		res := runtime.StepResult{State: json.RawMessage(`{"asked":true}`), Wait: runtime.WaitChildren}
		for _, w := range in.Words {
			input, _ := json.Marshal(map[string]string{"w": w})
			res.Spawn = append(res.Spawn, runtime.Spawn{Agent: "tree-leaf", Input: input})
		}
		if in.Plus != "" {
			res.Spawn = append(res.Spawn, runtime.Spawn{Agent: in.Plus})
		}
		return res, nil
	}
	joined := ""
	for _, c := range req.Children {
		var o struct{ W string }
		_ = json.Unmarshal(c.Output, &o)
		joined += o.W
	}
	refused := []string{}
	for _, s := range req.Spawned {
		if s.Refused != nil {
			refused = append(refused, s.Refused.LimitType)
		}
	}
	out, err := json.Marshal(map[string]any{"joined": joined, "refused": refused})
	return runtime.StepResult{Done: true, Output: out, Usage: runtime.StepUsage{Tokens: 1}}, err
}

// treeHold blocks its one step until hold closes.
type treeHold struct{ hold chan struct{} }

func (h treeHold) Step(ctx context.Context, _ runtime.StepRequest) (runtime.StepResult, error) {
	select {
	case <-h.hold:
		return runtime.StepResult{Done: true, Output: json.RawMessage(`{"w":"h"}`)}, nil
	case <-ctx.Done():
		return runtime.StepResult{}, ctx.Err()
	}
}

type treeLeaf struct{}

func (treeLeaf) Step(_ context.Context, req runtime.StepRequest) (runtime.StepResult, error) {
	return runtime.StepResult{Done: true, Output: req.Input, Usage: runtime.StepUsage{Tokens: 2, CostUSD: 0.001}}, nil
}

// Over the API and the client: a planner registered in process spawns under its
// tree budget, within its key's scopes; the tree reads back in one call and as a
// list, each task showing its place, and a child outside the key's scopes is
// refused agent_not_allowed.
func TestTaskTreeOverTheAPI(t *testing.T) {
	t.Parallel()
	agents := runtime.NewRegistry()
	agents.Register("tree-planner", treePlanner{})
	agents.Register("tree-leaf", treeLeaf{})
	hold := treeHold{hold: make(chan struct{})}
	agents.Register("tree-hold", hold)
	h := start(t, func(o *agentq.Options) { o.Agents = agents })
	key := h.tenantWith("trees", "pro", nil, map[string]any{"agents": []string{"tree-planner", "tree-leaf", "tree-hold"}})
	c := client.New(h.base, key)
	ctx := context.Background()
	root, err := c.SubmitTask(ctx, client.SubmitTaskRequest{Agent: "tree-planner",
		Input:      map[string]any{"words": []string{"a", "b", "c"}, "plus": "sim"},
		TreeBudget: &client.TreeBudget{MaxTasks: 10, MaxCostUSD: 5}})
	if err != nil {
		t.Fatal(err)
	}
	if root.RootID != root.ID || root.ParentID != nil || root.Depth != 0 || root.Budget.Tree == nil || root.Budget.Tree.MaxTasks != 10 {
		t.Fatalf("the root: root_id %s, parent %v, depth %d, tree budget %+v", root.RootID, root.ParentID, root.Depth, root.Budget.Tree)
	}
	got := waitState(t, c, root.ID, "completed", 20*time.Second)
	var out struct {
		Joined  string   `json:"joined"`
		Refused []string `json:"refused"`
	}
	if err := json.Unmarshal(got.Output, &out); err != nil || out.Joined != "abc" || len(out.Refused) != 1 || out.Refused[0] != "agent_not_allowed" {
		t.Fatalf("the planner's output %s (%v), want joined abc and sim refused agent_not_allowed", got.Output, err)
	}
	tree, err := c.GetTaskTree(ctx, root.ID)
	if err != nil {
		t.Fatal(err)
	}
	if tree.RootID != root.ID || len(tree.Nodes) != 4 || tree.Totals.Tasks != 4 || tree.Totals.Tokens != 7 || tree.Totals.CostUSD != 0.003 ||
		tree.Budget.MaxTasks != 10 || tree.Remaining.Tasks != 6 || tree.Remaining.CostUSD != 4.997 {
		t.Fatalf("tree: %+v", tree)
	}
	list, err := c.ListTasks(ctx, client.ListTasksParams{RootID: root.ID, Limit: 10})
	if err != nil || len(list.Tasks) != 4 {
		t.Fatalf("the tree's list: %v tasks (%v), want 4", len(list.Tasks), err)
	}
	for _, tk := range list.Tasks {
		if tk.ID == root.ID {
			continue
		}
		if tk.ParentID == nil || *tk.ParentID != root.ID || tk.RootID != root.ID || tk.Depth != 1 || tk.State != "completed" {
			t.Errorf("child %s: parent %v, root %s, depth %d, %s", tk.ID, tk.ParentID, tk.RootID, tk.Depth, tk.State)
		}
		// A child's tree is its root's.
		if sub, err := c.GetTaskTree(ctx, tk.ID); err != nil || sub.RootID != root.ID {
			t.Errorf("the tree of child %s: %+v (%v)", tk.ID, sub, err)
		}
	}
	// A live tree: the usage report shows its root's totals, the operator view lists it.
	live, err := c.SubmitTask(ctx, client.SubmitTaskRequest{Agent: "tree-planner", Input: map[string]any{"words": []string{}, "plus": "tree-hold"}})
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Tasks []struct {
			ID   string `json:"id"`
			Tree *struct {
				Tasks int `json:"tasks"`
				Live  int `json:"live"`
			} `json:"tree"`
		} `json:"tasks"`
	}
	shown := false
	for end := time.Now().Add(10 * time.Second); !shown && time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if st, _ := h.do("GET", "/v1/usage", key, nil, &rep); st != 200 {
			t.Fatalf("usage: %d", st)
		}
		for _, tk := range rep.Tasks {
			shown = shown || (tk.ID == live.ID && tk.Tree != nil && tk.Tree.Tasks == 2 && tk.Tree.Live == 2)
		}
	}
	if !shown {
		t.Fatalf("the usage report never showed the live root's tree of 2: %+v", rep.Tasks)
	}
	trees, err := h.app.Store().UnscopedLiveTrees(ctx, 20)
	if err != nil || len(trees) != 1 || trees[0].Root.String() != live.ID || trees[0].Tasks != 2 || trees[0].Live != 2 {
		t.Fatalf("the operator's live trees: %+v (%v)", trees, err)
	}
	close(hold.hold)
	waitState(t, c, live.ID, "completed", 20*time.Second)
	// Above the plan's ceiling (pro: 200 tasks): a 400 naming the field.
	_, err = c.SubmitTask(ctx, client.SubmitTaskRequest{Agent: "tree-planner", Input: map[string]any{}, TreeBudget: &client.TreeBudget{MaxTasks: 201}})
	if st, code := statusOf(err); st != 400 || code != "INVALID_REQUEST" {
		t.Fatalf("a tree budget over the ceiling: %d %s (%v)", st, code, err)
	}
}
