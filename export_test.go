package agentq

import (
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/runtime"
	"github.com/agentq/agentq/scheduler"
	"github.com/agentq/agentq/web"
)

// The components of an App, for the tests of package agentq_test, which check what a
// request or a task left in Postgres and Redis, or drive a component directly.

func (a *App) Store() *store.Store             { return a.store }
func (a *App) Redis() redis.UniversalClient    { return a.rdb }
func (a *App) Keys() rkeys.Keys                { return a.keys }
func (a *App) Quotas() *quotas.Quotas          { return a.quotas }
func (a *App) Admission() *quotas.Guard        { return a.admission }
func (a *App) Scheduler() *scheduler.Scheduler { return a.sched }
func (a *App) Worker() *runtime.Worker         { return a.worker }
func (a *App) API() *web.Server                { return a.api }

// SetRecoveryEvery replaces the 30 s interval of the recovery sweep, so that a test
// sees it run without waiting that long.
func (o *Options) SetRecoveryEvery(d time.Duration) { o.recoveryEvery = d }

// JanitorLeads reports whether this process's janitor holds the leader lock.
func (a *App) JanitorLeads() bool { return a.janitor.Elector().Leader() }
