// Package agentq is the multi-tenant runtime for AI-agent tasks, usable as a library:
// New wires the API, the fair scheduler and the workers on one Redis and one Postgres,
// and Start runs the roles the configuration names. cmd/agentq is a thin CLI over it.
package agentq

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/riverqueue/river/rivershared/startstop"

	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/maintenance"
	"github.com/agentq/agentq/internal/pg"
	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/services"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/migrations"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/runtime"
	"github.com/agentq/agentq/scheduler"
	"github.com/agentq/agentq/web"
)

// Options configure an App. Redis and Pool may be given (tests, embedding); otherwise
// New connects with Config's URLs and owns the connections.
type Options struct {
	Config Config
	Logger *slog.Logger
	Redis  redis.UniversalClient
	Pool   *pgxpool.Pool
	// Agents holds the executors; nil gets a registry with the built-in sim agent.
	// Register Go handlers on it before Start.
	Agents *runtime.Registry
	// DispatchFallback is the dispatcher's timer between wake-ups (default 1s).
	DispatchFallback time.Duration
	// TaskCheckInterval is how often idle asynq workers look for work (default 10ms:
	// asynq's 1 s would add up to a second to every dispatch into an idle pool).
	TaskCheckInterval time.Duration
	// RecoveryEvery is the interval of the sweep that re-pushes queued tasks missing
	// from Redis (default 30s).
	RecoveryEvery time.Duration
}

// App is one agentq process.
type App struct {
	cfg        config.Config
	log        *slog.Logger
	Store      *store.Store
	Redis      redis.UniversalClient
	Keys       rkeys.Keys
	Plans      *quotas.Catalogue
	Quotas     *quotas.Quotas
	Admission  *quotas.Guard
	Agents     *runtime.Registry
	Scheduler  *scheduler.Scheduler
	Dispatcher *scheduler.Dispatcher
	Worker     *runtime.Worker
	API        *web.Server

	services    *services.Services
	coalescer   *quotas.Coalescer
	recovery    *maintenance.Recovery
	janitor     *maintenance.Janitor
	svcs        []startstop.Service // the configured roles' services, in start order
	asynqClient *asynq.Client
	ownRedis    bool
	ownPool     bool
}

// New validates the configuration (refusing it with a *ConfigError that names the
// field), connects, migrates and builds every component. Nothing runs until Start.
func New(ctx context.Context, o Options) (*App, error) {
	if err := o.Config.validate(o.Redis != nil, o.Pool != nil); err != nil {
		return nil, err
	}
	a := &App{cfg: config.Config(o.Config), log: o.Logger, Redis: o.Redis, Agents: o.Agents}
	if a.log == nil {
		a.log = slog.Default()
	}
	if a.Agents == nil {
		a.Agents = runtime.NewRegistry()
	}
	if a.cfg.Has(config.RoleAPI) && a.cfg.AdminToken == "" {
		a.log.Warn("AGENTQ_ADMIN_TOKEN is not set: the admin API refuses every request")
	}
	plans, err := tenants.LoadCatalogue(a.cfg)
	if err != nil {
		return nil, err
	}
	a.Plans = plans

	pool := o.Pool
	if pool == nil {
		if pool, err = pg.Connect(ctx, a.cfg.DatabaseURL, ""); err != nil {
			return nil, err
		}
		a.ownPool = true
	}
	a.Store = store.New(pool)
	if _, err := migrations.Up(ctx, pool); err != nil {
		a.close()
		return nil, err
	}
	if a.Redis == nil {
		c, err := redisx.Connect(ctx, a.cfg.RedisURL)
		if err != nil {
			a.close()
			return nil, err
		}
		a.Redis, a.ownRedis = c, true
	}
	a.Keys = rkeys.New(a.cfg.RedisPrefix, a.cfg.Shards)
	a.Quotas = quotas.New(a.Redis, a.Keys, nil)
	a.coalescer = quotas.NewCoalescer(a.Quotas, a.cfg.RedisTimeout)
	a.Admission = quotas.NewGuard(a.Quotas, quotas.GuardOptions{Timeout: a.cfg.RedisTimeout, ID: replicaID(), Logger: a.log})
	a.Scheduler = scheduler.New(a.Redis, a.Keys, scheduler.Options{Prefetch: a.cfg.Prefetch})
	a.asynqClient = asynq.NewClientFromRedisClient(a.Redis)
	a.Dispatcher = scheduler.NewDispatcher(a.Scheduler, a.Redis, a.asynqClient, scheduler.DispatcherOptions{
		Logger: a.log, FallbackEvery: o.DispatchFallback,
	})
	queues := map[string]int{}
	for band, w := range scheduler.Bands {
		queues[a.Keys.AsynqQueue(band)] = w
	}
	tci := o.TaskCheckInterval
	if tci <= 0 {
		tci = 10 * time.Millisecond
	}
	a.services = services.New(services.Deps{
		Pool: pool, Plans: a.Plans, Redis: a.Redis, Keys: a.Keys, Scheduler: a.Scheduler,
		Admission: a.Admission, Agents: a.Agents, Logger: a.log,
	})
	a.Agents.Remote = a.services.Agents.Resolver([]byte(a.cfg.AgentSecret), a.log)
	a.Worker = runtime.NewWorker(tasks.NewLifecycle(a.Store, tasks.LifecycleOptions{}), a.Store, a.Agents, a.Scheduler, a.Quotas, a.Redis, runtime.WorkerOptions{
		Concurrency: a.cfg.WorkerConcurrency, Queues: queues, CancelChannel: a.Keys.CancelChannel(),
		ShutdownTimeout: a.cfg.ShutdownTimeout, TaskCheckInterval: tci, Logger: a.log,
		Plans: a.Plans, Events: a.Keys.TaskEvents,
	})
	a.recovery = maintenance.NewRecovery(a.maintenanceDeps(), maintenance.RecoveryConfig{
		Interval: o.RecoveryEvery, MinAge: maintenance.DefaultRecoveryMinAge,
	})
	a.janitor = maintenance.NewJanitor(a.maintenanceDeps(), maintenance.JanitorConfig{Interval: a.cfg.JanitorInterval})
	a.API = web.New(web.Deps{
		Tenants: a.services.Tenants, APIKeys: a.services.Keys, Tasks: a.services.Tasks, HTTPAgents: a.services.Agents,
		Postgres: pool, Queue: a.Scheduler, Redis: a.Redis, Keys: a.Keys, Plans: a.Plans, Admission: a.Admission,
		UpgradeURL: a.cfg.UpgradeURL, AdminToken: a.cfg.AdminToken, Logger: a.log,
		ListenAddr: a.cfg.HTTPAddr, ShutdownTimeout: a.cfg.ShutdownTimeout,
	})
	a.svcs = a.roleServices()
	return a, nil
}

// roleServices lists the background services of the configured roles in the order they
// start; Shutdown stops them in the reverse order. The order follows what each needs
// of the ones before it:
//
//   - worker: registers its capacity and consumes the asynq queues before anything
//     dispatches, and stops last, so running steps finish after dispatching stopped;
//   - dispatcher, then the recovery sweep (scheduler role): tasks move into asynq only
//     once workers may be there to take them;
//   - janitor (janitor role): the leader elector, then its passes, which run only
//     while it leads; the passes stop before the elector gives up its lock;
//   - API (api role): admission coalescing, the degraded-mode guard and the cache
//     listener, then the HTTP server last, so a request is accepted only once what it
//     uses runs, and on the way down new requests stop before anything else does.
func (a *App) roleServices() []startstop.Service {
	var svcs []startstop.Service
	if a.cfg.Has(config.RoleWorker) {
		svcs = append(svcs, a.Worker)
	}
	if a.cfg.Has(config.RoleScheduler) {
		svcs = append(svcs, a.Dispatcher, a.recovery)
	}
	if a.cfg.Has(config.RoleJanitor) {
		svcs = append(svcs, a.janitor.Services()...)
	}
	if a.cfg.Has(config.RoleAPI) {
		svcs = append(svcs, a.coalescer, a.Admission, a.API.CacheListener(), a.API)
	}
	return svcs
}

// Start runs the configured roles' services (see services for their order). The API
// listens on Config.HTTPAddr. If a service fails to start, the ones started before it
// are stopped again and its error is returned. Services outlive ctx: only Shutdown
// stops them, in order.
func (a *App) Start(ctx context.Context) error {
	ctx = context.WithoutCancel(ctx)
	for i, svc := range a.svcs {
		if err := svc.Start(ctx); err != nil {
			stopAll(a.svcs[:i])
			return err
		}
	}
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

// maintenanceDeps are what the recovery sweep and the janitor work on.
func (a *App) maintenanceDeps() maintenance.Deps {
	return maintenance.Deps{
		Store: a.Store, Pool: a.Store.Pool(), Redis: a.Redis, Keys: a.Keys,
		Scheduler: a.Scheduler, Quotas: a.Quotas, Plans: a.Plans, Logger: a.log,
	}
}

// Addr is the API's bound address (nil without the api role, or before Start).
func (a *App) Addr() net.Addr {
	if !a.cfg.Has(config.RoleAPI) {
		return nil
	}
	return a.API.Addr()
}

// Shutdown stops the services in the reverse of their start order: the API stops
// accepting requests and drains them, dispatching stops, and running steps finish up
// to the configured shutdown timeout; then it closes the connections it owns. If ctx
// ends first, Shutdown returns its error and the rest of the stop (and the closing of
// the connections) carries on in the background.
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
	if a.ownRedis && a.Redis != nil {
		_ = a.Redis.Close()
	}
	if a.ownPool && a.Store != nil {
		a.Store.Pool().Close()
	}
}
