package tasks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/scheduler"
)

// SpawnRequest is one child a step asks for: its agent and input, and its budget
// (nil fields: the plan's task default), all within what its tree has left.
type SpawnRequest struct {
	Agent  string
	Input  json.RawMessage
	Budget *BudgetRequest
}

// SpawnParams record a step whose answer spawns children, or waits for them.
type SpawnParams struct {
	// Step is the step's record, under the spawning delivery's claim.
	Step store.RecordStepParams
	// Parent is the spawning task as its delivery claimed it.
	Parent store.Task
	Spawns []SpawnRequest
	// Wait: the parent's next step runs once every child it spawned has ended.
	Wait bool
	// Budget and Tree are the tenant's plan's task and tree budgets; Weight and
	// RunningCap its scheduling parameters, which its queue is kept with.
	Budget     quotas.Budget
	Tree       quotas.TreeBudgets
	Weight     int
	RunningCap int
	// Limits are the tenant's (quotas.NoLimits: none): children queue like
	// submissions, and a spawn past its queue_backlog is refused; a spawn while one of
	// its period quotas (agent_steps_daily, ai_tokens_monthly, usd_monthly) is used up
	// is refused with the quota's limit_type. Period is the tenant's billing period now.
	Limits quotas.Limits
	Period quotas.Period
}

// TreeQueue is what trees need of the scheduler: push a child onto its tenant's
// queue, and wake a parent parked for its children.
type TreeQueue interface {
	Enqueue(ctx context.Context, p scheduler.EnqueueParams, along ...func(redis.Pipeliner)) error
	WakeParked(ctx context.Context, tenantID string, taskID uuid.UUID) (bool, error)
}

// TreesDeps are what task trees need.
type TreesDeps struct {
	Store *store.Store
	Queue TreeQueue
	// Agents judges a spawn's agent and input, as a submission's.
	Agents Agents
	// Quotas reads the tenant's backlog and period quotas for a step's spawns (one
	// admission peek, which takes nothing); nil holds spawns to neither.
	Quotas QuotaPeek
	// Events writes, in the spawning step's transaction, the usage.limit_hit of a
	// spawn a tree's limit refused (outbox.Events); nil writes none.
	Events TreeEvents
	Log    *slog.Logger
}

// QuotaPeek reads a tenant's limits as admission would judge them, taking nothing
// (quotas.ModePeek).
type QuotaPeek interface {
	Admit(ctx context.Context, p quotas.AdmitParams) (quotas.Decision, error)
}

// TreeEvents writes the event of a spawn refused by its tree's budget, on tx.
type TreeEvents interface {
	TreeRefusal(ctx context.Context, tx *store.Store, parent store.Task, stop quotas.Stop) error
}

// Trees makes the children a step spawns and follows a tree's tasks as they end:
// a child's end wakes its parent once none of the parent's children is live, and a
// parent's end cancels its live children (parent_ended), whose own ends cancel
// theirs, so nothing in a tree outlives its root. It is a lifecycle Subscriber that
// writes nothing in the transaction; a task outside any tree costs it one look at
// two of its fields.
//
// A tree's budget is delegated: a child gets its own budget (what its spawn asks
// for, else the plan's task default) capped by what the tree has not handed out, and
// a live child holds that budget until it ends, when it holds what it used. The
// remainder is read under a lock on the root's row, so concurrent spawns in one
// tree are judged one after the other and the tree never hands out more than it has.
type Trees struct {
	d  TreesDeps
	lc *Lifecycle
}

// NewTrees returns the task trees over d. Use names the lifecycle they cancel with.
func NewTrees(d TreesDeps) *Trees {
	if d.Log == nil {
		d.Log = slog.Default()
	}
	return &Trees{d: d}
}

// Use sets the lifecycle the trees record spawns and cancel children with: the one
// they subscribe to.
func (tr *Trees) Use(l *Lifecycle) { tr.lc = l }

// Writes: trees write nothing in a change's transaction.
func (tr *Trees) Writes(ChangeKind) bool { return false }

// InTx does nothing: see Writes.
func (tr *Trees) InTx(context.Context, *store.Store, Change) error { return nil }

// AfterCommit follows an end in a tree: the parent of an ended child is woken once
// none of its children is live, and an ended parent's live children are cancelled.
func (tr *Trees) AfterCommit(ctx context.Context, c Change) {
	if !c.Ends() {
		return
	}
	t := c.Task
	if t.Children > 0 {
		tr.cancelChildren(ctx, t)
	}
	if t.ParentID != nil {
		tr.wakeParent(ctx, *t.ParentID)
	}
}

// cancelChildren ends the live children of t, which ended: killed, parent_ended.
func (tr *Trees) cancelChildren(ctx context.Context, t store.Task) {
	if tr.lc == nil {
		return
	}
	kids, err := tr.d.Store.UnscopedLiveChildrenOf(ctx, t.ID)
	if err != nil {
		tr.d.Log.Warn("reading an ended task's live children failed; they run on", "task_id", t.ID, "err", err)
		return
	}
	for _, k := range kids {
		if _, _, err := tr.lc.Cancel(ctx, CancelParams{TenantID: k.TenantID, ID: k.ID, Reason: agentqtype.ParentEnded(t.State)}); err != nil {
			tr.d.Log.Warn("cancelling a child of an ended task failed", "task_id", k.ID, "parent_id", t.ID, "err", err)
		}
	}
}

// wakeParent makes parent due now when it is parked for its children and none of
// them is live.
func (tr *Trees) wakeParent(ctx context.Context, parent uuid.UUID) {
	w, err := tr.d.Store.UnscopedWaitingParent(ctx, parent, string(agentqtype.WaitChildren))
	if err != nil {
		tr.d.Log.Warn("reading a parent's wait failed; it looks again at its next re-check", "task_id", parent, "err", err)
		return
	}
	if !w.Parked || w.Live > 0 {
		return
	}
	if _, err := tr.d.Queue.WakeParked(ctx, w.TenantID, parent); err != nil {
		tr.d.Log.Warn("waking a parent failed; it looks again at its next re-check", "task_id", parent, "err", err)
	}
}

// WakeIfDone wakes parent, just parked for its children, if none of them is live:
// the last of them may have ended between the park's commit and its place in Redis,
// when its own wake-up found nothing parked.
func (tr *Trees) WakeIfDone(ctx context.Context, parent uuid.UUID) { tr.wakeParent(ctx, parent) }

// Children returns how many of parent's children are live and, when none is, every
// child it spawned, in spawn order.
func (tr *Trees) Children(ctx context.Context, parent uuid.UUID) (live int, children []agentqtype.ChildResult, err error) {
	kids, err := tr.d.Store.UnscopedLiveChildrenOf(ctx, parent)
	if err != nil || len(kids) > 0 {
		return len(kids), nil, err
	}
	got, err := tr.d.Store.UnscopedChildren(ctx, parent)
	if err != nil {
		return 0, nil, err
	}
	children = make([]agentqtype.ChildResult, len(got))
	for i, c := range got {
		children[i] = agentqtype.ChildResult{ID: c.ID.String(), Agent: c.Agent, State: c.State, Output: c.Output, Error: c.Error,
			Usage: agentqtype.ChildUsage{Steps: c.Usage.Steps, Tokens: c.Usage.Tokens, CostUSD: float64(c.Usage.CostMicroUSD) / 1e6}}
	}
	return 0, children, nil
}

// Spawn records a step that spawns (or waits) and makes its children, in one
// transaction: the step's record, each child admitted against its tree's budget and
// written queued, and what the step asked for and got (the SpawnRecord, which the
// parent's next step sees). Exactly once: a step recorded before (a retry) makes no
// child and returns the record it made then. The children then go onto their
// tenant's queue; one that does not (Redis away, the process gone) is queued in
// Postgres, where the recovery sweep finds it.
func (tr *Trees) Spawn(ctx context.Context, p SpawnParams) (agentqtype.SpawnRecord, error) {
	if tr.lc == nil {
		return agentqtype.SpawnRecord{}, errors.New("tasks: trees have no lifecycle")
	}
	judged := tr.judgeAgents(ctx, p)
	rec := agentqtype.SpawnRecord{Step: p.Step.Step, Wait: p.Wait, Spawned: []agentqtype.SpawnOutcome{}}
	var created []store.Task
	err := tr.lc.inTx(ctx, func(cs *changes) error {
		r, recorded, err := cs.tx.UnscopedRecordStep(cs.ctx, p.Step)
		if err != nil {
			return err
		}
		if !recorded {
			raw, err := cs.tx.UnscopedSpawned(cs.ctx, p.Step.ID)
			if err == nil && len(raw) > 0 {
				err = json.Unmarshal(raw, &rec)
			}
			return err
		}
		if err := cs.note(stepChange(r, p.Step.Step)); err != nil {
			return err
		}
		if created, err = tr.makeChildren(cs, p, judged, &rec); err != nil {
			return err
		}
		raw, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		return cs.tx.UnscopedSetSpawned(cs.ctx, p.Step.ID, raw, len(created))
	})
	if err != nil {
		return agentqtype.SpawnRecord{}, err
	}
	for _, c := range created {
		err := tr.d.Queue.Enqueue(ctx, scheduler.EnqueueParams{TenantID: c.TenantID, TaskID: c.ID, Priority: c.Priority,
			CreatedAt: c.CreatedAt, Weight: p.Weight, RunningCap: p.RunningCap})
		if err != nil {
			tr.d.Log.Warn("pushing a spawned task to its queue failed; the recovery sweep pushes it", "task_id", c.ID, "err", err)
		}
	}
	return rec, nil
}

// judgeAgents refuses, before the transaction, every spawn while one of the tenant's
// period quotas is used up, the spawns past its queue_backlog, and those whose agent
// is unknown, refuses their input, or is outside the root key's scopes (nil: allowed).
func (tr *Trees) judgeAgents(ctx context.Context, p SpawnParams) []*agentqtype.SpawnRefusal {
	out := make([]*agentqtype.SpawnRefusal, len(p.Spawns))
	var scopes []string
	if len(p.Spawns) > 0 && p.Parent.Kid != "" {
		if k, err := tr.d.Store.UnscopedGetKey(ctx, p.Parent.Kid); err == nil {
			scopes = k.Scopes.Agents
		}
	}
	quota, queued := tr.tenantRoom(ctx, p)
	for i, s := range p.Spawns {
		if quota != nil {
			out[i] = quota
			continue
		}
		if queued >= 0 && queued+1 > p.Limits.Backlog {
			out[i] = &agentqtype.SpawnRefusal{LimitType: quotas.QueueBacklog,
				Message: fmt.Sprintf("the tenant's backlog holds %d tasks; its queue_backlog is %d", queued, p.Limits.Backlog)}
			continue
		}
		if len(scopes) > 0 && !slices.Contains(scopes, s.Agent) {
			out[i] = &agentqtype.SpawnRefusal{LimitType: agentqtype.SpawnAgentNotAllowed,
				Message: fmt.Sprintf("agent %q is outside the scopes of the key the tree was submitted with", s.Agent)}
			continue
		}
		if tr.d.Agents == nil {
			continue
		}
		if err := tr.d.Agents.ValidateTask(ctx, s.Agent, s.Input); err != nil {
			out[i] = &agentqtype.SpawnRefusal{LimitType: agentqtype.SpawnInvalid, Message: err.Error()}
			continue
		}
		if queued >= 0 {
			queued++ // this one will be queued, unless its tree refuses it
		}
	}
	return out
}

// tenantRoom reads, in one admission peek, what the tenant's limits leave p's spawns:
// the refusal of every spawn when one of its period quotas is used up (nil: none
// is), and its backlog as admission counts it (-1: unbounded, or unread). A period
// quota's own usage.limit_hit is its period's, written when its use reached it: a
// spawn refused by it adds none. An unread peek holds the spawns to neither; each of
// the children's steps is reserved against the quotas in any case.
func (tr *Trees) tenantRoom(ctx context.Context, p SpawnParams) (*agentqtype.SpawnRefusal, int64) {
	l := p.Limits
	if len(p.Spawns) == 0 || tr.d.Quotas == nil || (l.Backlog < 0 && l.StepsDaily < 0 && l.TokensMonthly < 0 && l.USDMonthlyMicro < 0) {
		return nil, -1
	}
	d, err := tr.d.Quotas.Admit(ctx, quotas.AdmitParams{Mode: quotas.ModePeek, TenantID: p.Parent.TenantID, Limits: l, Period: p.Period})
	if err != nil {
		tr.d.Log.Warn("reading the tenant's limits for a spawn failed; the spawns are held to neither its backlog nor its period quotas",
			"task_id", p.Parent.ID, "err", err)
		return nil, -1
	}
	var refusal *agentqtype.SpawnRefusal
	queued := int64(-1)
	for _, sc := range d.Scopes {
		switch {
		case sc.Name == quotas.QueueBacklog && l.Backlog >= 0:
			queued = int64(sc.Used)
		case refusal == nil && slices.Contains(quotas.PeriodQuotas, sc.Name) &&
			(sc.Violated || (sc.Limit >= 0 && sc.Used >= sc.Limit)): // a limit of -1 is off
			used, limit := sc.Used, sc.Limit
			if sc.Name == quotas.USDMonthly {
				used, limit = used/1e6, limit/1e6
			}
			refusal = &agentqtype.SpawnRefusal{LimitType: sc.Name,
				Message: fmt.Sprintf("the tenant's %s is used up (%v of %v)", sc.Name, used, limit)}
		}
	}
	return refusal, queued
}

// makeChildren judges each spawn against the tree (loops, depth, tasks, steps,
// tokens, cost) under the lock on the root's row, and writes the children it admits.
func (tr *Trees) makeChildren(cs *changes, p SpawnParams, judged []*agentqtype.SpawnRefusal, rec *agentqtype.SpawnRecord) ([]store.Task, error) {
	if len(p.Spawns) == 0 {
		return nil, nil
	}
	root := p.Parent.Root()
	use, err := cs.tx.UnscopedLockTree(cs.ctx, root)
	if err != nil {
		return nil, err
	}
	lineage, err := cs.tx.UnscopedLineage(cs.ctx, p.Parent.ID)
	if err != nil {
		return nil, err
	}
	// Canonical once, not once a spawn: an ancestor's input holds its own spawns.
	for i := range lineage {
		lineage[i].Input = canonicalJSON(lineage[i].Input)
	}
	tb := StoredTreeBudget(p.Tree, use.RootBudget)
	var kids []store.InsertChildParams
	hit := map[string]bool{}
	for i, s := range p.Spawns {
		out := agentqtype.SpawnOutcome{Index: i, Refused: judged[i]}
		if out.Refused == nil {
			var child store.InsertChildParams
			var stop *quotas.Stop
			child, out.Refused, stop = admitChild(p, s, tb, &use, lineage)
			switch {
			case out.Refused == nil:
				child.SpawnIndex = i
				kids = append(kids, child)
				out.ID = child.ID.String()
			case stop != nil && !hit[stop.LimitType] && tr.d.Events != nil:
				hit[stop.LimitType] = true
				if err := tr.d.Events.TreeRefusal(cs.ctx, cs.tx, p.Parent, *stop); err != nil {
					return nil, err
				}
			}
		}
		rec.Spawned = append(rec.Spawned, out)
	}
	created, err := cs.tx.UnscopedInsertChildren(cs.ctx, kids)
	if err != nil {
		return nil, err
	}
	for _, c := range created {
		if err := cs.note(Change{Kind: ChangeCreated, Task: c}); err != nil {
			return nil, err
		}
	}
	return created, nil
}

// admitChild judges one spawn against the tree and, admitted, carves the child's
// budget out of what the tree has left (use, updated). A refusal by one of the
// tree budget's limits comes with that limit's value and use (stop).
func admitChild(p SpawnParams, s SpawnRequest, tb quotas.TreeBudget, use *store.TreeUse, lineage []store.AgentInput) (
	_ store.InsertChildParams, _ *agentqtype.SpawnRefusal, stop *quotas.Stop) {
	refuse := func(limit, format string, args ...any) (store.InsertChildParams, *agentqtype.SpawnRefusal, *quotas.Stop) {
		return store.InsertChildParams{}, &agentqtype.SpawnRefusal{LimitType: limit, Message: fmt.Sprintf(format, args...)}, stop
	}
	input := s.Input
	if len(bytes.TrimSpace(input)) == 0 {
		input = json.RawMessage(`{}`)
	}
	canon := canonicalJSON(input)
	for _, a := range lineage { // its inputs canonical already
		if a.Agent == s.Agent && bytes.Equal(a.Input, canon) {
			return refuse(agentqtype.SpawnLoopDetected, "agent %q with this input is already running above it in the tree", s.Agent)
		}
	}
	depth := p.Parent.Depth + 1
	switch {
	case depth > tb.MaxDepth:
		stop = &quotas.Stop{LimitType: quotas.TreeMaxDepth, Limit: int64(tb.MaxDepth), Used: int64(depth)}
		return refuse(quotas.TreeMaxDepth, "the child would be at depth %d; the tree's max_depth is %d", depth, tb.MaxDepth)
	case use.Tasks+1 > tb.MaxTasks:
		stop = &quotas.Stop{LimitType: quotas.TreeMaxTasks, Limit: int64(tb.MaxTasks), Used: int64(use.Tasks)}
		return refuse(quotas.TreeMaxTasks, "the tree holds %d tasks; its max_tasks is %d", use.Tasks, tb.MaxTasks)
	case use.Tokens >= tb.MaxTokens:
		stop = &quotas.Stop{LimitType: quotas.TreeMaxTokens, Limit: tb.MaxTokens, Used: use.Tokens}
		return refuse(quotas.TreeMaxTokens, "the tree used %d tokens; its max_tokens is %d", use.Tokens, tb.MaxTokens)
	}
	b, err := ResolveBudget(p.Budget, s.Budget)
	if err != nil {
		return refuse(agentqtype.SpawnInvalid, "%v", err)
	}
	// Steps are capped by what the tree has left: a task's step count is checked
	// before each step. Money is not: a step's cost is known only after it ran, so a
	// child handed less than it asked for would pass it by its first step, and every
	// child at the tree's edge with it. A child gets the money it asks for, or none.
	leftSteps := int64(tb.MaxSteps) - use.HeldSteps
	leftCost := int64(math.Round(tb.MaxCostUSD*1e6)) - use.HeldCostMicro
	costMicro := int64(math.Round(b.MaxCostUSD * 1e6))
	switch {
	case leftSteps < 1:
		stop = &quotas.Stop{LimitType: quotas.TreeMaxSteps, Limit: int64(tb.MaxSteps), Used: use.HeldSteps}
		return refuse(quotas.TreeMaxSteps, "the tree has no steps left of its max_steps %d", tb.MaxSteps)
	case costMicro > leftCost:
		stop = &quotas.Stop{LimitType: quotas.TreeMaxCostUSD, Limit: int64(math.Round(tb.MaxCostUSD * 1e6)), Used: use.HeldCostMicro}
		return refuse(quotas.TreeMaxCostUSD, "the child's max_cost_usd %v is more than the $%v its tree has left of its max_cost_usd %v",
			b.MaxCostUSD, float64(max(leftCost, 0))/1e6, tb.MaxCostUSD)
	}
	b.MaxSteps = int(min(int64(b.MaxSteps), leftSteps))
	use.Tasks++
	use.HeldSteps += int64(b.MaxSteps)
	use.HeldCostMicro += costMicro
	budget, _ := json.Marshal(b)
	id, err := uuid.NewV7()
	if err != nil {
		return refuse(agentqtype.SpawnInvalid, "no id: %v", err)
	}
	return store.InsertChildParams{
		InsertTaskParams: store.InsertTaskParams{ID: id, TenantID: p.Parent.TenantID, Kid: p.Parent.Kid, Agent: s.Agent,
			User: p.Parent.User, Input: input, Budget: budget, Priority: p.Parent.Priority,
			RequestHash: requestHash(s.Agent, canon, p.Parent.User, budget, p.Parent.Priority, 0)},
		ParentID: p.Parent.ID, RootID: p.Parent.Root(), Depth: depth, SpawnStep: p.Step.Step,
	}, nil, nil
}

// storedBudget is the part of a stored budget trees read: the root's tree budget.
type storedBudget struct {
	Tree *quotas.TreeBudget `json:"tree"`
}

// StoredTreeBudget is the tree budget a root was submitted with (stored in its budget
// under "tree"), else the plan's default.
func StoredTreeBudget(plan quotas.TreeBudgets, raw json.RawMessage) quotas.TreeBudget {
	var sb storedBudget
	if len(raw) > 0 && json.Unmarshal(raw, &sb) == nil && sb.Tree != nil {
		return *sb.Tree
	}
	return plan.Default
}

// MaxTreeNodes bounds the nodes a tree read returns: a tree's max_tasks ceiling in
// the built-in catalogue.
const MaxTreeNodes = 2000

// Tree is a task tree as its tenant reads it: its nodes (those the reading key's
// scopes show), their totals, the root's tree budget and what it has left.
type Tree struct {
	Root  uuid.UUID
	Nodes []store.TreeNode
	// Totals are the shown nodes' usage: tasks, steps, tokens, cost.
	Totals    store.Usage
	Tasks     int
	Budget    quotas.TreeBudget
	Remaining TreeRemaining
	// Truncated: the tree holds more than MaxTreeNodes tasks.
	Truncated bool
}

// TreeRemaining is what a tree has not handed out: the tasks it may still hold,
// and the steps, tokens and money not held by its tasks (a live child holds its
// budget).
type TreeRemaining struct {
	Tasks     int
	Steps     int64
	Tokens    int64
	CostMicro int64
}

// Tree reads the tree of one of the tenant's tasks (the whole tree, from its root)
// for a key of scope sc: a task outside the scope is agentqtype.ErrNotFound, and
// the nodes outside it are left out.
func (s *Service) Tree(ctx context.Context, tenantID string, sc Scope, id uuid.UUID) (Tree, error) {
	t, err := s.StoredIn(ctx, tenantID, sc, id)
	if err != nil {
		return Tree{}, err
	}
	root := t.Root()
	nodes, err := s.d.Store.TaskTree(ctx, store.TaskTreeParams{TenantID: tenantID, Root: root, Limit: MaxTreeNodes + 1})
	if err != nil {
		return Tree{}, err
	}
	use, err := s.d.Store.UnscopedTreeUse(ctx, root)
	if err != nil {
		return Tree{}, err
	}
	tenant, err := s.d.Tenant(ctx, tenantID)
	if err != nil {
		return Tree{}, err
	}
	pol, err := s.d.Tenants.Policy(tenant)
	if err != nil {
		return Tree{}, fmt.Errorf("tenant %s: %w", tenantID, err)
	}
	out := Tree{Root: root, Budget: StoredTreeBudget(pol.Tree, use.RootBudget), Truncated: len(nodes) > MaxTreeNodes}
	if out.Truncated {
		nodes = nodes[:MaxTreeNodes]
	}
	for _, n := range nodes {
		if !sc.Sees(n.Agent, n.User) {
			continue
		}
		out.Nodes = append(out.Nodes, n)
		out.Tasks++
		out.Totals.Steps += n.Usage.Steps
		out.Totals.Tokens += n.Usage.Tokens
		out.Totals.CostMicroUSD += n.Usage.CostMicroUSD
	}
	out.Remaining = remaining(out.Budget, use)
	return out, nil
}

// CancelOrphans cancels up to limit live tasks whose parent has ended (killed,
// parent_ended): the repair of a parent's end whose process died before it
// cancelled its children. It returns the tasks it ended.
func (tr *Trees) CancelOrphans(ctx context.Context, limit int) ([]store.Task, error) {
	orphans, err := tr.d.Store.UnscopedOrphans(ctx, limit)
	if err != nil {
		return nil, err
	}
	var ended []store.Task
	for _, o := range orphans {
		t, ok, err := tr.lc.Cancel(ctx, CancelParams{TenantID: o.TenantID, ID: o.ID, Reason: agentqtype.ParentEnded(o.ParentState)})
		if err != nil {
			return ended, err
		}
		if ok {
			ended = append(ended, t)
		}
	}
	return ended, nil
}

// Left is what the tree rooted at root has not handed out, under its budget (the
// one it was submitted with, else plan's default): what a step of the root may
// still spend.
func (tr *Trees) Left(ctx context.Context, root uuid.UUID, plan quotas.TreeBudgets) (quotas.TreeBudget, TreeRemaining, error) {
	use, err := tr.d.Store.UnscopedTreeUse(ctx, root)
	if err != nil {
		return quotas.TreeBudget{}, TreeRemaining{}, err
	}
	b := StoredTreeBudget(plan, use.RootBudget)
	return b, remaining(b, use), nil
}

// remaining is what a tree of budget b holding use has not handed out.
func remaining(b quotas.TreeBudget, use store.TreeUse) TreeRemaining {
	return TreeRemaining{Tasks: max(b.MaxTasks-use.Tasks, 0), Steps: max(int64(b.MaxSteps)-use.HeldSteps, 0),
		Tokens: max(b.MaxTokens-use.Tokens, 0), CostMicro: max(int64(math.Round(b.MaxCostUSD*1e6))-use.HeldCostMicro, 0)}
}
