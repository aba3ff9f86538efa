package store

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// liveStates are the states of a task that has not ended, as SQL.
const liveStates = `('queued', 'running', 'paused')`

// TreeUse is what a task tree holds and has used, read under a lock on its root's
// row, so that concurrent spawns in one tree are judged one after the other.
type TreeUse struct {
	// RootBudget is the root's stored budget (its tree budget under "tree").
	RootBudget json.RawMessage
	// Tasks counts the tree's tasks, its root included.
	Tasks int
	// HeldCostMicro, HeldSteps: what the tree's tasks hold of its budget. A live task
	// other than the root holds its own budget, or what it used past it; an ended
	// task, and the root, what they used.
	HeldCostMicro, HeldSteps int64
	// Tokens the tree's tasks used.
	Tokens int64
}

// UnscopedLockTree locks the row of the tree's root and reads what the tree holds.
// Call it in the transaction that spawns into the tree.
func (s *Store) UnscopedLockTree(ctx context.Context, root uuid.UUID) (TreeUse, error) {
	return s.treeUse(ctx, root, ` FOR UPDATE`)
}

// UnscopedTreeUse reads what the tree rooted at root holds, without a lock.
func (s *Store) UnscopedTreeUse(ctx context.Context, root uuid.UUID) (TreeUse, error) {
	return s.treeUse(ctx, root, ``)
}

func (s *Store) treeUse(ctx context.Context, root uuid.UUID, lock string) (TreeUse, error) {
	var u TreeUse
	err := s.db.QueryRow(ctx, `SELECT budget FROM tasks WHERE id = $1`+lock, root).Scan(&u.RootBudget)
	if err != nil {
		return u, fmt.Errorf("store: tree %s: %w", root, err)
	}
	err = s.db.QueryRow(ctx, `
		SELECT count(*),
			coalesce(sum(CASE WHEN id <> $1 AND state IN `+liveStates+`
				THEN greatest(round((budget->>'max_cost_usd')::numeric * 1000000)::bigint, cost_micro_usd)
				ELSE cost_micro_usd END), 0)::bigint,
			coalesce(sum(CASE WHEN id <> $1 AND state IN `+liveStates+`
				THEN greatest((budget->>'max_steps')::bigint, steps) ELSE steps END), 0)::bigint,
			coalesce(sum(tokens), 0)::bigint
		FROM tasks WHERE id = $1 OR root_id = $1`, root).Scan(&u.Tasks, &u.HeldCostMicro, &u.HeldSteps, &u.Tokens)
	return u, err
}

// AgentInput is a task's agent and input, as loop detection compares them.
type AgentInput struct {
	Agent string
	Input json.RawMessage
}

// UnscopedLineage returns the agent and input of the task id and of each of its
// ancestors, nearest first.
func (s *Store) UnscopedLineage(ctx context.Context, id uuid.UUID) ([]AgentInput, error) {
	rows, err := s.db.Query(ctx, `
		WITH RECURSIVE a AS (
			SELECT id, parent_id, agent, input, 0 AS n FROM tasks WHERE id = $1
			UNION ALL
			SELECT t.id, t.parent_id, t.agent, t.input, a.n + 1 FROM tasks t JOIN a ON t.id = a.parent_id
		)
		SELECT agent, input FROM a ORDER BY n`, id)
	return collect(rows, err, func(row pgx.Row) (AgentInput, error) {
		var a AgentInput
		var in []byte
		err := row.Scan(&a.Agent, &in)
		a.Input = in
		return a, err
	})
}

// InsertChildParams are one child a step spawns: InsertTaskParams (its ID a UUIDv7),
// and its place in the tree.
type InsertChildParams struct {
	InsertTaskParams
	ParentID, RootID uuid.UUID
	Depth            int
	// SpawnStep and SpawnIndex name the spawn: the parent's step and the spawn's
	// index in it. A spawn already made is not made again.
	SpawnStep, SpawnIndex int
}

// UnscopedInsertChildren writes the children of a step as queued tasks, in one
// statement, and returns those it wrote; a spawn already made (the same parent, step
// and index) is skipped.
func (s *Store) UnscopedInsertChildren(ctx context.Context, ps []InsertChildParams) ([]Task, error) {
	if len(ps) == 0 {
		return nil, nil
	}
	n := len(ps)
	ids, parents, roots := make([]uuid.UUID, n), make([]uuid.UUID, n), make([]uuid.UUID, n)
	tenants, kids, agents, users, inputs, budgets := make([]string, n), make([]string, n), make([]string, n), make([]string, n),
		make([]string, n), make([]string, n)
	priorities, depths := make([]int32, n), make([]int32, n)
	steps, indexes := make([]int32, n), make([]int32, n)
	hashes := make([][]byte, n)
	for i, p := range ps {
		ids[i], parents[i], roots[i] = p.ID, p.ParentID, p.RootID
		tenants[i], kids[i], agents[i], users[i], inputs[i], budgets[i] = p.TenantID, p.Kid, p.Agent, p.User, string(p.Input), string(p.Budget)
		priorities[i], depths[i], steps[i], indexes[i] = int32(p.Priority), int32(p.Depth), int32(p.SpawnStep), int32(p.SpawnIndex)
		hashes[i] = p.RequestHash
	}
	rows, err := s.db.Query(ctx, `
		INSERT INTO tasks (id, tenant_id, kid, agent, user_id, input, budget, priority, request_hash,
			parent_id, root_id, depth, spawn_step, spawn_index)
		SELECT id, tenant_id, kid, agent, user_id, input::jsonb, budget::jsonb, priority, request_hash,
			parent_id, root_id, depth, spawn_step, spawn_index
		FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::smallint[], $9::bytea[],
			$10::uuid[], $11::uuid[], $12::smallint[], $13::int[], $14::smallint[])
			AS c(id, tenant_id, kid, agent, user_id, input, budget, priority, request_hash, parent_id, root_id, depth, spawn_step, spawn_index)
		ON CONFLICT (parent_id, spawn_step, spawn_index) WHERE parent_id IS NOT NULL DO NOTHING
		RETURNING `+taskCols,
		ids, tenants, kids, agents, users, inputs, budgets, priorities, hashes, parents, roots, depths, steps, indexes)
	return collect(rows, err, scanTask)
}

// UnscopedSetSpawned stores on task id what its latest spawning step asked for and
// got (spawned) and adds added to its children.
func (s *Store) UnscopedSetSpawned(ctx context.Context, id uuid.UUID, spawned json.RawMessage, added int) error {
	_, err := s.db.Exec(ctx, `UPDATE tasks SET spawned = $2, children = children + $3 WHERE id = $1`, id, []byte(spawned), added)
	return err
}

// ChildResult is a child as its parent's next step sees it.
type ChildResult struct {
	ID     uuid.UUID
	Agent  string
	State  TaskState
	Output json.RawMessage
	Error  *string
	Usage  Usage
}

// UnscopedChildren returns the children of task id, in the order they were spawned.
func (s *Store) UnscopedChildren(ctx context.Context, id uuid.UUID) ([]ChildResult, error) {
	rows, err := s.db.Query(ctx, `
		SELECT id, agent, state, output, error, steps, tokens, cost_micro_usd FROM tasks
		WHERE parent_id = $1 ORDER BY spawn_step, spawn_index`, id)
	return collect(rows, err, func(row pgx.Row) (ChildResult, error) {
		var c ChildResult
		var out []byte
		err := row.Scan(&c.ID, &c.Agent, &c.State, &out, &c.Error, &c.Usage.Steps, &c.Usage.Tokens, &c.Usage.CostMicroUSD)
		c.Output = out
		return c, err
	})
}

// LiveChild is a live child of a task: what a cancel of it needs.
type LiveChild struct {
	ID       uuid.UUID
	TenantID string
}

// UnscopedLiveChildrenOf lists the children of task id that have not ended.
func (s *Store) UnscopedLiveChildrenOf(ctx context.Context, id uuid.UUID) ([]LiveChild, error) {
	rows, err := s.db.Query(ctx, `SELECT id, tenant_id FROM tasks WHERE parent_id = $1 AND state IN `+liveStates, id)
	return collect(rows, err, func(row pgx.Row) (LiveChild, error) {
		var c LiveChild
		return c, row.Scan(&c.ID, &c.TenantID)
	})
}

// WaitingParent is a parent waiting for its children: whether it is parked for them
// and how many of them are still live.
type WaitingParent struct {
	TenantID string
	Parked   bool
	Live     int
}

// UnscopedWaitingParent reads whether task id is parked waiting for its children
// (queued, wait_reason children), and how many of its children are live.
func (s *Store) UnscopedWaitingParent(ctx context.Context, id uuid.UUID, reason string) (WaitingParent, error) {
	var w WaitingParent
	err := s.db.QueryRow(ctx, `
		SELECT p.tenant_id, p.state = 'queued' AND p.wait_reason IS NOT DISTINCT FROM $2,
			(SELECT count(*) FROM tasks c WHERE c.parent_id = p.id AND c.state IN `+liveStates+`)
		FROM tasks p WHERE p.id = $1`, id, reason).Scan(&w.TenantID, &w.Parked, &w.Live)
	return w, err
}

// TreeNode is one task of a tree as GET /v1/tasks/{id}/tree shows it.
type TreeNode struct {
	ID       uuid.UUID
	ParentID *uuid.UUID
	Depth    int
	Agent    string
	User     string
	State    TaskState
	Usage    Usage
}

// TaskTreeParams name a tenant's tree by its root.
type TaskTreeParams struct {
	TenantID string
	Root     uuid.UUID
	Limit    int
}

// TaskTree returns up to Limit tasks of the tenant's tree rooted at p.Root, the root
// first, then by depth and creation.
func (s *Store) TaskTree(ctx context.Context, p TaskTreeParams) ([]TreeNode, error) {
	if p.TenantID == "" {
		return nil, ErrNoTenant
	}
	rows, err := s.db.Query(ctx, `
		SELECT id, parent_id, depth, agent, user_id, state, steps, tokens, cost_micro_usd FROM tasks
		WHERE tenant_id = $1 AND (id = $2 OR root_id = $2)
		ORDER BY depth, id LIMIT $3`, p.TenantID, p.Root, p.Limit)
	return collect(rows, err, func(row pgx.Row) (TreeNode, error) {
		var n TreeNode
		err := row.Scan(&n.ID, &n.ParentID, &n.Depth, &n.Agent, &n.User, &n.State, &n.Usage.Steps, &n.Usage.Tokens,
			&n.Usage.CostMicroUSD)
		return n, err
	})
}

// UnscopedSpawned reads what task id's latest spawning step asked for and got (nil:
// it never spawned).
func (s *Store) UnscopedSpawned(ctx context.Context, id uuid.UUID) (json.RawMessage, error) {
	var b []byte
	err := s.db.QueryRow(ctx, `SELECT spawned FROM tasks WHERE id = $1`, id).Scan(&b)
	return b, err
}

// Orphan is a live task whose parent has ended: a parent's end cancels its live
// children after its commit, and a process that died in between left this one.
type Orphan struct {
	ID, ParentID uuid.UUID
	TenantID     string
	ParentState  TaskState
}

// UnscopedOrphans lists up to limit live tasks whose parent has ended.
func (s *Store) UnscopedOrphans(ctx context.Context, limit int) ([]Orphan, error) {
	rows, err := s.db.Query(ctx, `
		SELECT c.id, c.parent_id, c.tenant_id, p.state FROM tasks c JOIN tasks p ON p.id = c.parent_id
		WHERE c.parent_id IS NOT NULL AND c.state IN `+liveStates+` AND p.state NOT IN `+liveStates+`
		LIMIT $1`, limit)
	return collect(rows, err, func(row pgx.Row) (Orphan, error) {
		var o Orphan
		return o, row.Scan(&o.ID, &o.ParentID, &o.TenantID, &o.ParentState)
	})
}

// TreeTotal is what a tree's tasks hold: how many, how many live, what they spent.
type TreeTotal struct {
	Tasks, Live  int
	CostMicroUSD int64
}

// TreeTotalsParams name some of a tenant's roots.
type TreeTotalsParams struct {
	TenantID string
	Roots    []uuid.UUID
}

// TreeTotals returns, for each of the tenant's roots in p.Roots, its tree's totals.
func (s *Store) TreeTotals(ctx context.Context, p TreeTotalsParams) (map[uuid.UUID]TreeTotal, error) {
	if p.TenantID == "" {
		return nil, ErrNoTenant
	}
	out := map[uuid.UUID]TreeTotal{}
	if len(p.Roots) == 0 {
		return out, nil
	}
	rows, err := s.db.Query(ctx, `
		SELECT coalesce(root_id, id), count(*), count(*) FILTER (WHERE state IN `+liveStates+`), coalesce(sum(cost_micro_usd), 0)::bigint
		FROM tasks WHERE tenant_id = $1 AND (id = ANY($2) OR root_id = ANY($2))
		GROUP BY 1`, p.TenantID, p.Roots)
	type row struct {
		root uuid.UUID
		TreeTotal
	}
	got, err := collect(rows, err, func(r pgx.Row) (row, error) {
		var v row
		return v, r.Scan(&v.root, &v.Tasks, &v.Live, &v.CostMicroUSD)
	})
	for _, v := range got {
		out[v.root] = v.TreeTotal
	}
	return out, err
}

// LiveTree is a tree with a live spawned task, as the operator view lists it.
type LiveTree struct {
	Root      uuid.UUID
	TenantID  string
	Agent     string // the root's
	RootState TaskState
	TreeTotal
}

// UnscopedLiveTrees lists up to limit trees (every tenant's) with a live spawned
// task, oldest root first, each with its totals. It reads the index of live spawned
// tasks: a deployment without trees pays one empty index scan.
func (s *Store) UnscopedLiveTrees(ctx context.Context, limit int) ([]LiveTree, error) {
	rows, err := s.db.Query(ctx, `
		WITH live AS (
			SELECT DISTINCT root_id AS id FROM tasks WHERE root_id IS NOT NULL AND state IN `+liveStates+` ORDER BY 1 LIMIT $1
		)
		SELECT r.id, r.tenant_id, r.agent, r.state,
			1 + (SELECT count(*) FROM tasks t WHERE t.root_id = r.id),
			(r.state IN `+liveStates+`)::int + (SELECT count(*) FROM tasks t WHERE t.root_id = r.id AND t.state IN `+liveStates+`),
			r.cost_micro_usd + (SELECT coalesce(sum(t.cost_micro_usd), 0) FROM tasks t WHERE t.root_id = r.id)::bigint
		FROM live JOIN tasks r ON r.id = live.id ORDER BY r.id`, limit)
	return collect(rows, err, func(row pgx.Row) (LiveTree, error) {
		var t LiveTree
		return t, row.Scan(&t.Root, &t.TenantID, &t.Agent, &t.RootState, &t.Tasks, &t.Live, &t.CostMicroUSD)
	})
}
