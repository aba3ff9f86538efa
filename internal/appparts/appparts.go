// Package appparts hands the components of an agentq App to the module's own
// end-to-end tests (internal/e2e), which check what a request or a task left in
// Postgres and Redis, or drive a component directly. The root package registers the
// accessors when it is loaded; being internal, nothing outside the module reaches
// them, and the App's public API stays free of test hooks.
package appparts

import (
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas/admission"
	"github.com/agentq/agentq/runtime"
	"github.com/agentq/agentq/scheduler"
	"github.com/agentq/agentq/web"
)

// Parts are the components of one App; a role the App does not run leaves its
// component nil.
type Parts struct {
	Store     *store.Store
	Redis     redis.UniversalClient
	Keys      rkeys.Keys
	Quotas    *admission.Store
	Admission *admission.Guard
	Scheduler *scheduler.Scheduler
	Worker    *runtime.Worker
	API       *web.Server
	// JanitorLeads reports whether the App's janitor holds the leader lock.
	JanitorLeads func() bool
}

// Hooks are what the root package registers: app is an *agentq.App and opts an
// *agentq.Options (this package cannot name them without an import cycle).
type Hooks struct {
	Of func(app any) Parts
	// SetRecoveryEvery replaces the 30 s interval of the sweep that re-pushes queued
	// tasks missing from Redis, so that a test sees it run without waiting that long.
	SetRecoveryEvery func(opts any, d time.Duration)
}

var hooks Hooks

// Register is called once, by the root package's init.
func Register(h Hooks) { hooks = h }

// Of returns the components of app, an *agentq.App.
func Of(app any) Parts { return hooks.Of(app) }

// SetRecoveryEvery sets the recovery sweep's interval on opts, an *agentq.Options.
func SetRecoveryEvery(opts any, d time.Duration) { hooks.SetRecoveryEvery(opts, d) }
