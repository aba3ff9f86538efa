package web

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/scheduler"
)

// SubmitRequest is the body of POST /v1/tasks.
type SubmitRequest struct {
	Agent          string          `json:"agent"`
	Input          json.RawMessage `json:"input"`
	User           string          `json:"user"`
	Budget         *BudgetRequest  `json:"budget"`
	Priority       *int            `json:"priority"`
	IdempotencyKey string          `json:"idempotency_key"`
}

// BudgetRequest is a task's requested budget; omitted fields take the plan's default.
type BudgetRequest struct {
	MaxSteps      *int     `json:"max_steps"`
	MaxWallclockS *float64 `json:"max_wallclock_s"`
	MaxCostUSD    *float64 `json:"max_cost_usd"`
}

// TaskJSON is the task as the API shows it.
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
	WaitReason *string         `json:"wait_reason"`
	Attempt    int             `json:"attempt"`
	CreatedAt  time.Time       `json:"created_at"`
	StartedAt  *time.Time      `json:"started_at"`
	FinishedAt *time.Time      `json:"finished_at"`
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

func taskJSON(t store.Task) TaskJSON {
	out := TaskJSON{
		ID: t.ID.String(), TenantID: t.TenantID, Agent: t.Agent, State: t.State, Priority: t.Priority,
		Input: rawOrNull(t.Input), Output: rawOrNull(t.Output), Error: t.Error, Budget: rawOrNull(t.Budget),
		Usage:     UsageJSON{Steps: t.Usage.Steps, Tokens: t.Usage.Tokens, CostUSD: float64(t.Usage.CostMicroUSD) / 1e6},
		Attempt:   t.Attempt,
		CreatedAt: t.CreatedAt, StartedAt: t.StartedAt, FinishedAt: t.FinishedAt,
	}
	if t.User != "" {
		u := t.User
		out.User = &u
	}
	return out
}

const maxIdempotencyKey = 255

func (s *Server) submitTask(c echo.Context) error {
	ctx := c.Request().Context()
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
			return apiErr(http.StatusBadRequest, CodeInvalidRequest, "Idempotency-Key header and idempotency_key field differ.")
		}
		idem = h
	}
	if len(idem) > maxIdempotencyKey {
		return apiErr(http.StatusBadRequest, CodeInvalidRequest, "idempotency_key is longer than %d bytes.", maxIdempotencyKey)
	}
	if req.Agent == "" {
		return apiErr(http.StatusBadRequest, CodeInvalidRequest, "Field agent is required.")
	}
	if len(req.User) > 255 {
		return apiErr(http.StatusBadRequest, CodeInvalidRequest, "Field user is longer than 255 bytes.")
	}
	priority := scheduler.DefaultPriority
	if req.Priority != nil {
		priority = *req.Priority
		if priority < scheduler.MinPriority || priority > scheduler.MaxPriority {
			return apiErr(http.StatusBadRequest, CodeInvalidRequest, "Field priority must be between %d and %d.", scheduler.MinPriority, scheduler.MaxPriority)
		}
	}
	input := req.Input
	if len(input) == 0 {
		input = json.RawMessage("{}")
	} else {
		var buf bytes.Buffer
		if err := json.Compact(&buf, input); err != nil {
			return apiErr(http.StatusBadRequest, CodeInvalidJSON, "Field input is not valid JSON.")
		}
		input = buf.Bytes()
	}
	if err := s.Agents.ValidateTask(ctx, req.Agent, input); err != nil {
		if isUnknownAgent(err) {
			return apiErr(http.StatusBadRequest, CodeUnknownAgent, "Unknown agent %q.", req.Agent)
		}
		var ae *APIError
		if errors.As(err, &ae) || !isInputError(err) {
			return err
		}
		return apiErr(http.StatusBadRequest, CodeInvalidRequest, "Invalid input for agent %q: %v.", req.Agent, err)
	}
	// The scope check is decided here but enforced by the admission script, after the
	// key bucket and before anything of the tenant's is touched.
	inScope := (len(key.Agents) == 0 || slices.Contains(key.Agents, req.Agent)) &&
		(len(key.Principals) == 0 || slices.Contains(key.Principals, req.User))
	tenant, err := s.tenant(ctx, key.TenantID)
	if err != nil {
		return err
	}
	if tenant.Status != "active" {
		return apiErr(http.StatusForbidden, CodeTenantSuspended, "Tenant %s is suspended.", tenant.ID)
	}
	pol, err := s.Tenants.Policy(tenant)
	if err != nil {
		return fmt.Errorf("tenant %s: %w", tenant.ID, err)
	}
	budget, err := resolveBudget(pol.Budget, req.Budget)
	if err != nil {
		return err
	}
	budgetJSON, _ := json.Marshal(budget)
	hash := requestHash(req.Agent, canonicalJSON(input), req.User, budgetJSON, priority)
	limits := pol.Limits
	now := time.Now()
	period := quotas.PeriodAt(tenant.CreatedAt, now)

	// Postgres must be able to take the task before any limit is spent on it: a
	// refusal for an unreachable database leaves every bucket as it was. The
	// idempotency lookup, when there is one, is that check.
	if idem != "" && inScope {
		// A replay admits nothing new: it answers with the task the key made.
		prev, err := s.Store.GetTaskByIdempotencyKey(ctx, tenant.ID, idem)
		if err == nil {
			if err := s.spendKey(c, tenant, key.Kid, limits); err != nil {
				return err
			}
			return s.replay(c, prev, hash, idem)
		}
		if !errors.Is(err, store.ErrNotFound) {
			return err
		}
	} else if err := s.Store.Ping(ctx); err != nil {
		return unavailable()
	}
	id, err := uuid.NewV7()
	if err != nil {
		return err
	}
	d, err := s.Admission.Admit(ctx, quotas.AdmitParams{
		Mode: quotas.ModeAdmit, TenantID: tenant.ID, Kid: key.Kid, Agent: req.Agent, User: req.User,
		TaskID: id.String(), InScope: inScope, Limits: limits, Period: period,
		LongRunning: budget.MaxWallclockS > quotas.LongRunningThreshold.Seconds(),
	})
	if err != nil {
		// A call that timed out may still have taken a lease in Redis; nothing will
		// be stored for this id, so give it back once Redis answers.
		s.Admission.ReleaseLater(tenant.ID, id.String())
		return admissionFailure(err)
	}
	setRateHeaders(c.Response().Header(), d, now)
	if d.OutOfScope {
		if !slices.Contains(key.Agents, req.Agent) && len(key.Agents) > 0 {
			return apiErr(http.StatusForbidden, CodeScopeForbidden, "This API key may not run agent %q.", req.Agent)
		}
		return apiErr(http.StatusForbidden, CodeScopeForbidden, "This API key may not act for user %q.", req.User)
	}
	if !d.Allowed {
		return s.refusal(d, tenant)
	}

	task, created, err := s.Store.InsertTask(ctx, store.InsertTaskParams{
		ID: id, TenantID: tenant.ID, Kid: key.Kid, Agent: req.Agent, User: req.User, Input: input,
		Budget: budgetJSON, Priority: priority, IdempotencyKey: idem, RequestHash: hash,
	})
	if err != nil || !created {
		// Not written (or a concurrent duplicate won): give back the lease just taken.
		s.Admission.Release(context.WithoutCancel(ctx), tenant.ID, id.String())
	}
	if err != nil {
		return err
	}
	if !created {
		return s.replay(c, task, hash, idem)
	}
	if d.Degraded {
		// Redis is unreachable: the task stays queued in Postgres, and the recovery
		// sweep pushes it once Redis is back. Trying now would only add latency.
		s.log.Warn("admitted in degraded mode; the task waits in Postgres until Redis is back", "task_id", task.ID)
	} else if err := s.Queue.Enqueue(ctx, scheduler.EnqueueParams{
		TenantID: tenant.ID, TaskID: task.ID, Priority: priority, CreatedAt: task.CreatedAt,
		Weight: pol.Weight, RunningCap: pol.RunningCap,
	}); err != nil {
		// The task is stored as queued; the recovery sweep pushes queued tasks missing
		// from Redis, so the 202 still holds.
		s.log.Error("pushing task to its queue failed; it stays queued in Postgres", "task_id", task.ID, "err", err)
	}
	c.Response().Header().Set(echo.HeaderLocation, "/v1/tasks/"+task.ID.String())
	return c.JSON(http.StatusAccepted, taskJSON(task))
}

// replay answers a resubmission with an idempotency key already used by the tenant.
func (s *Server) replay(c echo.Context, prev store.Task, hash []byte, idem string) error {
	if !bytes.Equal(prev.RequestHash, hash) {
		return apiErr(http.StatusConflict, CodeIdempotencyConflict,
			"Idempotency key %q was already used with a different request.", idem)
	}
	c.Response().Header().Set("Idempotent-Replayed", "true")
	c.Response().Header().Set(echo.HeaderLocation, "/v1/tasks/"+prev.ID.String())
	return c.JSON(http.StatusAccepted, taskJSON(prev))
}

// isInputError tells an agent's rejection of the input from a failure to look the
// agent up (Postgres down), which must not turn into a 400.
func isInputError(err error) bool {
	var v interface{ InvalidInput() bool }
	return errors.As(err, &v) && v.InvalidInput()
}

func isUnknownAgent(err error) bool {
	var u interface{ UnknownAgent() bool }
	return errors.As(err, &u) && u.UnknownAgent()
}

// resolveBudget fills a requested budget from the plan's default and refuses a field
// that is not above 0 (a tenant cannot switch a cap off) or is above the plan's ceiling
// (nor raise it). Every field of the result is set.
func resolveBudget(plan quotas.Budget, req *BudgetRequest) (quotas.TaskBudget, error) {
	b, ceil := plan.Default, plan.Ceiling
	if req == nil {
		return b, nil
	}
	bad := func(field string, max any) error {
		return apiErr(http.StatusBadRequest, CodeInvalidRequest,
			"budget.%s must be above 0 and at most the plan's ceiling of %v; omit it to get the plan's default.", field, max)
	}
	if v := req.MaxSteps; v != nil {
		if *v < 1 || *v > ceil.MaxSteps {
			return b, bad("max_steps", ceil.MaxSteps)
		}
		b.MaxSteps = *v
	}
	if v := req.MaxWallclockS; v != nil {
		if !(*v > 0) || *v > ceil.MaxWallclockS {
			return b, bad("max_wallclock_s", ceil.MaxWallclockS)
		}
		b.MaxWallclockS = *v
	}
	if v := req.MaxCostUSD; v != nil {
		if !(*v > 0) || *v > ceil.MaxCostUSD {
			return b, bad("max_cost_usd", ceil.MaxCostUSD)
		}
		b.MaxCostUSD = *v
	}
	return b, nil
}

// requestHash fingerprints what a submission asks for, so a replay with the same
// idempotency key can be told from a different request.
func requestHash(agent string, input json.RawMessage, user string, budget []byte, priority int) []byte {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(agent), input, []byte(user), budget, []byte(strconv.Itoa(priority))} {
		h.Write([]byte(strconv.Itoa(len(part))))
		h.Write([]byte{0})
		h.Write(part)
	}
	return h.Sum(nil)
}

// canonicalJSON re-encodes a JSON value with object keys sorted, so that two bodies
// that differ only in key order or spacing are the same request.
func canonicalJSON(raw json.RawMessage) []byte {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return raw
	}
	out, err := json.Marshal(v)
	if err != nil {
		return raw
	}
	return out
}

func taskID(c echo.Context) (uuid.UUID, error) {
	id, err := uuid.Parse(c.Param("id"))
	if err != nil {
		return id, apiErr(http.StatusNotFound, CodeNotFound, "No task %q.", c.Param("id"))
	}
	return id, nil
}

func (s *Server) getTask(c echo.Context) error {
	id, err := taskID(c)
	if err != nil {
		return err
	}
	t, err := s.Store.GetTask(c.Request().Context(), store.GetTaskParams{TenantID: keyRecord(c).TenantID, ID: id})
	if errors.Is(err, store.ErrNotFound) {
		return apiErr(http.StatusNotFound, CodeNotFound, "No task %s.", id)
	}
	if err != nil {
		return err
	}
	out := taskJSON(t)
	s.fillWaitReasons(c.Request().Context(), []*TaskJSON{&out})
	return c.JSON(http.StatusOK, out)
}

// fillWaitReasons says why queued tasks wait (one Redis round trip per tenant). A
// failure leaves wait_reason null rather than failing the read.
func (s *Server) fillWaitReasons(ctx context.Context, tasks []*TaskJSON) {
	reasons := map[string]*string{}
	for _, t := range tasks {
		if t.State != store.StateQueued {
			continue
		}
		r, ok := reasons[t.TenantID]
		if !ok {
			if why, err := s.Queue.WaitReason(ctx, t.TenantID); err == nil {
				r = &why
			}
			reasons[t.TenantID] = r
		}
		t.WaitReason = r
	}
}

// TaskList is a page of tasks.
type TaskList struct {
	Tasks      []TaskJSON `json:"tasks"`
	NextCursor *string    `json:"next_cursor"`
}

func (s *Server) listTasks(c echo.Context) error {
	p := store.ListTasksParams{TenantID: keyRecord(c).TenantID, Limit: 50}
	q := c.QueryParams()
	for k := range q {
		switch k {
		case "state", "limit", "cursor":
		default:
			return apiErr(http.StatusBadRequest, CodeInvalidRequest, "Unknown query parameter %q.", k)
		}
	}
	if st := q.Get("state"); st != "" {
		if !slices.Contains(store.TaskStates, st) {
			return apiErr(http.StatusBadRequest, CodeInvalidRequest, "Unknown state %q.", st)
		}
		p.State = st
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 500 {
			return apiErr(http.StatusBadRequest, CodeInvalidRequest, "limit must be between 1 and 500.")
		}
		p.Limit = n
	}
	if cur := q.Get("cursor"); cur != "" {
		id, err := uuid.Parse(cur)
		if err != nil {
			return apiErr(http.StatusBadRequest, CodeInvalidRequest, "Malformed cursor.")
		}
		p.Before = id
	}
	want := p.Limit
	p.Limit++ // one more tells whether there is a next page
	rows, err := s.Store.ListTasks(c.Request().Context(), p)
	if err != nil {
		return err
	}
	out := TaskList{Tasks: make([]TaskJSON, 0, len(rows))}
	if len(rows) > want {
		rows = rows[:want]
		next := rows[len(rows)-1].ID.String()
		out.NextCursor = &next
	}
	ptrs := make([]*TaskJSON, 0, len(rows))
	for _, t := range rows {
		out.Tasks = append(out.Tasks, taskJSON(t))
	}
	for i := range out.Tasks {
		ptrs = append(ptrs, &out.Tasks[i])
	}
	s.fillWaitReasons(c.Request().Context(), ptrs)
	return c.JSON(http.StatusOK, out)
}

func (s *Server) cancelTask(c echo.Context) error {
	ctx := c.Request().Context()
	id, err := taskID(c)
	if err != nil {
		return err
	}
	tenantID := keyRecord(c).TenantID
	t, ok, err := s.Store.FinishTask(ctx, store.FinishTaskParams{
		ID: id, TenantID: tenantID, From: []string{store.StateQueued, store.StateRunning},
		To: store.StateKilled, Error: "cancelled by the tenant",
	})
	if err != nil {
		return err
	}
	if !ok {
		cur, err := s.Store.GetTask(ctx, store.GetTaskParams{TenantID: tenantID, ID: id})
		if errors.Is(err, store.ErrNotFound) {
			return apiErr(http.StatusNotFound, CodeNotFound, "No task %s.", id)
		}
		if err != nil {
			return err
		}
		return apiErr(http.StatusConflict, CodeTaskFinished, "Task %s already ended %s.", id, cur.State)
	}
	// This call won the terminal transition, so it owns the lease release.
	s.Admission.Release(ctx, tenantID, id.String())
	// Queued: take it off the queue. Running: interrupt the step wherever it runs.
	if _, err := s.Queue.Remove(ctx, tenantID, id); err != nil {
		s.log.Warn("removing cancelled task from its queue failed; the worker will skip it", "task_id", id, "err", err)
	}
	ev, _ := json.Marshal(map[string]any{"type": "state", "task_id": id.String(), "state": store.StateKilled,
		"error": "cancelled by the tenant", "time": time.Now().UTC()})
	_ = s.Redis.Publish(ctx, s.Keys.TaskEvents(id.String()), ev).Err()
	if err := s.Redis.Publish(ctx, s.Keys.CancelChannel(), id.String()).Err(); err != nil {
		s.log.Warn("publishing cancel failed; the worker stops at the end of the step", "task_id", id, "err", err)
	}
	return c.JSON(http.StatusOK, taskJSON(t))
}
