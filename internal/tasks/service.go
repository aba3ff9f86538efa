package tasks

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/telemetry"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
	"github.com/agentq/agentq/scheduler"
)

// ErrNoTenant is returned for a call without a tenant. A task the tenant does not
// have is agentqtype.ErrNotFound; a submission Postgres cannot take is
// agentqtype.ErrUnavailable, before any limit is spent on it. Match them with
// errors.Is.
var ErrNoTenant = errors.New("tasks: no tenant given")

// Limits of a submission and of a listing.
const (
	MaxIdempotencyKey = 255
	MaxUser           = 255
	DefaultListLimit  = 50
	MaxListLimit      = 500
	// MaxStartWithin bounds a task's start deadline: a week, the longest a task
	// waits in its queue before the queue's keys may expire.
	MaxStartWithin = 7 * 24 * time.Hour
)

// invalid is a refused submission field: agent, user, priority, input,
// idempotency_key, budget or start_within_s.
func invalid(field, format string, args ...any) *agentqtype.InvalidError {
	return agentqtype.Invalid(field, format, args...)
}

// ScopeError is a submission outside the key's scopes. Message is meant for the
// caller.
type ScopeError struct{ Message string }

func (e *ScopeError) Error() string { return e.Message }

// RefusedError is a submission a limit refused: the *quotas.LimitError it unwraps
// to says which, Tenant is the tenant it judged (the HTTP answer names its plan).
type RefusedError struct {
	quotas.LimitError
	Tenant tenants.Tenant
}

// Unwrap gives the refusal the Go library returns.
func (e *RefusedError) Unwrap() error { return &e.LimitError }

// AdmissionError is a failure to check the limits at all (Redis unreachable, the
// call cancelled).
type AdmissionError struct{ Err error }

func (e *AdmissionError) Error() string { return "admission: " + e.Err.Error() }
func (e *AdmissionError) Unwrap() error { return e.Err }

// FinishedError is a cancel of a task that already ended; State is how it ended.
// The Go library answers it with its own agentq.TaskEndedError.
type FinishedError struct {
	ID    uuid.UUID
	State string
}

// Error says how the task ended.
func (e *FinishedError) Error() string { return fmt.Sprintf("task %s already ended %s", e.ID, e.State) }

// Queue is what the service needs of the scheduler.
type Queue interface {
	Enqueue(ctx context.Context, p scheduler.EnqueueParams, along ...func(redis.Pipeliner)) error
	Remove(ctx context.Context, tenantID string, taskID uuid.UUID) (bool, error)
	Standing(ctx context.Context, tenantID string, taskIDs []string) (scheduler.Standing, error)
}

// Agents validates a task's input for its agent. An *agentqtype.UnknownAgentError is
// an unknown agent, an *agentqtype.InvalidError a rejected input; any other error is
// a failure to judge and is returned as it is.
type Agents interface {
	ValidateTask(ctx context.Context, agent string, input json.RawMessage) error
}

// Deps are a Service's collaborators.
type Deps struct {
	Store     *store.Store
	Tenants   *tenants.Service
	Admission *admission.Guard
	Queue     Queue
	Agents    Agents
	Redis     redis.UniversalClient
	Keys      rkeys.Keys
	// Tenant looks a tenant up (the API passes its cache); nil: Store.GetTenant.
	Tenant func(ctx context.Context, id string) (tenants.Tenant, error)
	// Lifecycle makes the submission's and the cancel's state changes, and its
	// subscribers do what follows them (Ends: a cancel's lease release, queue
	// removal, pool place, messages); nil: one over Store whose only subscriber is an
	// Ends over Admission's quotas, Queue, Redis and Keys (no model pools).
	Lifecycle *Lifecycle
	// Archetype is where the service logs and traces each submission's admission
	// (agentq.admission); nil: the defaults.
	Archetype *baseservice.Archetype
}

// PoolPlaces is the part of the quotas a task's end uses: a task that ended while it
// waited for a model pool leaves the pool's line with it (capacity.Pools.LeavePool).
type PoolPlaces interface {
	LeavePool(ctx context.Context, pool, tenant string, due time.Time) (bool, error)
}

// Service submits, reads, lists and cancels tasks, always for one tenant.
type Service struct {
	d      Deps
	log    *slog.Logger
	tracer trace.Tracer
	pgOK   atomic.Int64 // when Postgres last answered (unix ns), 0 after a failure
}

// New returns a Service over d.
func New(d Deps) *Service {
	arch := d.Archetype.Defaults()
	s := &Service{d: d, log: arch.Logger}
	if s.d.Tenant == nil {
		s.d.Tenant = d.Store.GetTenant
	}
	if s.d.Lifecycle == nil {
		o := LifecycleOptions{Archetype: d.Archetype}
		if d.Admission != nil {
			o.Subscribers = []Subscriber{NewEnds(EndsDeps{Leases: d.Admission.Quotas(), Queue: d.Queue, Redis: d.Redis, Keys: d.Keys,
				Log: arch.Logger})}
		}
		s.d.Lifecycle = NewLifecycle(d.Store, o)
	}
	s.tracer = arch.Tracer("github.com/agentq/agentq/internal/tasks")
	return s
}

// BudgetRequest is a task's requested budget; nil fields take the plan's default.
type BudgetRequest = quotas.BudgetRequest

// SubmitParams is one submission by an API key.
type SubmitParams struct {
	TenantID string
	Kid      string
	// The key's scopes: empty allows every agent, every user.
	KeyAgents, KeyPrincipals []string

	Agent          string
	Input          json.RawMessage // empty: {}
	User           string
	Budget         *BudgetRequest
	Priority       *int
	IdempotencyKey string
	// StartWithinS, when set, is how many seconds the task may wait to start (above
	// 0, at most MaxStartWithin): one no worker started by then ends expired.
	StartWithinS *float64
	// TreeBudget, when set, is the budget of the tree the task roots (what it and
	// every task spawned under it may use together); nil fields, and a task
	// without one, take the plan's tree default.
	TreeBudget *quotas.TreeBudgetRequest
	// Slot is the request's inflight_requests lease, if it holds one: a submission that
	// pushes its task gives it back in the push's round trip (Submission.SlotReleased).
	Slot quotas.InflightSlot
}

// Submission is the outcome of Submit. Decision is the admission decision when the
// limits were checked, also when Submit then returns an error (a refusal, a scope,
// a conflict), so that the caller can report the limits' state; At is when.
type Submission struct {
	Task     Task
	Replayed bool // an earlier submission with the same idempotency key
	Decision *quotas.Decision
	At       time.Time
	// SlotReleased is whether SubmitParams.Slot was given back (or its release queued
	// for a retry): the caller must not release it again.
	SlotReleased bool
}

// Submit validates a submission, resolves its budget, answers a replay of an
// idempotency key, admits it against the limits, stores and queues it. The checks
// run in that order: a submission refused by validation or its budget spends no
// limit, Postgres is checked before any limit is spent, and a replay spends only
// the key's bucket.
func (s *Service) Submit(ctx context.Context, p SubmitParams) (Submission, error) {
	var res Submission
	sub, err := s.validate(ctx, p)
	if err != nil {
		return res, err
	}
	if err := s.resolveBudget(ctx, &sub); err != nil {
		return res, err
	}
	now := time.Now()
	// Postgres must be able to take the task before any limit is spent on it: a
	// refusal for an unreachable database leaves every bucket as it was. The
	// idempotency lookup, when there is one, is that check.
	if sub.IdempotencyKey != "" && sub.inScope {
		if replayed, done, err := s.answerReplay(ctx, sub); done {
			return replayed, err
		}
	} else if err := s.checkPostgres(ctx); err != nil {
		if !errors.Is(err, agentqtype.ErrUnavailable) {
			err = fmt.Errorf("%w: %w", agentqtype.ErrUnavailable, err)
		}
		return res, fmt.Errorf("tasks: the database cannot take the task: %w", err)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return res, err
	}
	d, err := s.admit(ctx, sub, id, now)
	if err != nil {
		return res, err
	}
	res.Decision, res.At = &d, now
	if err := refusal(sub, d); err != nil {
		return res, err
	}
	task, created, err := s.insert(ctx, sub, id)
	if err != nil {
		return res, err
	}
	if !created {
		return replay(res, task, sub.hash, sub.IdempotencyKey)
	}
	res.SlotReleased = s.enqueue(ctx, sub, task, d.Degraded)
	res.Task = Task{Task: task}
	return res, nil
}

// submission is a submission Submit has validated, and then its tenant's policy and
// its resolved budget.
type submission struct {
	SubmitParams
	input    json.RawMessage // compacted
	priority int
	// startWithin is StartWithinS as a duration, 0 for none.
	startWithin time.Duration
	// inScope is whether the key's scopes allow the agent and the user.
	inScope bool

	tenant     tenants.Tenant
	pol        tenants.Policy
	budget     quotas.TaskBudget
	budgetJSON []byte
	hash       []byte // of the request, to tell a replay from a conflict
}

// validate checks a submission's fields and its input against the agent's schema;
// nothing is read from Postgres nor spent.
func (s *Service) validate(ctx context.Context, p SubmitParams) (submission, error) {
	sub := submission{SubmitParams: p, priority: scheduler.DefaultPriority}
	if p.TenantID == "" {
		return sub, ErrNoTenant
	}
	if len(p.IdempotencyKey) > MaxIdempotencyKey {
		return sub, invalid("idempotency_key", "idempotency_key is longer than %d bytes.", MaxIdempotencyKey)
	}
	if p.Agent == "" {
		return sub, invalid("agent", "Field agent is required.")
	}
	if len(p.User) > MaxUser {
		return sub, invalid("user", "Field user is longer than %d bytes.", MaxUser)
	}
	if p.Priority != nil {
		sub.priority = *p.Priority
		if sub.priority < scheduler.MinPriority || sub.priority > scheduler.MaxPriority {
			return sub, invalid("priority", "Field priority must be between %d and %d.", scheduler.MinPriority, scheduler.MaxPriority)
		}
	}
	if p.StartWithinS != nil {
		v := *p.StartWithinS
		if !(v > 0) || v > MaxStartWithin.Seconds() {
			return sub, invalid("start_within_s", "Field start_within_s must be above 0 and at most %d seconds (7 days).", int(MaxStartWithin.Seconds()))
		}
		// Stored in milliseconds: a positive value never rounds down to no deadline.
		sub.startWithin = max(time.Duration(math.Ceil(v*1000))*time.Millisecond, time.Millisecond)
	}
	sub.input = p.Input
	if len(sub.input) == 0 {
		sub.input = json.RawMessage("{}")
	} else {
		var buf bytes.Buffer
		if err := json.Compact(&buf, sub.input); err != nil {
			e := invalid("input", "Field input is not valid JSON.")
			e.NotJSON = true
			return sub, e
		}
		sub.input = buf.Bytes()
	}
	if err := s.d.Agents.ValidateTask(ctx, p.Agent, sub.input); err != nil {
		var unknown *agentqtype.UnknownAgentError
		var inv *agentqtype.InvalidError
		switch {
		case errors.As(err, &unknown):
			return sub, &agentqtype.UnknownAgentError{Agent: p.Agent}
		case errors.As(err, &inv):
			return sub, invalid("input", "Invalid input for agent %q: %s.", p.Agent, inv.Message)
		}
		// A failure to look the agent up (Postgres down) is not the caller's input.
		return sub, err
	}
	// The scope check is decided here but enforced by the admission script, after the
	// key bucket and before anything of the tenant's is touched.
	sub.inScope = (len(p.KeyAgents) == 0 || slices.Contains(p.KeyAgents, p.Agent)) &&
		(len(p.KeyPrincipals) == 0 || slices.Contains(p.KeyPrincipals, p.User))
	return sub, nil
}

// resolveBudget looks the tenant up, refuses a suspended one, and resolves the
// submission's budget under the tenant's plan.
func (s *Service) resolveBudget(ctx context.Context, sub *submission) error {
	tenant, err := s.d.Tenant(ctx, sub.TenantID)
	if err != nil {
		return err
	}
	if tenant.Status != "active" {
		return &agentqtype.SuspendedError{TenantID: tenant.ID}
	}
	pol, err := s.d.Tenants.Policy(tenant)
	if err != nil {
		return fmt.Errorf("tenant %s: %w", tenant.ID, err)
	}
	budget, err := ResolveBudget(pol.Budget, sub.Budget)
	if err != nil {
		return err
	}
	sub.tenant, sub.pol, sub.budget = tenant, pol, budget
	sub.budgetJSON, _ = json.Marshal(budget)
	if sub.TreeBudget != nil {
		tree, field, ceiling := pol.Tree.ResolveTree(sub.TreeBudget)
		if field != "" {
			return invalid("tree_budget", "tree_budget.%s must be above 0 (max_depth: at least 0) and at most the plan's ceiling of %v; omit it to get the plan's default.",
				field, ceiling)
		}
		// Kept with the root's budget, where its tree's spawns read it.
		sub.budgetJSON, _ = json.Marshal(struct {
			quotas.TaskBudget
			Tree quotas.TreeBudget `json:"tree"`
		}{budget, tree})
	}
	sub.hash = requestHash(sub.Agent, canonicalJSON(sub.input), sub.User, sub.budgetJSON, sub.priority, sub.startWithin)
	return nil
}

// answerReplay answers a submission whose idempotency key already made a task: done
// is true when it did (res and err are Submit's answer). A replay admits nothing
// new: it answers with the task the key made, and spends only the key's bucket.
func (s *Service) answerReplay(ctx context.Context, sub submission) (res Submission, done bool, err error) {
	prev, err := s.d.Store.GetTaskByIdempotencyKey(ctx, store.GetTaskByIdempotencyKeyParams{TenantID: sub.tenant.ID, Key: sub.IdempotencyKey})
	if errors.Is(err, agentqtype.ErrNotFound) {
		return res, false, nil
	}
	if err != nil {
		return res, true, err
	}
	at := time.Now()
	d, err := s.d.Admission.Admit(ctx, quotas.AdmitParams{
		Mode: quotas.ModeKey, TenantID: sub.tenant.ID, Kid: sub.Kid, Limits: sub.pol.Limits, Period: sub.tenant.Anchor().PeriodAt(at),
	})
	if err != nil {
		return res, true, &AdmissionError{Err: err}
	}
	res.Decision, res.At = &d, at
	if !d.Allowed {
		return res, true, &RefusedError{LimitError: quotas.LimitError{Decision: d}, Tenant: sub.tenant}
	}
	res, err = replay(res, prev, sub.hash, sub.IdempotencyKey)
	return res, true, err
}

// admit runs the admission script for task id in the billing period of now.
func (s *Service) admit(ctx context.Context, sub submission, id uuid.UUID, now time.Time) (quotas.Decision, error) {
	actx, span := s.tracer.Start(ctx, "agentq.admission")
	if span.IsRecording() { // attributes built for a dropped span are allocations thrown away
		span.SetAttributes(attribute.String("agentq.tenant_id", sub.tenant.ID), attribute.String("agentq.task_id", id.String()))
	}
	d, err := s.d.Admission.Admit(actx, quotas.AdmitParams{
		Mode: quotas.ModeAdmit, TenantID: sub.tenant.ID, Kid: sub.Kid, Agent: sub.Agent, User: sub.User,
		TaskID: id.String(), InScope: sub.inScope, Limits: sub.pol.Limits, Period: sub.tenant.Anchor().PeriodAt(now),
		LongRunning: sub.budget.MaxWallclockS > quotas.LongRunningThreshold.Seconds(),
	})
	endAdmissionSpan(span, d, err)
	if err != nil {
		// A call that timed out may still have taken a lease in Redis: the guard
		// already queued its release (nothing will be stored for this id).
		return d, &AdmissionError{Err: err}
	}
	return d, nil
}

// refusal is the error for an admission decision that does not let the submission
// through: out of the key's scope, or refused by a limit; nil when it is allowed.
func refusal(sub submission, d quotas.Decision) error {
	if d.OutOfScope {
		if !slices.Contains(sub.KeyAgents, sub.Agent) && len(sub.KeyAgents) > 0 {
			return &ScopeError{Message: fmt.Sprintf("This API key may not run agent %q.", sub.Agent)}
		}
		return &ScopeError{Message: fmt.Sprintf("This API key may not act for user %q.", sub.User)}
	}
	if !d.Allowed {
		return &RefusedError{LimitError: quotas.LimitError{Decision: d}, Tenant: sub.tenant}
	}
	return nil
}

// insert stores the admitted task; created is false when a concurrent submission
// with the same idempotency key won (task is then that one). A task not written
// gives back the lease admission took for it.
func (s *Service) insert(ctx context.Context, sub submission, id uuid.UUID) (task store.Task, created bool, err error) {
	task, created, err = s.d.Lifecycle.Create(ctx, store.InsertTaskParams{
		ID: id, TenantID: sub.tenant.ID, Kid: sub.Kid, Agent: sub.Agent, User: sub.User, Input: sub.input,
		Budget: sub.budgetJSON, Priority: sub.priority, IdempotencyKey: sub.IdempotencyKey, RequestHash: sub.hash,
		StartWithin: sub.startWithin,
	})
	s.postgresAnswered(err == nil)
	if err != nil || !created {
		// Not written (or a concurrent duplicate won): give back the lease just taken.
		s.d.Admission.Release(context.WithoutCancel(ctx), sub.tenant.ID, id.String())
	}
	return task, created, err
}

// enqueue pushes a stored task to its tenant's queue, and gives the request's slot
// back in the same round trip; slotReleased says it did. A failure only logs: the task
// is stored as queued, and the recovery sweep pushes queued tasks missing from Redis.
func (s *Service) enqueue(ctx context.Context, sub submission, task store.Task, degraded bool) (slotReleased bool) {
	if degraded {
		// Redis is unreachable: the task stays queued in Postgres, and the recovery
		// sweep pushes it once Redis is back. Trying now would only add latency.
		s.log.Warn("admitted in degraded mode; the task waits in Postgres until Redis is back", "task_id", task.ID)
		return false
	}
	var along []func(redis.Pipeliner)
	done := func() {}
	if s.d.Admission != nil {
		var release func(redis.Pipeliner)
		if release, done = s.d.Admission.ReleaseInflightAlong(context.WithoutCancel(ctx), sub.Slot); release != nil {
			along = append(along, release)
		}
	}
	err := s.d.Queue.Enqueue(ctx, scheduler.EnqueueParams{
		TenantID: sub.tenant.ID, TaskID: task.ID, Priority: sub.priority, CreatedAt: task.CreatedAt,
		Weight: sub.pol.Weight, RunningCap: sub.pol.RunningCap,
		// The worker's spans join the submission's trace through this.
		TraceParent: telemetry.TraceParent(ctx),
	}, along...)
	done()
	if err != nil {
		// The task is stored as queued; the recovery sweep pushes queued tasks missing
		// from Redis, so the submission still holds.
		s.log.Error("pushing task to its queue failed; it stays queued in Postgres", "task_id", task.ID, "err", err)
	}
	return len(along) > 0
}

// postgresFresh is how long a write or ping that succeeded vouches for Postgres: a
// submission within it skips the ping. Under load every submission's insert renews
// it, so the check costs no round trip; a failed write ends it at once.
const postgresFresh = 250 * time.Millisecond

// checkPostgres tells whether Postgres can take a task, before any limit is spent on
// one: by a write or ping that succeeded within postgresFresh, or else a ping.
func (s *Service) checkPostgres(ctx context.Context) error {
	if at := s.pgOK.Load(); at != 0 && time.Since(time.Unix(0, at)) < postgresFresh {
		return nil
	}
	err := s.d.Store.Ping(ctx)
	s.postgresAnswered(err == nil)
	return err
}

// postgresAnswered records a Postgres call's outcome for checkPostgres.
func (s *Service) postgresAnswered(ok bool) {
	if ok {
		s.pgOK.Store(time.Now().UnixNano())
	} else {
		s.pgOK.Store(0)
	}
}

// endAdmissionSpan records an admission's outcome on its span and ends it.
func endAdmissionSpan(span trace.Span, d quotas.Decision, err error) {
	if !span.IsRecording() {
		span.End()
		return
	}
	switch {
	case err != nil:
		span.RecordError(err)
		span.SetStatus(codes.Error, "admission failed")
		span.SetAttributes(attribute.String("agentq.outcome", quotas.OutcomeError))
	case d.OutOfScope:
		span.SetAttributes(attribute.String("agentq.outcome", quotas.OutcomeOutOfScope))
	case d.Allowed:
		span.SetAttributes(attribute.String("agentq.outcome", quotas.OutcomeAdmitted))
	default:
		span.SetAttributes(attribute.String("agentq.outcome", quotas.OutcomeRefused), attribute.StringSlice("agentq.limit_types", d.Violated))
	}
	if d.Degraded {
		span.SetAttributes(attribute.Bool("agentq.degraded", true))
	}
	span.End()
}

// replay answers a resubmission with an idempotency key already used by the tenant.
func replay(res Submission, prev store.Task, hash []byte, idem string) (Submission, error) {
	if !bytes.Equal(prev.RequestHash, hash) {
		return res, &agentqtype.IdempotencyConflictError{Key: idem}
	}
	res.Task, res.Replayed = Task{Task: prev}, true
	return res, nil
}

// ResolveBudget fills a requested budget from the plan's default and refuses a field
// that is not above 0 (a tenant cannot switch a cap off) or is above the plan's ceiling
// (nor raise it). Every field of the result is set.
func ResolveBudget(plan quotas.Budget, req *BudgetRequest) (quotas.TaskBudget, error) {
	b, ceil := plan.Default, plan.Ceiling
	if req == nil {
		return b, nil
	}
	bad := func(field string, max any) error {
		return invalid("budget", "budget.%s must be above 0 and at most the plan's ceiling of %v; omit it to get the plan's default.", field, max)
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
// idempotency key can be told from a different request. A start deadline is a part
// only when there is one, so that the requests without one hash as they always did.
func requestHash(agent string, input json.RawMessage, user string, budget []byte, priority int, startWithin time.Duration) []byte {
	h := sha256.New()
	parts := [][]byte{[]byte(agent), input, []byte(user), budget, []byte(strconv.Itoa(priority))}
	if startWithin > 0 {
		parts = append(parts, []byte("start_within_ms="+strconv.FormatInt(startWithin.Milliseconds(), 10)))
	}
	for _, part := range parts {
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

// Task is a stored task with, for a queued one, why it waits (nil when that could
// not be told).
type Task struct {
	store.Task
	WaitReason *WaitReason
	// Undecorated: the task is queued but Redis, which holds where it stands, did
	// not answer within admission's deadline, so WaitReason is nil.
	Undecorated bool
}

// WaitReason is why a queued task waits and where it stands.
type WaitReason struct {
	// Reason is scheduler.WaitBehindFairShare, WaitTenantRunningCap or
	// WaitNoWorkerCapacity for a task in its tenant's queue; for a task parked for
	// token capacity, what it waits for (tokens_per_minute, pool:<name>, throttled).
	Reason string
	// Position is the task's 1-based place among its tenant's queued tasks, in the
	// order dispatch hands them out; 0 for a parked task, which is out of the queue
	// until its capacity is expected (it then joins by its priority and admission).
	Position int64
	// ExpectedStart is when the task is expected to be dispatched: for a task in the
	// queue, now plus the time its tenant needs to start Position tasks at its
	// measured start rate (nil when the tenant started too few tasks recently to
	// measure one); for a parked task, Until.
	ExpectedStart *time.Time
	// Until is when the capacity a parked task waits for is expected; nil otherwise.
	Until *time.Time
}

// Get returns one of the tenant's tasks, with why it waits when it is queued.
func (s *Service) Get(ctx context.Context, tenantID string, id uuid.UUID) (Task, error) {
	t, err := s.Stored(ctx, tenantID, id)
	if err != nil {
		return Task{}, err
	}
	return s.WithWaitReason(ctx, t), nil
}

// Stored returns one of the tenant's tasks as Postgres holds it, without asking the
// scheduler why it waits (WaitReason nil): for callers that only watch its state.
func (s *Service) Stored(ctx context.Context, tenantID string, id uuid.UUID) (Task, error) {
	if tenantID == "" {
		return Task{}, ErrNoTenant
	}
	t, err := s.d.Store.GetTask(ctx, store.GetTaskParams{TenantID: tenantID, ID: id})
	if err != nil {
		return Task{}, err
	}
	return Task{Task: t}, nil
}

// WithWaitReason is t with, when it is queued, why it waits.
func (s *Service) WithWaitReason(ctx context.Context, t Task) Task {
	out := []Task{t}
	s.fillWaitReasons(ctx, out)
	return out[0]
}

// fillWaitReasons says why queued tasks wait.
func (s *Service) fillWaitReasons(ctx context.Context, tasks []Task) {
	ws := make([]waiting, len(tasks))
	for i, t := range tasks {
		ws[i] = waiting{tenantID: t.TenantID, id: t.ID, state: t.State, parked: t.Wait.Reason, until: t.Wait.Until}
	}
	reasons, unknown := s.waitReasons(ctx, ws)
	for i, r := range reasons {
		tasks[i].WaitReason, tasks[i].Undecorated = r, unknown[i]
	}
}

// decorating bounds the Redis reads that only decorate an answer Postgres gave (where
// a queued task stands) by admission's deadline, so a Redis node that does not
// answer costs a read that deadline, not its client's retries; ok is false while
// admission skips Redis altogether (its breaker is open): the decoration is left out
// at once.
func (s *Service) decorating(ctx context.Context) (_ context.Context, _ context.CancelFunc, ok bool) {
	if s.d.Admission == nil {
		return ctx, func() {}, true
	}
	if s.d.Admission.Degraded() {
		return ctx, func() {}, false
	}
	dctx, cancel := context.WithTimeout(ctx, s.d.Admission.Timeout())
	return dctx, cancel, true
}

// waiting is a task whose wait reason is asked for: its parked reason and until as
// Postgres holds them.
type waiting struct {
	tenantID string
	id       uuid.UUID
	state    store.TaskState
	parked   *string
	until    *time.Time
}

// waitReasons says why each of ws waits: nil unless it is queued; what it waits for
// when it is parked for token capacity (as Postgres holds it), not where it stands;
// otherwise why its tenant's queued tasks wait, its place in the tenant's queue and
// when it is expected to start, asking Redis once per tenant however many of its
// tasks are asked for, within admission's deadline. A task whose tenant's read fails
// gets nil and unknown rather than failing the read.
func (s *Service) waitReasons(ctx context.Context, ws []waiting) (out []*WaitReason, unknown []bool) {
	out, unknown = make([]*WaitReason, len(ws)), make([]bool, len(ws))
	queued := map[string][]int{} // by tenant: the indexes of its tasks in the queue
	var tenants []string
	for i, w := range ws {
		switch {
		case w.state != agentqtype.TaskStateQueued:
		case w.parked != nil:
			out[i] = &WaitReason{Reason: *w.parked, ExpectedStart: w.until, Until: w.until}
		default:
			if _, seen := queued[w.tenantID]; !seen {
				tenants = append(tenants, w.tenantID)
			}
			queued[w.tenantID] = append(queued[w.tenantID], i)
		}
	}
	if len(tenants) == 0 {
		return out, unknown
	}
	dctx, cancel, ok := s.decorating(ctx)
	defer cancel()
	for _, tenantID := range tenants {
		idx := queued[tenantID]
		ids := make([]string, len(idx))
		for j, i := range idx {
			ids[j] = ws[i].id.String()
		}
		var st scheduler.Standing
		err := errRedisSkipped
		if ok {
			st, err = s.d.Queue.Standing(dctx, tenantID, ids)
		}
		for j, i := range idx {
			if err != nil {
				unknown[i] = true
				continue
			}
			r := &WaitReason{Reason: st.Reason, Position: st.Positions[j]}
			if at, ok := st.ExpectedStart(r.Position); ok {
				at = at.UTC().Round(time.Millisecond)
				r.ExpectedStart = &at
			}
			out[i] = r
		}
	}
	return out, unknown
}

// errRedisSkipped: admission skips Redis for now, and so do the reads it decorates.
var errRedisSkipped = errors.New("tasks: redis is skipped while admission's breaker is open")

// IsState tells a task state the listing can filter on.
func IsState(st string) bool { return agentqtype.TaskState(st).Valid() }

// ListParams selects a page of the tenant's tasks, newest first.
type ListParams struct {
	TenantID string
	State    string    // empty: every state
	Limit    int       // 0: DefaultListLimit
	Before   uuid.UUID // the previous page's cursor; zero: the first page
	// Scope keeps only the tasks an API key of that scope may see.
	Scope Scope
	// RootID, when set, keeps only the tasks of the tree rooted there, its root
	// included.
	RootID uuid.UUID
}

// Page is a page of tasks; Next, when not nil, is the cursor of the next page.
type Page struct {
	Tasks []Task
	Next  *uuid.UUID
}

// List returns a page of the tenant's tasks.
func (s *Service) List(ctx context.Context, p ListParams) (Page, error) {
	if p.TenantID == "" {
		return Page{}, ErrNoTenant
	}
	if p.State != "" && !IsState(p.State) {
		return Page{}, invalid("state", "Unknown state %q.", p.State)
	}
	want := p.Limit
	if want == 0 {
		want = DefaultListLimit
	}
	if want < 1 || want > MaxListLimit {
		return Page{}, invalid("limit", "limit must be between 1 and %d.", MaxListLimit)
	}
	// One more tells whether there is a next page.
	rows, err := s.d.Store.ListTasks(ctx, store.ListTasksParams{TenantID: p.TenantID, State: store.TaskState(p.State), Limit: want + 1, Before: p.Before,
		Agents: p.Scope.Agents, Principals: p.Scope.Principals, RootID: p.RootID})
	if err != nil {
		return Page{}, err
	}
	var out Page
	if len(rows) > want {
		rows = rows[:want]
		next := rows[len(rows)-1].ID
		out.Next = &next
	}
	out.Tasks = make([]Task, 0, len(rows))
	for _, t := range rows {
		out.Tasks = append(out.Tasks, Task{Task: t})
	}
	s.fillWaitReasons(ctx, out.Tasks)
	return out, nil
}

// Cancel ends one of the tenant's queued, running or paused tasks as killed. What
// follows the end (its lease given back, its queue entry removed, the worker running
// it told to stop, its progress stream told) is the lifecycle's Ends.
func (s *Service) Cancel(ctx context.Context, tenantID string, id uuid.UUID) (Task, error) {
	if tenantID == "" {
		return Task{}, ErrNoTenant
	}
	t, ok, err := s.d.Lifecycle.Cancel(ctx, CancelParams{TenantID: tenantID, ID: id, Reason: agentqtype.CancelledByTenant()})
	if err != nil {
		return Task{}, err
	}
	if !ok {
		cur, err := s.d.Store.GetTask(ctx, store.GetTaskParams{TenantID: tenantID, ID: id})
		if err != nil {
			return Task{}, err
		}
		return Task{}, &FinishedError{ID: id, State: string(cur.State)}
	}
	return Task{Task: t}, nil
}

// Terminal reports whether a task state, as a string from an event, is final.
func Terminal(state string) bool { return agentqtype.TaskState(state).Terminal() }

// MaxLiveTasks bounds the tasks Live lists.
const MaxLiveTasks = 100

// PanelTask is a live task as the usage report shows it, with why it waits when it
// is queued.
type PanelTask struct {
	store.PanelTask
	WaitReason *WaitReason
	// Undecorated: as Task's.
	Undecorated bool
	// Tree is, for a root that spawned, what its whole tree holds (nil otherwise).
	Tree *store.TreeTotal
}

// Live is a tenant's running and queued tasks: how many of each, and up to the limit
// of them (running first, then queued, oldest first), queued ones with why they wait.
type Live struct {
	Running, Queued int64
	Tasks           []PanelTask
}

// Live returns the tenant's live tasks, at most limit of them (1..MaxLiveTasks).
func (s *Service) Live(ctx context.Context, tenantID string, limit int) (Live, error) {
	if tenantID == "" {
		return Live{}, ErrNoTenant
	}
	if limit < 1 || limit > MaxLiveTasks {
		return Live{}, invalid("limit", "limit must be between 1 and %d.", MaxLiveTasks)
	}
	rows, err := s.d.Store.ListLiveTasks(ctx, store.LiveTasksParams{TenantID: tenantID, Limit: limit})
	if err != nil {
		return Live{}, err
	}
	out := Live{Running: rows.Running, Queued: rows.Queued, Tasks: make([]PanelTask, 0, len(rows.Tasks))}
	ws := make([]waiting, len(rows.Tasks))
	for i, t := range rows.Tasks {
		ws[i] = waiting{tenantID: t.TenantID, id: t.ID, state: t.State, parked: t.WaitReason, until: t.WaitUntil}
	}
	reasons, unknown := s.waitReasons(ctx, ws)
	for i, r := range reasons {
		out.Tasks = append(out.Tasks, PanelTask{PanelTask: rows.Tasks[i], WaitReason: r, Undecorated: unknown[i]})
	}
	return out, s.addTreeTotals(ctx, tenantID, out.Tasks)
}

// addTreeTotals gives each live root that spawned its tree's totals: one read for
// them all, none when no live task spawned.
func (s *Service) addTreeTotals(ctx context.Context, tenantID string, ts []PanelTask) error {
	var roots []uuid.UUID
	for _, t := range ts {
		if t.ParentID == nil && t.Children > 0 {
			roots = append(roots, t.ID)
		}
	}
	if len(roots) == 0 {
		return nil
	}
	totals, err := s.d.Store.TreeTotals(ctx, store.TreeTotalsParams{TenantID: tenantID, Roots: roots})
	if err != nil {
		return err
	}
	for i := range ts {
		if tt, ok := totals[ts[i].ID]; ok { // keyed by root: only the roots asked for
			ts[i].Tree = &tt
		}
	}
	return nil
}
