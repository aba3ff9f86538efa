// Package agentq is the multi-tenant runtime for AI-agent tasks, usable as a library:
// New wires the API, the fair scheduler and the workers on one Redis and one Postgres,
// and Start runs the roles the configuration names. cmd/agentq is a thin CLI over it.
package agentq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

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
	recovery    *maintenance.Recovery
	Janitor     *maintenance.Janitor
	asynqClient *asynq.Client
	ownRedis    bool
	ownPool     bool
	addr        net.Addr
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
	a.Janitor = maintenance.NewJanitor(a.maintenanceDeps(), maintenance.JanitorConfig{Interval: a.cfg.JanitorInterval})
	a.API = web.New(web.Deps{
		Tenants: a.services.Tenants, APIKeys: a.services.Keys, Tasks: a.services.Tasks, HTTPAgents: a.services.Agents,
		Postgres: pool, Queue: a.Scheduler, Redis: a.Redis, Keys: a.Keys, Plans: a.Plans, Admission: a.Admission,
		UpgradeURL: a.cfg.UpgradeURL, AdminToken: a.cfg.AdminToken, Logger: a.log,
	})
	return a, nil
}

// Start runs the configured roles. The API listens on Config.HTTPAddr.
func (a *App) Start(ctx context.Context) error {
	if a.cfg.Has(config.RoleWorker) {
		if err := a.Worker.Start(ctx); err != nil {
			return err
		}
	}
	if a.cfg.Has(config.RoleScheduler) {
		a.Dispatcher.Start(context.WithoutCancel(ctx))
		a.recovery.Start(context.WithoutCancel(ctx))
	}
	if a.cfg.Has(config.RoleJanitor) {
		a.Janitor.Start(context.WithoutCancel(ctx))
	}
	if a.cfg.Has(config.RoleAPI) {
		a.Quotas.Start(context.WithoutCancel(ctx), a.cfg.RedisTimeout)
		a.Admission.Start(context.WithoutCancel(ctx))
		addr, err := a.API.Start(context.WithoutCancel(ctx), a.cfg.HTTPAddr)
		if err != nil {
			return err
		}
		a.addr = addr
	}
	httpAddr := ""
	if a.addr != nil {
		httpAddr = a.addr.String()
	}
	a.log.Info("agentq started", "roles", a.cfg.Roles, "http", httpAddr)
	return nil
}

// maintenanceDeps are what the recovery sweep and the janitor work on.
func (a *App) maintenanceDeps() maintenance.Deps {
	return maintenance.Deps{
		Store: a.Store, Pool: a.Store.Pool(), Redis: a.Redis, Keys: a.Keys,
		Scheduler: a.Scheduler, Quotas: a.Quotas, Plans: a.Plans, Logger: a.log,
	}
}

// Addr is the API's bound address (nil without the api role).
func (a *App) Addr() net.Addr { return a.addr }

// Shutdown stops accepting requests, stops dispatching, lets running steps finish up
// to the configured shutdown timeout, and closes the connections it owns.
func (a *App) Shutdown(ctx context.Context) error {
	var errs []error
	if a.cfg.Has(config.RoleAPI) {
		if err := a.API.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("api: %w", err))
		}
		a.Admission.Stop()
		a.Quotas.Stop()
	}
	if a.cfg.Has(config.RoleJanitor) {
		a.Janitor.Stop()
	}
	if a.cfg.Has(config.RoleScheduler) {
		a.recovery.Stop()
		a.Dispatcher.Stop()
	}
	if a.cfg.Has(config.RoleWorker) {
		a.Worker.Stop(ctx)
	}
	a.close()
	return errors.Join(errs...)
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
