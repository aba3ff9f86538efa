package client

import (
	"context"
	"net/http"
	"net/url"
)

// TreeBudget is a task tree's budget: what its root and every task spawned under it
// may use together. In a request, zero fields take the plan's tree default (a
// max_depth of 0 cannot be asked for here: send it over HTTP).
type TreeBudget struct {
	MaxTasks   int     `json:"max_tasks,omitempty"`
	MaxDepth   int     `json:"max_depth,omitempty"`
	MaxSteps   int     `json:"max_steps,omitempty"`
	MaxTokens  int64   `json:"max_tokens,omitempty"`
	MaxCostUSD float64 `json:"max_cost_usd,omitempty"`
}

// TreeNode is one task of a tree.
type TreeNode struct {
	ID       string  `json:"id"`
	ParentID *string `json:"parent_id"`
	Depth    int     `json:"depth"`
	Agent    string  `json:"agent"`
	State    string  `json:"state"`
	Usage    Usage   `json:"usage"`
}

// TreeTotals is what a tree's tasks used together, or what it has not handed out.
type TreeTotals struct {
	Tasks   int     `json:"tasks"`
	Steps   int64   `json:"steps"`
	Tokens  int64   `json:"tokens"`
	CostUSD float64 `json:"cost_usd"`
}

// TaskTree is a task tree as GET /v1/tasks/{id}/tree shows it: its tasks (those the
// key's scopes show), their totals, the root's tree budget and what is left of it.
type TaskTree struct {
	RootID    string     `json:"root_id"`
	Nodes     []TreeNode `json:"nodes"`
	Totals    TreeTotals `json:"totals"`
	Budget    TreeBudget `json:"budget"`
	Remaining TreeTotals `json:"remaining"`
	Truncated bool       `json:"truncated"`
}

// GetTaskTree returns the whole tree the task belongs to, from its root.
func (c *Client) GetTaskTree(ctx context.Context, id string) (*TaskTree, error) {
	var t TaskTree
	if err := c.t.do(ctx, http.MethodGet, "/v1/tasks/"+url.PathEscape(id)+"/tree", nil, nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}
