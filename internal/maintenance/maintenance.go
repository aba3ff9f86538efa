// Package maintenance holds the services that keep Redis in line with Postgres, the
// system of record: the recovery sweep, which every scheduler process runs, and the
// janitor: a leader elector and one pass per kind of drift (stale tasks, leases,
// running sets, re-push, the slot counter, the quota recount, the generation check),
// which run only on the replica the elector chose.
//
// Every service has River's startstop shape (Start, Stop, Started). The package does
// not know the App that assembles it: New functions take Deps, the services the passes
// work on, and a configuration whose zero fields take defaults. Each pass's runOnce
// does one run and returns what it corrected; tests call it directly, and wait on a
// service's TestSignals, which only tests initialise.
package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/wire"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
	"github.com/agentq/agentq/scheduler"
)

// Deps are what the maintenance services read and repair.
type Deps struct {
	Store Store
	// Lifecycle makes the task state changes the passes decide on; nil: a
	// tasks.Lifecycle over Pool.
	Lifecycle Lifecycle
	// Trees cancels the tasks a tree's end left live; nil: trees over Pool that
	// cancel through a lifecycle as Lifecycle's default is made.
	Trees Trees
	// Pool is the Postgres pool the elector takes its leader lock on.
	Pool      *pgxpool.Pool
	Redis     redis.UniversalClient
	Keys      rkeys.Keys
	Scheduler Scheduler
	Quotas    Quotas
	// Plans resolves a tenant's effective weight and running cap when a task is
	// pushed back onto its queue.
	Plans *quotas.Catalogue
	// Usage reads the usage ledger for the quota recount; nil turns the recount off.
	Usage UsageLedger
	// Rejections flushes admission's refusal counts to Postgres; nil turns it off.
	Rejections RejectionFlusher
	// LateStarts reports tasks still waiting for their first start past their plan's
	// commitment; nil turns the late-start pass off.
	LateStarts LateStartWatcher
	// Pauses resumes and ends paused tasks (*tasks.Service); nil turns the pause
	// watcher off.
	Pauses PauseSweeper
	// Webhooks prunes finished webhook deliveries past their retention; nil turns
	// the retention pass off.
	Webhooks WebhookPruner
	// Corrections records each pass run that corrected something (the operator
	// view's janitor corrections); nil records nothing.
	Corrections CorrectionLog
	// Archetype is where the passes log and meter (agentq.janitor.drift,
	// agentq.quotas.recount_skipped), and the clock the webhook retention counts
	// from; nil: the defaults.
	Archetype *baseservice.Archetype
}

func (d Deps) logger() *slog.Logger { return d.Archetype.Defaults().Logger }

// lifecycle is d.Lifecycle, or a new one over d.Pool (newLifecycle).
func (d Deps) lifecycle() Lifecycle {
	if d.Lifecycle != nil {
		return d.Lifecycle
	}
	return d.newLifecycle()
}

// newLifecycle is a lifecycle over d.Pool whose ends' effects (tasks.Ends) release
// through d.Quotas' client and remove through d.Scheduler.
func (d Deps) newLifecycle() *tasks.Lifecycle {
	o := tasks.LifecycleOptions{Archetype: d.Archetype}
	if d.Quotas != nil {
		o.Subscribers = []tasks.Subscriber{tasks.NewEnds(tasks.EndsDeps{Leases: d.Quotas, Queue: d.Scheduler, Redis: d.Redis,
			Keys: d.Keys, Log: d.logger()})}
	}
	return tasks.NewLifecycle(store.New(d.Pool), o)
}

// trees is d.Trees, or trees over d.Pool cancelling through a new lifecycle.
func (d Deps) trees() Trees {
	if d.Trees != nil {
		return d.Trees
	}
	st := store.New(d.Pool)
	tr := tasks.NewTrees(tasks.TreesDeps{Store: st, Log: d.logger()})
	tr.Use(d.newLifecycle())
	return tr
}

// Store is the part of the store the passes read (*store.Store). A task's state
// changes go through Lifecycle, not here.
type Store interface {
	GetTenant(ctx context.Context, id string) (store.Tenant, error)
	UnscopedTenantIDsAfter(ctx context.Context, after string, limit int) ([]string, error)
	UnscopedAnyTask(ctx context.Context) (bool, error)
	UnscopedListQueued(ctx context.Context, p store.ListQueuedParams) ([]store.QueuedTask, error)
	UnscopedListStaleRunning(ctx context.Context, staleAfter time.Duration, limit int) ([]store.StaleTask, error)
	UnscopedLiveTasksOf(ctx context.Context, tenants []string) (map[string][]store.LiveTask, error)
	UnscopedTaskStates(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]store.TaskState, error)
}

// Lifecycle is the part of the task lifecycle the passes use (*tasks.Lifecycle): each
// state change is one transaction, with what must be written along with it.
type Lifecycle interface {
	RequeueStale(ctx context.Context, id uuid.UUID, staleAfter time.Duration) (store.Task, bool, error)
	// Finish abandons a task whose attempts keep dying (FinishParams.Abandoned).
	Finish(ctx context.Context, p tasks.FinishParams) (bool, error)
	ExpireOverdue(ctx context.Context, limit int) ([]store.Task, error)
}

// Trees is the part of task trees the tree repair uses (*tasks.Trees).
type Trees interface {
	// CancelOrphans cancels live tasks whose parent has ended.
	CancelOrphans(ctx context.Context, limit int) ([]store.Task, error)
}

// Scheduler is the part of the fair scheduler the passes use (*scheduler.Scheduler).
type Scheduler interface {
	Enqueue(ctx context.Context, p scheduler.EnqueueParams, along ...func(redis.Pipeliner)) error
	Remove(ctx context.Context, tenantID string, taskID uuid.UUID) (bool, error)
	Missing(ctx context.Context, qs []scheduler.Queued) ([]scheduler.Queued, error)
	Done(ctx context.Context, p wire.Payload, took time.Duration, along ...func(redis.Pipeliner)) error
	// Paused frees a paused task's slots and names its next dispatch anew.
	Paused(ctx context.Context, p wire.Payload, took time.Duration, along ...func(redis.Pipeliner)) error
	AddRunning(ctx context.Context, tenantID, taskID string) error
	RunningSets(ctx context.Context, tenants []string) ([][]string, error)
	MarkGeneration(ctx context.Context) (bool, error)
	ReconcileSlots(ctx context.Context) (int64, error)
	Stranded(ctx context.Context, insp *asynq.Inspector, tenantID, taskID string, priority int, minAge time.Duration) (bool, error)
}

// Quotas is the part of the limits the lease pass and the quota recount use
// (*admission.Store: its TaskLeases and its Recounter).
type Quotas interface {
	// Release releases a task's leases; the passes send it alone (pipe nil).
	Release(ctx context.Context, pipe redis.Pipeliner, tenantID, taskID string) (int, error)
	// ReleaseSettled releases a task's leases unless one is fresher than fresh.
	ReleaseSettled(ctx context.Context, tenantID, taskID string, fresh time.Duration) (int, error)
	TouchLeases(ctx context.Context, tenantID string, taskIDs []string) (int, error)
	LeaseAges(ctx context.Context, tenantID string) (sessions, long map[string]time.Duration, err error)
	LeaseMembers(ctx context.Context, tenants []string) (sessions, long [][]string, err error)
	AddLease(ctx context.Context, tenantID, taskID string, long bool) error
	SnapshotCounters(ctx context.Context, tenants []string) ([]quotas.CounterSnapshot, error)
	CorrectCounters(ctx context.Context, cs []quotas.Correction) ([]quotas.RecountResult, error)
}

// UsageLedger is what the quota recount reads of the usage ledger (*usage.Ledger):
// for a page of tenants, what their counters should hold and what their running tasks
// may hold reserved besides (basis), read while their ledger holds still, and held
// until correct returns (usage.Ledger.RecountHeld); an error matching store.ErrBusy
// when it could not be held.
type UsageLedger interface {
	RecountHeld(ctx context.Context, tenants []string, now time.Time,
		correct func(basis func() (map[string]quotas.LedgerCounts, error)) error) error
}

var (
	_ Store         = (*store.Store)(nil)
	_ Lifecycle     = (*tasks.Lifecycle)(nil)
	_ Scheduler     = (*scheduler.Scheduler)(nil)
	_ Quotas        = (*admission.Store)(nil)
	_ CorrectionLog = (*store.Store)(nil)
)
