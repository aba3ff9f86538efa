// Package agentq is the multi-tenant runtime for AI-agent tasks, usable as a library.
//
// New builds an App from a Config, on one Redis and one Postgres; Start runs the roles
// the configuration names (the HTTP API, the fair scheduler, the workers, the janitor,
// the webhook relay) and Stop ends them. The App's tenant, API key and task operations hold a Go program
// to the rules of the HTTP API, with the same refusals. Agents written in Go are
// registered on the App's runtime.Registry (Options.Agents, or App.Agents) before
// Start. cmd/agentq is a thin CLI over this package.
package agentq

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"github.com/riverqueue/river/rivershared/startstop"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/billing/rejections"
	"github.com/agentq/agentq/billing/usage"
	"github.com/agentq/agentq/billing/webhooks"
	"github.com/agentq/agentq/internal/approval"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/maintenance"
	"github.com/agentq/agentq/internal/operator"
	"github.com/agentq/agentq/internal/pg"
	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/sealed"
	"github.com/agentq/agentq/internal/services"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/telemetry"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/migrations"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
	"github.com/agentq/agentq/quotas/capacity"
	"github.com/agentq/agentq/runtime"
	"github.com/agentq/agentq/scheduler"
	"github.com/agentq/agentq/web"
)

// Options configure an App.
type Options struct {
	// Config is the process's configuration; New refuses one Validate refuses.
	Config Config
	// Logger receives the process's logs; nil is slog.Default().
	Logger *slog.Logger
	// Redis, when set, is the Redis the App uses instead of connecting to
	// Config.RedisURL; the caller keeps it and closes it after Stop.
	Redis redis.UniversalClient
	// Pool, when set, is the Postgres the App uses instead of connecting to
	// Config.DatabaseURL; its schema is migrated by New all the same. The caller
	// keeps it and closes it after Stop.
	Pool *pgxpool.Pool
	// Agents holds the executors; nil gets a registry with the built-in sim agent.
	// Register Go handlers on it (or on App.Agents) before Start.
	Agents *runtime.Registry
	// TracerProvider, when set, receives the App's spans (the HTTP requests,
	// admissions, Postgres and Redis calls, dispatches, tasks and their steps)
	// instead of a provider New builds from the OTEL_* environment variables. The
	// caller keeps it and shuts it down after Stop.
	TracerProvider trace.TracerProvider
	// MeterProvider, when set, receives the App's metrics instead of a provider New
	// builds from the OTEL_* environment variables; GET /metrics then answers 404,
	// since the caller's provider decides where metrics go. The caller keeps it and
	// shuts it down after Stop.
	MeterProvider metric.MeterProvider

	// recoveryEvery, when set, replaces the 30 s interval of the sweep that re-pushes
	// queued tasks missing from Redis (tests).
	recoveryEvery time.Duration
}

// taskCheckInterval is how often idle workers look for work: asynq's default of 1 s
// would add up to a second to every dispatch into an idle pool.
const taskCheckInterval = 10 * time.Millisecond

// App is one agentq process: the roles its Config names, on one Redis and one
// Postgres. Build it with New, run it with Start, end it with Stop or Shutdown; the
// tenant, key and task operations work from New on.
type App struct {
	cfg config.Config
	log *slog.Logger
	// archetype is the one logger, tracer and meter providers and clock every
	// service of the App shares.
	archetype  *baseservice.Archetype
	store      *store.Store
	rdb        redis.UniversalClient
	batch      *redisx.Batch // shared round trips of the task path (see New)
	slotBatch  *redisx.Batch // the same for request slots, within the admission timeout
	leaderPool *pgxpool.Pool // the elector's session connections (LeaderDatabaseURL), or nil
	// replicaPool serves the API's long read-only queries (ReplicaDatabaseURL), or nil
	replicaPool *pgxpool.Pool
	keys        rkeys.Keys
	plans       *quotas.Catalogue
	quotas      *admission.Store
	modelPools  *capacity.Pools // the model pools' buckets, which the worker's steps draw on
	admission   *admission.Guard
	agents      *runtime.Registry
	sched       *scheduler.Scheduler
	dispatcher  *scheduler.Dispatcher
	worker      *runtime.Worker
	api         *web.Server

	services    *services.Services
	lifecycle   *tasks.Lifecycle
	trees       *tasks.Trees
	commitments *outbox.Commitments // the plans' commitments, checked at starts and by the janitor
	// approvals signs the approval links of paused tasks (in their pause's event)
	// and checks them (the API's /approve).
	approvals   *approval.Signer
	recovery    *maintenance.Recovery
	janitor     *maintenance.Janitor
	rejections  *rejections.Rejections
	relay       *webhooks.Relay
	tel         *telemetry.Telemetry
	svcs        []startstop.Service // the configured roles' services, in start order
	asynqClient *asynq.Client
	ownRedis    bool
	ownPool     bool
	// learnedBase is the API's address a worker without the api role and without a
	// configured public URL took from Postgres at Start (apiaddress.go).
	learnedBase string

	// localRejections flushes the refusals admission decided in process.
	localRejections *rejections.LocalRejectionFlush
}

// New validates the configuration (refusing it with a *ConfigError that names the
// field), connects, migrates and builds every component. Nothing runs until Start.
func New(ctx context.Context, o Options) (*App, error) {
	if err := o.Config.Check(o.Redis != nil, o.Pool != nil); err != nil {
		return nil, err
	}
	a := &App{cfg: o.Config, log: o.Logger, rdb: o.Redis, agents: o.Agents}
	if a.log == nil {
		a.log = slog.Default()
	}
	// Every line logged with a context names the trace and span it belongs to.
	a.log = slog.New(telemetry.LogHandler(a.log.Handler()))
	if a.agents == nil {
		a.agents = runtime.NewRegistry()
	}
	if a.cfg.Has(config.RoleAPI) && a.cfg.AdminToken == "" && len(a.cfg.AdminTokens) == 0 {
		a.log.Warn("neither AGENTQ_ADMIN_TOKEN nor AGENTQ_ADMIN_TOKENS is set: the admin API accepts only stored credentials (agentq admin credentials create), and refuses every request without one")
	}
	plans, err := tenants.LoadCatalogue(a.cfg)
	if err != nil {
		return nil, err
	}
	a.plans = plans
	if a.tel, err = telemetry.Setup(ctx, telemetry.Config{TracerProvider: o.TracerProvider, MeterProvider: o.MeterProvider}); err != nil {
		return nil, err
	}
	tp, mp := a.tel.TracerProvider, a.tel.MeterProvider
	a.archetype = &baseservice.Archetype{Logger: a.log, TracerProvider: tp, MeterProvider: mp}
	// Postgres and Redis calls are traced inside a request, a dispatch or a step;
	// the background polling makes no traces of its own.
	callTP := telemetry.ChildrenOnly(tp)

	pool, readStore, err := a.connectPostgres(ctx, o.Pool, callTP, mp)
	if err != nil {
		a.close()
		return nil, err
	}
	if err := a.connectRedis(ctx, callTP); err != nil {
		a.close()
		return nil, err
	}
	a.keys = rkeys.New(a.cfg.RedisPrefix, a.cfg.Shards)
	// One batch for the process: calls of the task path that nothing waits on in
	// between share round trips across requests and workers.
	a.batch = redisx.NewBatch(a.rdb, 0)
	a.slotBatch = redisx.NewBatch(a.rdb, a.cfg.RedisTimeout)
	// The API's admissions come in concurrently: they share script calls, each within
	// the admission timeout. Step reservations share the task path's batch.
	a.quotas = admission.New(a.rdb, a.keys, nil, admission.Options{
		Coalesce: a.cfg.Has(config.RoleAPI), CoalesceTimeout: a.cfg.RedisTimeout, Batch: a.batch,
	})
	a.quotas.SetUsageSource(usage.NewLedger(a.store), a.archetype)
	a.modelPools = capacity.NewPools(a.rdb, a.keys, nil, capacity.PoolsOptions{Batch: a.batch})
	// The request slots' calls have a batch of their own, bounded by the admission
	// timeout: they must answer as fast as admission does.
	a.admission = admission.NewGuard(a.quotas, admission.GuardOptions{Timeout: a.cfg.RedisTimeout, ID: replicaID(), Archetype: a.archetype,
		Batch: a.slotBatch})
	a.sched = scheduler.New(a.rdb, a.keys, scheduler.Options{
		Prefetch: a.cfg.Prefetch, Batch: a.batch, WakeInProcess: a.cfg.Has(config.RoleScheduler),
	})
	a.asynqClient = asynq.NewClientFromRedisClient(a.rdb)
	a.dispatcher = scheduler.NewDispatcher(a.sched, a.rdb, a.asynqClient, scheduler.DispatcherOptions{Archetype: a.archetype})
	queues := map[string]int{a.keys.TaskQueue(): 1}
	// The tenants' policies and cache come before the lifecycle: its subscribers read
	// them, at every step, park, pause and start.
	deps := services.Deps{
		Pool: pool, Plans: a.plans, Redis: a.rdb, Keys: a.keys, Scheduler: a.sched,
		Admission: a.admission, Agents: a.agents, Archetype: a.archetype,
		Webhooks:   webhooks.WebhooksOptions{AllowNets: a.cfg.WebhookAllowNets},
		AdminToken: a.cfg.AdminToken, AdminTokens: a.cfg.AdminTokens,
	}
	tenantSvc := services.NewTenants(deps)
	secret, _ := sealed.Secret(a.cfg.PanelSecret, a.cfg.AdminToken)
	if a.approvals, err = approval.NewSigner(secret, a.publicBase, nil); err != nil {
		a.close()
		return nil, err
	}
	// One lifecycle for every task state change this process makes: submissions and
	// cancels, the worker's steps and ends, the janitor's re-queues and abandons.
	// Trees follow the ends of a tree's tasks (a parent woken, children cancelled)
	// after Ends has freed what the ended task held.
	trees := tasks.NewTrees(tasks.TreesDeps{Store: a.store, Queue: a.sched, Agents: a.agents, Quotas: a.admission, Log: a.log,
		Events: outbox.Events{UpgradeURL: a.cfg.UpgradeURL}})
	a.lifecycle = tasks.NewLifecycle(a.store, tasks.LifecycleOptions{
		Archetype:   a.archetype,
		Subscribers: []tasks.Subscriber{a.outboxSubscriber(tenantSvc), a.ends(), trees},
	})
	trees.Use(a.lifecycle)
	a.trees = trees
	deps.Lifecycle, deps.Tenants = a.lifecycle, tenantSvc
	a.services = services.New(deps)
	a.agents.Remote = a.services.Agents.Resolver([]byte(a.cfg.AgentSecret), a.archetype)
	if err := a.services.Pools.Instrument(mp); err != nil {
		a.log.Warn("registering the model pools' gauges failed", "err", err)
	}
	a.worker = runtime.NewWorker(a.lifecycle, cachedTenants{a.services.Tenants}, a.agents, a.sched, stepLimits{a.quotas, a.modelPools}, a.rdb, runtime.WorkerOptions{
		Concurrency: a.cfg.WorkerConcurrency, Queues: queues, DrainQueues: scheduler.LegacyQueues(a.keys), CancelChannel: a.keys.CancelChannel(),
		ShutdownTimeout: a.cfg.ShutdownTimeout, TaskCheckInterval: taskCheckInterval, Archetype: a.archetype, Fetchers: a.cfg.WorkerFetchers,
		Policies: a.services.Tenants, Events: a.keys.TaskEvents, Batch: a.batch, Pools: a.services.Pools, Trees: trees,
	})
	a.rejections, a.localRejections = a.refusalFlushes()
	a.recovery = maintenance.NewRecovery(a.maintenanceDeps(), maintenance.RecoveryConfig{
		Interval: o.recoveryEvery, MinAge: maintenance.DefaultRecoveryMinAge,
	})
	a.relay = webhooks.NewRelay(a.store, webhooks.RelayConfig{Archetype: a.archetype, AllowNets: a.cfg.WebhookAllowNets})
	a.janitor = maintenance.NewJanitor(a.maintenanceDeps(), maintenance.JanitorConfig{Interval: a.cfg.JanitorInterval,
		WebhookRetention: maintenance.WebhookRetentionConfig{Retention: a.cfg.WebhookRetention}})
	a.api = a.newAPI(pool, readStore)
	a.svcs = a.roleServices()
	return a, nil
}

// publicBase is the API's public base URL: the configured one, else the one an API
// process advertised (a worker without the api role), else this process's listening
// address when it serves the API on a port it picked, else one made from the
// configured address.
func (a *App) publicBase() string {
	if a.cfg.PublicURL == "" && a.learnedBase != "" {
		return a.learnedBase
	}
	if a.cfg.PublicURL == "" && a.api != nil && a.cfg.Has(config.RoleAPI) {
		if addr := a.api.Addr(); addr != nil {
			c := a.cfg
			c.HTTPAddr = addr.String()
			return c.PublicBase()
		}
	}
	return a.cfg.PublicBase()
}

// outboxSubscriber writes the usage events of the tasks' state changes, judged by
// the tenants' policies: threshold crossings, budget stops, waits, pauses with their
// approval links (valid as long as the tenant's plan lets a task stay paused), and
// the commitments a start or an expiry shows missed.
func (a *App) outboxSubscriber(ts *tenants.Service) *outbox.Subscriber {
	events := outbox.Events{UpgradeURL: a.cfg.UpgradeURL}
	limitsOf := func(t store.Tenant) (quotas.Limits, error) {
		pol, err := ts.Policy(t)
		return pol.Limits, err
	}
	a.commitments = outbox.NewCommitments(outbox.Commitments{Events: events, Tenants: cachedTenants{ts}, Starts: a.sched, Pools: a.modelPools,
		SLA: func(t store.Tenant) (quotas.SLA, error) {
			pol, err := ts.Policy(t)
			return pol.SLA, err
		}}, a.archetype)
	return &outbox.Subscriber{
		Store: a.store, Events: events, Log: a.log, Commitments: a.commitments,
		Crossings: outbox.Crossings{Events: events, Limits: limitsOf},
		Waits:     outbox.Waits{Events: events, Limits: limitsOf},
		Pauses: outbox.Pauses{
			Events: events,
			Timeout: func(t store.Tenant) time.Duration {
				pol, err := ts.Policy(t)
				if err != nil {
					return quotas.DefaultPauseTimeout
				}
				return pol.PauseTimeout
			},
			Link: func(tenantID string, task uuid.UUID, pause int, expires time.Time) string {
				return a.approvals.Link(approval.Claims{TenantID: tenantID, TaskID: task, Pause: pause, Expires: expires})
			},
		},
	}
}

// ends is what follows every task's end, whoever ended it: its lease back, its queue
// entry and pool place gone, its progress stream and, for a cancel, its worker told.
// Its Redis calls share the task path's batch.
func (a *App) ends() *tasks.Ends {
	return tasks.NewEnds(tasks.EndsDeps{Leases: a.quotas, Queue: a.sched, Pools: a.modelPools, Redis: a.rdb, Batch: a.batch,
		Keys: a.keys, Log: a.log})
}

// connectPostgres connects to Postgres (unless given a pool), to the read replica
// and the leader-election database when the roles use them, and migrates. readStore
// is the store reads that may lag go to. On an error, a.close releases what it opened.
func (a *App) connectPostgres(ctx context.Context, pool *pgxpool.Pool, callTP trace.TracerProvider, mp metric.MeterProvider) (
	_ *pgxpool.Pool, readStore *store.Store, err error) {
	if pool == nil {
		if pool, err = pg.Connect(ctx, a.cfg.DatabaseURL, "", func(c *pgxpool.Config) {
			// A pool acquire is not a call to Postgres: no span of its own.
			c.ConnConfig.Tracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(callTP), otelpgx.WithMeterProvider(mp),
				otelpgx.WithDisableAcquireTracer())
		}); err != nil {
			return nil, nil, err
		}
		a.ownPool = true
	}
	if err := otelpgx.RecordStats(pool, otelpgx.WithStatsMeterProvider(mp)); err != nil {
		a.log.Warn("pgx pool metrics are off", "err", err)
	}
	a.store = store.New(pool)
	readStore = a.store
	if a.cfg.ReplicaDatabaseURL != "" && a.cfg.Has(config.RoleAPI) {
		if a.replicaPool, err = pg.Connect(ctx, a.cfg.ReplicaDatabaseURL, ""); err != nil {
			return nil, nil, fmt.Errorf("DATABASE_REPLICA_URL: %w", err)
		}
		readStore = store.New(a.replicaPool)
	}
	if a.cfg.LeaderDatabaseURL != "" && a.cfg.Has(config.RoleJanitor) {
		// Two connections: the lock's, and a spare while a lost one is replaced.
		if a.leaderPool, err = pg.Connect(ctx, a.cfg.LeaderDatabaseURL, "", func(c *pgxpool.Config) { c.MaxConns = 2 }); err != nil {
			return nil, nil, fmt.Errorf("AGENTQ_LEADER_DATABASE_URL: %w", err)
		}
	}
	if _, err := migrations.Up(ctx, pool); err != nil {
		return nil, nil, err
	}
	return pool, readStore, nil
}

// connectRedis connects to Redis unless the options gave a client, tracing its commands.
func (a *App) connectRedis(ctx context.Context, callTP trace.TracerProvider) error {
	if a.rdb != nil {
		return nil
	}
	c, err := redisx.Open(ctx, a.cfg.RedisURL, a.cfg.RedisClusterAddrs)
	if err != nil {
		return err
	}
	a.rdb, a.ownRedis = c, true
	// Commands without their arguments: those are tenant data. Without the
	// caller's file and line either: finding them walks the stack on every
	// command, a tenth of the process's CPU under load.
	// Commands and pipelines are traced by telemetry.RedisCommands and
	// RedisPipelines, which do nothing outside a sampled span; redisotel traces
	// the dials.
	if err := redisotel.InstrumentTracing(c, redisotel.WithTracerProvider(callTP), redisotel.WithDBStatement(false),
		redisotel.WithCallerEnabled(false), redisotel.WithCommandFilter(func(redis.Cmder) bool { return true }),
		redisotel.WithCommandsFilter(func([]redis.Cmder) bool { return true })); err != nil {
		a.log.Warn("redis tracing is off", "err", err)
	} else {
		telemetry.RedisCommands(callTP, c)
		c.AddHook(telemetry.RedisPipelines(callTP, c))
	}
	return nil
}

// newAPI builds the HTTP server over the domain services; readStore serves the
// reads that may lag.
func (a *App) newAPI(pool *pgxpool.Pool, readStore *store.Store) *web.Server {
	return web.New(web.Deps{
		Tenants: a.services.Tenants, APIKeys: a.services.Keys, Tasks: a.services.Tasks, HTTPAgents: a.services.Agents,
		Pools:    a.services.Pools,
		Audit:    a.services.Audit,
		Webhooks: a.services.Webhooks,
		Postgres: pool, Queue: a.sched, Redis: a.rdb, Keys: a.keys, Plans: a.plans, Admission: a.admission,
		Approvals: a.approvals,
		Events:    outbox.NewFeed(a.store), Rejections: a.rejections, Usage: a.services.Usage, UpgradeURL: a.cfg.UpgradeURL,
		Credentials: a.services.Credentials,
		AdminToken:  a.cfg.AdminToken, PanelSecret: a.cfg.PanelSecret, PanelFrameAncestors: a.cfg.PanelFrameAncestors,
		Archetype:   a.archetype,
		UsageExport: usage.NewRollups(readStore),
		Operator: operator.New(operator.Deps{
			Store: readStore, Scheduler: a.sched, Tenants: a.services.Tenants, Webhooks: a.services.Webhooks, Pools: a.services.Pools,
			Audit: a.services.Audit, Archetype: a.archetype,
		}),
		ListenAddr: a.cfg.HTTPAddr, ShutdownTimeout: a.cfg.ShutdownTimeout,
		OpsOnly: !a.cfg.Has(config.RoleAPI),
		Telemetry: web.Telemetry{
			Metrics:    a.tel.MetricsHandler(),
			Migrations: func(ctx context.Context) (bool, error) { return migrations.Pending(ctx, pool) },
		},
	})
}

// refusalFlushes are the flushes of admission's refusal counts to Postgres: those
// counted in Redis (the janitor's pass), and those this replica decided in process
// while Redis was unreachable (each API replica flushes its own).
func (a *App) refusalFlushes() (*rejections.Rejections, *rejections.LocalRejectionFlush) {
	r := &rejections.Rejections{
		Store: a.store, Counts: a.quotas, Shards: a.keys.Shards(), Plans: a.plans,
		Events: outbox.Events{UpgradeURL: a.cfg.UpgradeURL}, Local: a.admission, Archetype: a.archetype,
	}
	return r, rejections.NewLocalRejectionFlush(r, rejections.LocalRejectionFlushOptions{Archetype: a.archetype})
}

// roleServices lists the background services of the configured roles in the order
// Start documents.
func (a *App) roleServices() []startstop.Service {
	var svcs []startstop.Service
	if a.cfg.PprofAddr != "" {
		svcs = append(svcs, &telemetry.Pprof{Addr: a.cfg.PprofAddr, Archetype: a.archetype})
	}
	if a.cfg.Has(config.RoleWorker) {
		svcs = append(svcs, a.worker)
	}
	if a.cfg.Has(config.RoleScheduler) {
		svcs = append(svcs, a.dispatcher, a.recovery)
	}
	if a.cfg.Has(config.RoleJanitor) {
		svcs = append(svcs, a.janitor.Services()...)
	}
	if a.cfg.Has(config.RoleRelay) {
		svcs = append(svcs, a.relay)
	}
	if a.cfg.Has(config.RoleAPI) {
		svcs = append(svcs, a.admission, a.localRejections, a.api.CacheListener(), a.api)
	} else {
		svcs = append(svcs, a.api) // health, readiness and metrics only
	}
	return svcs
}

// Start runs the background services of the configured roles, in an order that
// follows what each needs of the ones before it; Stop and Shutdown stop them in the
// reverse order.
//
//   - worker: registers its capacity and consumes the task queue before anything
//     dispatches, and stops last, so running steps finish after dispatching stopped;
//   - scheduler: the dispatcher, then the sweep that re-pushes queued tasks missing
//     from Redis, then the pause watcher (paused tasks whose quota allows again go
//     back to their queues); tasks are dispatched only once workers may be there to
//     take them;
//   - janitor: the leader election, then the repairs of drift between Postgres and
//     Redis, which run only while this process leads; they stop before it gives up
//     the lead;
//   - relay: the webhook delivery of the usage events, which needs only Postgres;
//     it starts before the API so an endpoint created through it is served at
//     once, and on the way down it stops after the API, its sends in flight cut
//     short (their leases lapse and they are sent again);
//   - api: the degraded-mode guard, the flush of the refusals
//     the guard decided in process (its last flush runs on the way down, after the
//     HTTP server stopped) and the listener that keeps the key and tenant caches
//     current, then the HTTP server last, so that a request is accepted only once
//     what it uses runs, and on the way down new requests stop before anything else
//     does.
//
// The API listens on Config.HTTPAddr (see Addr). If a service fails to start, the
// ones started before it are stopped again and its error is returned. The services
// outlive ctx: only Stop or Shutdown ends them.
func (a *App) Start(ctx context.Context) error {
	ctx = context.WithoutCancel(ctx)
	if err := a.learnPublicBase(ctx); err != nil {
		return err
	}
	for i, svc := range a.svcs {
		if err := svc.Start(ctx); err != nil {
			stopAll(a.svcs[:i])
			return err
		}
	}
	a.advertiseAPIAddress(ctx)
	httpAddr := ""
	if addr := a.Addr(); addr != nil {
		httpAddr = addr.String()
	}
	a.log.Info("agentq started", "roles", a.cfg.Roles, "http", httpAddr)
	return nil
}

// stopAll stops services in the reverse of their start order.
func stopAll(svcs []startstop.Service) {
	for i := len(svcs) - 1; i >= 0; i-- {
		svcs[i].Stop()
	}
}

// stepLimits are what the worker counts a task's steps against (runtime.Limits): its
// tenant's period quotas and leases in the limit store, and its agent's model pool.
type stepLimits struct {
	*admission.Store
	*capacity.Pools
}

// cachedTenants reads the worker's tenants through the tenant service's cache: a
// tenant changed through this process is read fresh at once, one changed elsewhere
// within the cache's TTL (a second), as the API reads it.
type cachedTenants struct{ s *tenants.Service }

func (c cachedTenants) GetTenant(ctx context.Context, id string) (store.Tenant, error) {
	return c.s.Lookup(ctx, id)
}

// lateStarts is the janitor's late-start pass over the tasks still waiting for their
// first start.
type lateStarts struct {
	c  *outbox.Commitments
	st *store.Store
}

// lateStartsPerRun bounds the lapsed waiting tasks one run looks at, of the tenants
// whose plan commits (outbox.Commitments.Waiting).
const lateStartsPerRun = 200

func (l lateStarts) WatchLateStarts(ctx context.Context) (checked, written int, err error) {
	return l.c.Waiting(ctx, l.st, lateStartsPerRun)
}

// maintenanceDeps are what the recovery sweep and the janitor work on.
func (a *App) maintenanceDeps() maintenance.Deps {
	leaderPool := a.store.Pool()
	if a.leaderPool != nil {
		leaderPool = a.leaderPool
	}
	return maintenance.Deps{
		Store: a.store, Pool: leaderPool, Redis: a.rdb, Keys: a.keys,
		Scheduler: a.sched, Quotas: a.quotas, Plans: a.plans, Lifecycle: a.lifecycle, Trees: a.trees,
		Usage: usage.NewLedger(a.store), Rejections: a.rejections, Corrections: a.store, Webhooks: a.store,
		LateStarts: lateStarts{a.commitments, a.store}, Pauses: a.services.Tasks,
		Archetype: a.archetype,
	}
}

// Agents is the registry of the agents this process runs: the one Options.Agents
// gave, or the one New made with the built-in sim agent. Register Go handlers on it
// before Start.
func (a *App) Agents() *runtime.Registry { return a.agents }

// Addr is the bound HTTP address (nil before Start): the API's, or, in a process
// without the api role, that of its health, readiness and metrics endpoints.
func (a *App) Addr() net.Addr { return a.api.Addr() }

// ReloadKeys drops the API's cached API keys, tenants and admin credentials, so that
// the next request reads them from Postgres (agentq serve does it on SIGHUP). Changes made through
// the App, the admin API or `agentq admin` need no reload: every replica hears of
// them. Without the api role it does nothing.
func (a *App) ReloadKeys() {
	if a.cfg.Has(config.RoleAPI) {
		a.api.ReloadKeys()
	}
}

// Stop is Shutdown without a deadline: it returns once every service stopped and the
// connections the App owns are closed. Running steps get up to
// Config.ShutdownTimeout to finish.
func (a *App) Stop() { _ = a.Shutdown(context.Background()) }

// Shutdown stops the services in the reverse of their start order: the API stops
// accepting requests and drains them, dispatching stops, and running steps finish up
// to Config.ShutdownTimeout; then it closes the connections it owns. If ctx ends
// first, Shutdown returns its error and the rest of the stop (and the closing of the
// connections) carries on in the background.
func (a *App) Shutdown(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		stopAll(a.svcs)
		a.close()
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("agentq: shutdown: %w", ctx.Err())
	}
}

func replicaID() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), uuid.NewString()[:8])
}

func (a *App) close() {
	if a.tel != nil {
		// What the exporters still hold is flushed, within a bound.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := a.tel.Shutdown(ctx); err != nil {
			a.log.Warn("flushing telemetry at shutdown failed", "err", err)
		}
		cancel()
	}
	if a.slotBatch != nil {
		a.slotBatch.Close() // the last requests' slot releases
	}
	if a.ownRedis && a.rdb != nil {
		_ = a.rdb.Close()
	}
	if a.ownPool && a.store != nil {
		a.store.Pool().Close()
	}
	if a.leaderPool != nil {
		a.leaderPool.Close()
	}
	if a.replicaPool != nil {
		a.replicaPool.Close()
	}
}
