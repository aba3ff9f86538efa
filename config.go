package agentq

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/config"
)

// Config is a process's configuration. Start from DefaultConfig (or ConfigFromEnv) and
// change what differs: the zero Config is not the defaults, and New refuses it. Each
// field names the environment variable ConfigFromEnv reads it from, and its default.
type Config struct {
	// HTTPAddr is the address the API listens on, host:port; port 0 picks a free
	// one (see App.Addr). AGENTQ_HTTP_ADDR, default "127.0.0.1:8080".
	HTTPAddr string
	// RedisURL is the Redis to connect to, unless Options.Redis is given. REDIS_URL,
	// default "redis://127.0.0.1:6379/0".
	RedisURL string
	// RedisClusterAddrs, when not empty, are nodes of a Redis Cluster to use instead
	// of RedisURL (host:port; the client discovers the other nodes). Shards then
	// defaults to 64. REDIS_CLUSTER_ADDRS, comma-separated, default none.
	RedisClusterAddrs []string
	// DatabaseURL is the Postgres to connect to, unless Options.Pool is given; its
	// schema is migrated by New. DATABASE_URL, default
	// "postgres://postgres@127.0.0.1:5432/agentq?sslmode=disable".
	DatabaseURL string
	// LeaderDatabaseURL, when set, is a direct (session) connection to the same
	// Postgres for the janitor's leader election, whose advisory lock lives as long as
	// its session: set it when DATABASE_URL points at PgBouncer in transaction mode.
	// AGENTQ_LEADER_DATABASE_URL, default "" (DATABASE_URL's pool).
	LeaderDatabaseURL string
	// ReplicaDatabaseURL, when set, is a read replica of the Postgres that the API
	// sends its long read-only queries to, which may lag by the replica's delay: the
	// usage export and the operator view. DATABASE_REPLICA_URL, default ""
	// (DatabaseURL).
	ReplicaDatabaseURL string
	// AdminToken is the bearer token of the admin API; empty refuses every admin
	// request. AGENTQ_ADMIN_TOKEN, default "".
	AdminToken string
	// RedisPrefix starts every Redis key of the deployment, so that several can
	// share one Redis. AGENTQ_REDIS_PREFIX, default "aq:".
	RedisPrefix string
	// Shards is the number of shards tenants' Redis keys are spread over, each
	// under a hash tag of its own (one Redis Cluster slot); every process of a
	// deployment must agree. AGENTQ_SHARDS, default 1 (64 with RedisClusterAddrs).
	Shards int
	// WorkerConcurrency is how many task steps a worker process runs at once.
	// AGENTQ_WORKER_CONCURRENCY, default 20.
	WorkerConcurrency int
	// Prefetch is how many tasks dispatch may hand out ahead of free worker slots;
	// 0 hands out only what free slots can start. AGENTQ_PREFETCH, default 10.
	Prefetch int
	// WorkerFetchers is how many asynq servers share a worker process's slots, each
	// fetching tasks on its own (at most WorkerConcurrency of them): one fetch loop
	// capped how fast a loaded worker took tasks in. AGENTQ_WORKER_FETCHERS,
	// default 4.
	WorkerFetchers int
	// ShutdownTimeout bounds how long Shutdown lets running steps finish.
	// AGENTQ_SHUTDOWN_TIMEOUT, default 10s.
	ShutdownTimeout time.Duration
	// PlansFile is a YAML plan catalogue replacing the built-in one (free, pro,
	// enterprise); empty is the built-in one. AGENTQ_PLANS_FILE, default "".
	PlansFile string
	// UpgradeURL is the link a "quota exceeded" answer points tenants to.
	// AGENTQ_UPGRADE_URL, default "https://agentq.example/upgrade".
	UpgradeURL string
	// Roles are the roles the process runs: RoleAPI, RoleScheduler, RoleWorker,
	// RoleJanitor, RoleRelay. `agentq serve --roles`, default all five.
	Roles []string
	// RedisTimeout bounds each admission call to Redis; a call past it is answered
	// by the degraded-mode rules. AGENTQ_REDIS_TIMEOUT, default 80ms.
	RedisTimeout time.Duration
	// AgentSecret signs the steps of HTTP agents registered before agents had
	// signing secrets of their own, until each is rotated. AGENTQ_AGENT_SECRET,
	// default "".
	AgentSecret string
	// JanitorInterval is how often the janitor role repairs drift between Postgres
	// and Redis. AGENTQ_JANITOR_INTERVAL, default 5m.
	JanitorInterval time.Duration
	// PanelSecret signs the tenant panel's links (HMAC-SHA256 under a key derived
	// from it with HKDF). AGENTQ_PANEL_SECRET, default "": the key is then derived
	// from AdminToken, so links die when the admin token changes; with neither set it
	// is random per process and links die with it.
	PanelSecret string
	// PanelFrameAncestors is the tenant panel's CSP frame-ancestors: the origins
	// that may embed it in an iframe. AGENTQ_PANEL_FRAME_ANCESTORS, default "*" (any:
	// the signed link is the credential).
	PanelFrameAncestors string
	// PprofAddr, when set, is where net/http/pprof is served, on a listener of its
	// own that starts and stops with the App; bind it to localhost or an admin
	// network only. AGENTQ_PPROF_ADDR, default "" (not served).
	PprofAddr string
	// WebhookAllowNets are networks webhook deliveries may reach although they are
	// loopback, link-local, private (RFC 1918), CGNAT or unique local, which are
	// otherwise refused when the relay connects, and refused at registration when
	// the URL's host is such an address. AGENTQ_WEBHOOK_ALLOW_NETS, comma-separated
	// CIDRs, default none (`agentq dev` allows loopback).
	WebhookAllowNets []netip.Prefix
	// WebhookRetention is how long the janitor keeps webhook deliveries that finished
	// (succeeded, failed or were cancelled) and their attempts; older ones are
	// deleted in small batches. Pending deliveries are kept however old.
	// AGENTQ_WEBHOOK_RETENTION, default 720h (30 days).
	WebhookRetention time.Duration

	// RateKeyRPS, when set, replaces every plan's per-key request rate (requests a
	// second; 0 disables the limit). AGENTQ_RATE_KEY_RPS, default nil (the plans').
	RateKeyRPS *float64
	// RateKeyBurst, when set, replaces every plan's per-key burst.
	// AGENTQ_RATE_KEY_BURST, default nil.
	RateKeyBurst *float64
	// RateTenantRPS, when set, replaces every plan's per-tenant request rate.
	// AGENTQ_RATE_TENANT_RPS, default nil.
	RateTenantRPS *float64
	// RateTenantBurst, when set, replaces every plan's per-tenant burst.
	// AGENTQ_RATE_TENANT_BURST, default nil.
	RateTenantBurst *float64
	// TenantMaxInflight, when set, replaces every plan's limit of a tenant's
	// requests in progress at once. AGENTQ_TENANT_MAX_INFLIGHT, default nil.
	TenantMaxInflight *float64
}

// Roles a process can run (Config.Roles), the names `agentq serve --roles` takes.
const (
	// RoleAPI ("api") serves the HTTP API and admits tasks.
	RoleAPI = config.RoleAPI
	// RoleScheduler ("scheduler") dispatches queued tasks to the workers, each
	// tenant's share by its weight, and re-pushes queued tasks missing from Redis.
	RoleScheduler = config.RoleScheduler
	// RoleWorker ("worker") runs the agents' steps.
	RoleWorker = config.RoleWorker
	// RoleJanitor ("janitor") repairs drift between Postgres and Redis while it
	// leads the deployment's janitors.
	RoleJanitor = config.RoleJanitor
	// RoleRelay ("relay") delivers the usage events to the webhook endpoints; any
	// number of relays share the work, and none sends a delivery another is sending.
	RoleRelay = config.RoleRelay
)

// DefaultConfig is the configuration used when nothing is set: every role, local
// Redis and Postgres.
func DefaultConfig() Config { return Config(config.Defaults()) }

// ConfigFromEnv overlays the environment (AGENTQ_*, REDIS_URL, DATABASE_URL) on
// DefaultConfig.
func ConfigFromEnv() (Config, error) {
	c, err := config.FromEnv()
	return Config(c), err
}

// ConfigError is a configuration New refuses; Field names the Config field.
type ConfigError struct {
	Field   string
	Message string
}

// Error names the field and says what is wrong with it.
func (e *ConfigError) Error() string { return "agentq: config: " + e.Field + " " + e.Message }

// Validate reports the first field New would refuse, as a *ConfigError.
func (c Config) Validate() error { return c.validate(false, false) }

// validate is Validate; with haveRedis (havePool) a connection is given, so the URL
// it would be made from may be empty.
func (c Config) validate(haveRedis, havePool bool) error {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: field, Message: fmt.Sprintf(format, args...)}
	}
	if len(c.Roles) == 0 {
		return bad("Roles", "names no role (want some of %s)", strings.Join(config.AllRoles, ", "))
	}
	for i, r := range c.Roles {
		if !slices.Contains(config.AllRoles, r) {
			return bad("Roles", "holds unknown role %q (want some of %s)", r, strings.Join(config.AllRoles, ", "))
		}
		if slices.Contains(c.Roles[:i], r) {
			return bad("Roles", "names %q twice", r)
		}
	}
	if c.Has(RoleAPI) && c.HTTPAddr == "" {
		return bad("HTTPAddr", "is empty; the api role needs an address to listen on (host:port)")
	}
	// The URLs are parsed as the connections will parse them; the parsers' errors
	// are not shown, since they may quote a password.
	if !haveRedis {
		if c.RedisURL == "" {
			return bad("RedisURL", "is empty")
		}
		if _, err := redis.ParseURL(c.RedisURL); err != nil {
			return bad("RedisURL", "is not a Redis URL (redis://, rediss:// or unix://)")
		}
	}
	if !havePool {
		if c.DatabaseURL == "" {
			return bad("DatabaseURL", "is empty")
		}
		if _, err := pgxpool.ParseConfig(c.DatabaseURL); err != nil {
			return bad("DatabaseURL", "is not a Postgres connection URL (postgres://user@host:5432/db)")
		}
	}
	switch {
	case c.RedisPrefix == "":
		return bad("RedisPrefix", "is empty; every deployment's keys need a prefix of their own")
	case c.Shards < 1:
		return bad("Shards", "is %d; want at least 1", c.Shards)
	case c.WorkerConcurrency < 1:
		return bad("WorkerConcurrency", "is %d; want at least 1", c.WorkerConcurrency)
	case c.WorkerFetchers < 1:
		return bad("WorkerFetchers", "is %d; want at least 1", c.WorkerFetchers)
	case c.Prefetch < 0:
		return bad("Prefetch", "is %d; want 0 or more", c.Prefetch)
	case c.ShutdownTimeout <= 0:
		return bad("ShutdownTimeout", "is %v; want a duration above 0", c.ShutdownTimeout)
	case c.RedisTimeout <= 0:
		return bad("RedisTimeout", "is %v; want a duration above 0", c.RedisTimeout)
	case c.JanitorInterval <= 0:
		return bad("JanitorInterval", "is %v; want a duration above 0", c.JanitorInterval)
	case c.WebhookRetention <= 0:
		return bad("WebhookRetention", "is %v; want a duration above 0", c.WebhookRetention)
	}
	for _, g := range []struct {
		name string
		v    *float64
	}{
		{"RateKeyRPS", c.RateKeyRPS}, {"RateKeyBurst", c.RateKeyBurst}, {"RateTenantRPS", c.RateTenantRPS},
		{"RateTenantBurst", c.RateTenantBurst}, {"TenantMaxInflight", c.TenantMaxInflight},
	} {
		if g.v != nil && (*g.v < 0 || math.IsNaN(*g.v) || math.IsInf(*g.v, 0)) {
			return bad(g.name, "is %v; want a number of 0 or more (0 disables the limit), or nil for the plans' values", *g.v)
		}
	}
	return nil
}

// Has reports whether the configuration runs role.
func (c Config) Has(role string) bool { return slices.Contains(c.Roles, role) }
