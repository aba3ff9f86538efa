package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/quotas"
)

// SubmitRequest is the body of POST /v1/tasks.
type SubmitRequest struct {
	Agent          string          `json:"agent"`
	Input          json.RawMessage `json:"input"`
	User           string          `json:"user"`
	Budget         *BudgetRequest  `json:"budget"`
	Priority       *int            `json:"priority"`
	IdempotencyKey string          `json:"idempotency_key"`
	// StartWithinS is how many seconds the task may wait to start; one no worker
	// started by then ends expired.
	StartWithinS *float64 `json:"start_within_s"`
	// TreeBudget is the budget of the tree the task roots, should it spawn.
	TreeBudget *TreeBudgetRequest `json:"tree_budget"`
}

// TreeBudgetRequest is a root's requested tree budget; omitted fields take the
// plan's tree default.
type TreeBudgetRequest struct {
	MaxTasks   *int     `json:"max_tasks"`
	MaxDepth   *int     `json:"max_depth"`
	MaxSteps   *int     `json:"max_steps"`
	MaxTokens  *int64   `json:"max_tokens"`
	MaxCostUSD *float64 `json:"max_cost_usd"`
}

func (r *TreeBudgetRequest) params() *quotas.TreeBudgetRequest {
	if r == nil {
		return nil
	}
	return &quotas.TreeBudgetRequest{MaxTasks: r.MaxTasks, MaxDepth: r.MaxDepth, MaxSteps: r.MaxSteps, MaxTokens: r.MaxTokens,
		MaxCostUSD: r.MaxCostUSD}
}

// BudgetRequest is a task's requested budget; omitted fields take the plan's default.
type BudgetRequest struct {
	MaxSteps      *int     `json:"max_steps"`
	MaxWallclockS *float64 `json:"max_wallclock_s"`
	MaxCostUSD    *float64 `json:"max_cost_usd"`
}

// TaskJSON is the task as the API shows it: the wire format, whose JSON names and
// nulls the OpenAPI document and clients rely on. client.Task reads the same format
// in the client, which may import only the standard library.
type TaskJSON struct {
	ID         string          `json:"id"`
	TenantID   string          `json:"tenant_id"`
	Agent      string          `json:"agent"`
	User       *string         `json:"user"`
	State      string          `json:"state"`
	Priority   int             `json:"priority"`
	Input      json.RawMessage `json:"input"`
	Output     json.RawMessage `json:"output"`
	Error      *string         `json:"error"`
	Budget     json.RawMessage `json:"budget"`
	Usage      UsageJSON       `json:"usage"`
	WaitReason *WaitReasonJSON `json:"wait_reason"`
	// WaitUntil is when the capacity a parked task waits for is expected (null
	// unless it waits for tokens_per_minute or a pool).
	WaitUntil *time.Time `json:"wait_until"`
	// WaitedS is the time the task spent waiting for token capacity, not charged to
	// its wall-clock budget (waits after throttled answers are charged, and not in it).
	WaitedS float64 `json:"waited_s"`
	// PausedReason is the limit_type that paused a paused task (null otherwise):
	// one of its budget's (task_max_steps, task_max_cost_usd,
	// task_max_wallclock_s) or its tenant's period quotas.
	PausedReason *string `json:"paused_reason"`
	// StartDeadline is when the task expires if it has not started by then (null
	// when it was submitted without start_within_s).
	StartDeadline *time.Time `json:"start_deadline"`
	Attempt       int        `json:"attempt"`
	CreatedAt     time.Time  `json:"created_at"`
	StartedAt     *time.Time `json:"started_at"`
	FinishedAt    *time.Time `json:"finished_at"`
	// Degraded: the task is queued but Redis, which holds where it stands, did not
	// answer within admission's deadline, so wait_reason is null (absent otherwise).
	Degraded bool `json:"degraded,omitempty"`
	// ParentID is the task whose step spawned this one (null for a root), RootID its
	// tree's root (its own id for a root), Depth its distance from the root.
	ParentID *string `json:"parent_id"`
	RootID   string  `json:"root_id"`
	Depth    int     `json:"depth"`
}

// WaitReasonJSON is why a queued task waits and where it stands (see
// tasks.WaitReason): position is null for a task parked for token capacity (out of
// its queue), expected_start null while its tenant's start rate is not measured,
// until null unless it is parked.
type WaitReasonJSON struct {
	Reason        string     `json:"reason"`
	Position      *int64     `json:"position"`
	ExpectedStart *time.Time `json:"expected_start"`
	Until         *time.Time `json:"until"`
}

// waitReasonJSON is r as the API shows it; nil for nil.
func waitReasonJSON(r *tasks.WaitReason) *WaitReasonJSON {
	if r == nil {
		return nil
	}
	out := &WaitReasonJSON{Reason: r.Reason, ExpectedStart: r.ExpectedStart, Until: r.Until}
	if r.Position > 0 {
		out.Position = &r.Position
	}
	return out
}

// UsageJSON is a task's usage.
type UsageJSON struct {
	Steps   int     `json:"steps"`
	Tokens  int64   `json:"tokens"`
	CostUSD float64 `json:"cost_usd"`
}

var jsonNull = json.RawMessage("null")

func rawOrNull(r json.RawMessage) json.RawMessage {
	if len(r) == 0 {
		return jsonNull
	}
	return r
}

// NewTaskJSON is t as the API shows it (the CLI prints the same).
func NewTaskJSON(t tasks.Task) TaskJSON { return taskJSON(t) }

// taskJSON is t as the API shows it, with its wait reason when it has one.
func taskJSON(t tasks.Task) TaskJSON {
	out := TaskJSON{
		ID: t.ID.String(), TenantID: t.TenantID, Agent: t.Agent, State: string(t.State), Priority: t.Priority,
		Input: rawOrNull(t.Input), Output: rawOrNull(t.Output), Error: t.Error, Budget: rawOrNull(t.Budget),
		Usage:     UsageJSON{Steps: t.Usage.Steps, Tokens: t.Usage.Tokens, CostUSD: float64(t.Usage.CostMicroUSD) / 1e6},
		Attempt:   t.Attempt,
		CreatedAt: t.CreatedAt, StartedAt: t.StartedAt, FinishedAt: t.FinishedAt,
		WaitReason: waitReasonJSON(t.WaitReason),
		WaitedS:    float64(t.WaitedMs) / 1000, StartDeadline: t.StartDeadline,
		Degraded: t.Undecorated,
		RootID:   t.Root().String(), Depth: t.Depth,
	}
	if t.ParentID != nil {
		p := t.ParentID.String()
		out.ParentID = &p
	}
	if t.State == agentqtype.TaskStatePaused {
		out.PausedReason = t.Pause.Reason
	}
	if t.State == agentqtype.TaskStateQueued && t.Wait.Reason != nil {
		out.WaitUntil = t.Wait.Until
	}
	if t.User != "" {
		u := t.User
		out.User = &u
	}
	return out
}

const maxIdempotencyKey = tasks.MaxIdempotencyKey

func (r *BudgetRequest) params() *tasks.BudgetRequest {
	if r == nil {
		return nil
	}
	return &tasks.BudgetRequest{MaxSteps: r.MaxSteps, MaxWallclockS: r.MaxWallclockS, MaxCostUSD: r.MaxCostUSD}
}

// TaskError is err of a call about one task as the API answers it (an *APIError when
// the API has a word for it), for the pages that act on tasks as the API does.
func (s *API) TaskError(err error) error { return s.taskErr(err, nil) }

// taskErr turns the task service's errors into the API's; id is the task the call
// is about (nil for a submission or a listing).
func (s *API) taskErr(err error, id *uuid.UUID) error {
	var (
		inv       *agentqtype.InvalidError
		unknown   *agentqtype.UnknownAgentError
		suspended *agentqtype.SuspendedError
		scope     *tasks.ScopeError
		conflict  *agentqtype.IdempotencyConflictError
		refused   *tasks.RefusedError
		admission *tasks.AdmissionError
		finished  *tasks.FinishedError
		notPaused *tasks.NotPausedError
		resume    *tasks.ResumeRefusedError
		room      *tasks.NeedsRoomError
		handOff   *tasks.HandOffError
	)
	switch {
	case errors.As(err, &inv):
		if inv.NotJSON {
			return Errorf(http.StatusBadRequest, CodeInvalidJSON, "%s", inv.Message)
		}
		return Errorf(http.StatusBadRequest, CodeInvalidRequest, "%s", inv.Message)
	case errors.As(err, &unknown):
		return Errorf(http.StatusBadRequest, CodeUnknownAgent, "Unknown agent %q.", unknown.Agent)
	case errors.As(err, &suspended):
		return Errorf(http.StatusForbidden, CodeTenantSuspended, "Tenant %s is suspended.", suspended.TenantID)
	case errors.As(err, &scope):
		return Errorf(http.StatusForbidden, CodeScopeForbidden, "%s", scope.Message)
	case errors.As(err, &conflict):
		return Errorf(http.StatusConflict, CodeIdempotencyConflict,
			"Idempotency key %q was already used with a different request.", conflict.Key)
	case errors.As(err, &refused):
		return s.refusal(refused.Decision, refused.Tenant)
	case errors.As(err, &admission):
		return AdmissionFailure(admission.Err)
	case errors.Is(err, agentqtype.ErrUnavailable):
		return Unavailable()
	case errors.As(err, &notPaused):
		if notPaused.Stale {
			return Errorf(http.StatusConflict, CodeTaskNotPaused, "Task %s was resumed since; a new pause needs a new approval.", notPaused.ID)
		}
		return Errorf(http.StatusConflict, CodeTaskNotPaused, "Task %s is %s, not paused.", notPaused.ID, notPaused.State)
	case errors.As(err, &resume):
		return s.refusal(resumeDecision(resume), resume.Tenant)
	case errors.As(err, &room):
		return needsRoom(room)
	case errors.As(err, &handOff):
		e := Errorf(http.StatusConflict, CodeTaskHandOff, "Task %s was just paused and its worker is still handing it off. Retry in 1 second.", handOff.ID)
		e.Extra = map[string]any{"retry_after_seconds": max(1, int(handOff.RetryAfter().Seconds()))}
		return e
	case errors.As(err, &finished):
		return Errorf(http.StatusConflict, CodeTaskFinished, "Task %s already ended %s.", finished.ID, finished.State)
	case id != nil && errors.Is(err, agentqtype.ErrNotFound):
		// Only for a call about one task: a submission's own lookups (its tenant)
		// answer as they are.
		return Errorf(http.StatusNotFound, CodeNotFound, "No task %s.", *id)
	}
	return err
}

func (s *API) submitTask(c echo.Context) error {
	key := keyRecord(c)
	body, err := readBody(c)
	if err != nil {
		return err
	}
	var req SubmitRequest
	if err := decodeStrict(body, &req, false); err != nil {
		return err
	}
	if err := req.validate(); err != nil {
		return err
	}
	idem := req.IdempotencyKey
	if h := c.Request().Header.Get("Idempotency-Key"); h != "" {
		if idem != "" && idem != h {
			return Errorf(http.StatusBadRequest, CodeInvalidRequest, "Idempotency-Key header and idempotency_key field differ.")
		}
		idem = h
	}
	res, err := s.Tasks.Submit(c.Request().Context(), tasks.SubmitParams{
		TenantID: key.TenantID, Kid: key.Kid, KeyAgents: key.Agents, KeyPrincipals: key.Principals,
		Agent: req.Agent, Input: req.Input, User: req.User, Budget: req.Budget.params(),
		Priority: req.Priority, IdempotencyKey: idem, StartWithinS: req.StartWithinS, TreeBudget: req.TreeBudget.params(),
		Slot: inflightSlot(c),
	})
	if res.SlotReleased {
		c.Set(ctxKeyInflightReleased, true)
	}
	if res.Decision != nil {
		setRateHeaders(c.Response().Header(), *res.Decision, res.At)
	}
	if err != nil {
		return s.taskErr(err, nil)
	}
	if res.Replayed {
		c.Response().Header().Set("Idempotent-Replayed", "true")
	}
	c.Response().Header().Set(echo.HeaderLocation, "/v1/tasks/"+res.Task.ID.String())
	return c.JSON(http.StatusAccepted, taskJSON(res.Task))
}

func taskID(c echo.Context) (uuid.UUID, error) {
	id, err := uuid.Parse(c.Param("id"))
	if err != nil {
		return id, Errorf(http.StatusNotFound, CodeNotFound, "No task %q.", c.Param("id"))
	}
	return id, nil
}

func (s *API) getTask(c echo.Context) error {
	id, err := taskID(c)
	if err != nil {
		return err
	}
	key := keyRecord(c)
	t, err := s.Tasks.GetIn(c.Request().Context(), key.TenantID, keyScope(c), id)
	if err != nil {
		return s.taskErr(err, &id)
	}
	return c.JSON(http.StatusOK, taskJSON(t))
}

// TaskList is a page of tasks.
type TaskList struct {
	Tasks      []TaskJSON `json:"tasks"`
	NextCursor *string    `json:"next_cursor"`
}

func (s *API) listTasks(c echo.Context) error {
	p := tasks.ListParams{TenantID: keyRecord(c).TenantID, Limit: tasks.DefaultListLimit, Scope: keyScope(c)}
	q := c.QueryParams()
	for k := range q {
		switch k {
		case "state", "limit", "cursor", "root_id":
		default:
			return Errorf(http.StatusBadRequest, CodeInvalidRequest, "Unknown query parameter %q.", k)
		}
	}
	if st := q.Get("state"); st != "" {
		if !tasks.IsState(st) {
			return Errorf(http.StatusBadRequest, CodeInvalidRequest, "Unknown state %q.", st)
		}
		p.State = st
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > tasks.MaxListLimit {
			return Errorf(http.StatusBadRequest, CodeInvalidRequest, "limit must be between 1 and %d.", tasks.MaxListLimit)
		}
		p.Limit = n
	}
	if root := q.Get("root_id"); root != "" {
		id, err := uuid.Parse(root)
		if err != nil {
			return Errorf(http.StatusBadRequest, CodeInvalidRequest, "root_id must be a task id.")
		}
		p.RootID = id
	}
	if cur := q.Get("cursor"); cur != "" {
		id, err := uuid.Parse(cur)
		if err != nil {
			return Errorf(http.StatusBadRequest, CodeInvalidRequest, "Malformed cursor.")
		}
		p.Before = id
	}
	page, err := s.Tasks.List(c.Request().Context(), p)
	if err != nil {
		return s.taskErr(err, nil)
	}
	out := TaskList{Tasks: make([]TaskJSON, 0, len(page.Tasks))}
	for _, t := range page.Tasks {
		out.Tasks = append(out.Tasks, taskJSON(t))
	}
	if page.Next != nil {
		next := page.Next.String()
		out.NextCursor = &next
	}
	return c.JSON(http.StatusOK, out)
}

func (s *API) cancelTask(c echo.Context) error {
	id, err := taskID(c)
	if err != nil {
		return err
	}
	t, err := s.Tasks.CancelIn(c.Request().Context(), keyRecord(c).TenantID, keyScope(c), id)
	if err != nil {
		return s.taskErr(err, &id)
	}
	return c.JSON(http.StatusOK, taskJSON(t))
}

// ResumeRequest is the body of POST /v1/tasks/{id}/resume: an optional raise of the
// task's budget, each field at most the plan's ceiling.
type ResumeRequest struct {
	Budget *BudgetRequest `json:"budget"`
}

func (s *API) resumeTask(c echo.Context) error {
	id, err := taskID(c)
	if err != nil {
		return err
	}
	body, err := readBody(c)
	if err != nil {
		return err
	}
	var req ResumeRequest
	if len(body) > 0 {
		if err := decodeStrict(body, &req, false); err != nil {
			return err
		}
	}
	t, err := s.Tasks.Resume(c.Request().Context(), tasks.ResumeParams{
		TenantID: keyRecord(c).TenantID, ID: id, Budget: req.Budget.params(), Scope: keyScope(c)})
	if err != nil {
		return s.taskErr(err, &id)
	}
	return c.JSON(http.StatusOK, taskJSON(s.Tasks.WithWaitReason(c.Request().Context(), t)))
}

// keyScope is what the request's API key may see of its tenant's tasks: the agents
// and principals it was given.
func keyScope(c echo.Context) tasks.Scope {
	k := keyRecord(c)
	return tasks.Scope{Agents: k.Agents, Principals: k.Principals}
}

// resumeDecision is a resume its tenant's sessions refused, as the admission
// decision the refusal body and headers are made from.
func resumeDecision(e *tasks.ResumeRefusedError) quotas.Decision {
	sc := quotas.Scope{Name: e.LimitType, Limit: float64(e.Limit), Used: float64(e.Held), Violated: true, RetryAfter: time.Second}
	return quotas.Decision{Scopes: []quotas.Scope{sc}, Violated: []string{e.LimitType}}
}

// needsRoom is a resume refused for want of room for the task's next step: 409
// RESUME_NEEDS_ROOM with the limit, its value and use, the room the step needs
// (room_needed) and the least value of the limit that gives it (limit_needed), in
// the limit's unit (dollars for money).
func needsRoom(e *tasks.NeedsRoomError) *APIError {
	sf := e.Shortfall
	var how string
	if e.Budget() {
		how = fmt.Sprintf("Resume with budget.%s of at least %g.", quotas.Field(sf.LimitType), quotas.AmountValue(sf.LimitType, sf.AtLeast))
	} else {
		how = "It resumes by itself once the quota has room (a new period, or a raise of the tenant's limit)."
	}
	ae := Errorf(http.StatusConflict, CodeResumeNeedsRoom, "Task %s cannot run its next step under %s. %s", e.ID, sf.Explain(), how)
	ae.Extra = map[string]any{
		"limit_type":    sf.LimitType,
		"limit_value":   quotas.AmountValue(sf.LimitType, sf.Limit),
		"current_usage": quotas.AmountValue(sf.LimitType, sf.Used),
		"room_needed":   quotas.AmountValue(sf.LimitType, sf.Need),
		"limit_needed":  quotas.AmountValue(sf.LimitType, sf.AtLeast),
	}
	return ae
}

// TreeJSON is a task tree as GET /v1/tasks/{id}/tree shows it.
type TreeJSON struct {
	RootID    string         `json:"root_id"`
	Nodes     []TreeNodeJSON `json:"nodes"`
	Totals    TreeTotalsJSON `json:"totals"`
	Budget    TreeBudgetJSON `json:"budget"`
	Remaining TreeTotalsJSON `json:"remaining"`
	Truncated bool           `json:"truncated,omitempty"`
}

// TreeNodeJSON is one task of a tree.
type TreeNodeJSON struct {
	ID       string    `json:"id"`
	ParentID *string   `json:"parent_id"`
	Depth    int       `json:"depth"`
	Agent    string    `json:"agent"`
	State    string    `json:"state"`
	Usage    UsageJSON `json:"usage"`
}

// TreeTotalsJSON is what a tree's tasks used, or what it has left.
type TreeTotalsJSON struct {
	Tasks   int     `json:"tasks"`
	Steps   int64   `json:"steps"`
	Tokens  int64   `json:"tokens"`
	CostUSD float64 `json:"cost_usd"`
}

// TreeBudgetJSON is a tree's budget.
type TreeBudgetJSON struct {
	MaxTasks   int     `json:"max_tasks"`
	MaxDepth   int     `json:"max_depth"`
	MaxSteps   int     `json:"max_steps"`
	MaxTokens  int64   `json:"max_tokens"`
	MaxCostUSD float64 `json:"max_cost_usd"`
}

func (s *API) getTaskTree(c echo.Context) error {
	id, err := taskID(c)
	if err != nil {
		return err
	}
	key := keyRecord(c)
	tr, err := s.Tasks.Tree(c.Request().Context(), key.TenantID, keyScope(c), id)
	if err != nil {
		return s.taskErr(err, &id)
	}
	return c.JSON(http.StatusOK, NewTreeJSON(tr))
}

// NewTreeJSON is tr as the API shows it (the CLI prints the same).
func NewTreeJSON(tr tasks.Tree) TreeJSON {
	b, r := tr.Budget, tr.Remaining
	out := TreeJSON{RootID: tr.Root.String(), Nodes: make([]TreeNodeJSON, 0, len(tr.Nodes)), Truncated: tr.Truncated,
		Totals: TreeTotalsJSON{Tasks: tr.Tasks, Steps: int64(tr.Totals.Steps), Tokens: tr.Totals.Tokens,
			CostUSD: float64(tr.Totals.CostMicroUSD) / 1e6},
		Budget:    TreeBudgetJSON{MaxTasks: b.MaxTasks, MaxDepth: b.MaxDepth, MaxSteps: b.MaxSteps, MaxTokens: b.MaxTokens, MaxCostUSD: b.MaxCostUSD},
		Remaining: TreeTotalsJSON{Tasks: r.Tasks, Steps: r.Steps, Tokens: r.Tokens, CostUSD: float64(r.CostMicro) / 1e6},
	}
	for _, n := range tr.Nodes {
		node := TreeNodeJSON{ID: n.ID.String(), Depth: n.Depth, Agent: n.Agent, State: string(n.State),
			Usage: UsageJSON{Steps: n.Usage.Steps, Tokens: n.Usage.Tokens, CostUSD: float64(n.Usage.CostMicroUSD) / 1e6}}
		if n.ParentID != nil {
			p := n.ParentID.String()
			node.ParentID = &p
		}
		out.Nodes = append(out.Nodes, node)
	}
	return out
}
