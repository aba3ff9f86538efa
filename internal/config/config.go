// Package config reads agentq's configuration from the environment.
package config

import (
	"fmt"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/netguard"
)

// Roles a process can run.
const (
	RoleAPI       = "api"
	RoleScheduler = "scheduler"
	RoleWorker    = "worker"
	RoleJanitor   = "janitor"
	RoleRelay     = "relay"
)

// AllRoles is what `agentq serve` runs without --roles.
var AllRoles = []string{RoleAPI, RoleScheduler, RoleWorker, RoleJanitor, RoleRelay}

// Config is a process's configuration, which the library exports as agentq.Config.
// Start from Defaults (agentq.DefaultConfig) or FromEnv (agentq.ConfigFromEnv) and
// change what differs: the zero Config is not the defaults, and agentq.New refuses it. Each
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
	// AdminToken is the bootstrap admin credential: the bearer token of the
	// credential named "admin", with the admin role. AGENTQ_ADMIN_TOKEN, default ""
	// (none: the admin API then accepts only AdminTokens and the credentials stored in
	// Postgres, and refuses everything when there are none).
	AdminToken string
	// AdminTokens are named admin credentials with their roles, each a bearer token of
	// the admin API and of the operator view's sign-in. AGENTQ_ADMIN_TOKENS, as
	// name:role:token entries separated by commas, default none.
	AdminTokens []AdminCredential
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
	// PublicURL is the API's address as people reach it (scheme://host[:port]): the
	// approval links of paused tasks start with it. AGENTQ_PUBLIC_URL, default
	// "": made from HTTPAddr, "http://host:port" with "localhost" for an empty or
	// unspecified host (PublicBase). The
	// links are signed with the panel links' secret, so every process that runs
	// tasks must share AGENTQ_PANEL_SECRET (or the admin token) with the API. A
	// process with the worker role and not the api role refuses to start without one
	// of those secrets; without PublicURL it takes the address a process serving the
	// API advertised when it started (its PublicURL, or its listener's address when
	// bound to a host), and refuses to start when none did.
	PublicURL string
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

// ClusterShards is the number of shards on a Redis Cluster unless AGENTQ_SHARDS says
// otherwise.
const ClusterShards = 64

// Defaults returns the configuration used when nothing is set.
func Defaults() Config {
	return Config{
		HTTPAddr:            "127.0.0.1:8080",
		RedisURL:            "redis://127.0.0.1:6379/0",
		DatabaseURL:         "postgres://postgres@127.0.0.1:5432/agentq?sslmode=disable",
		RedisPrefix:         "aq:",
		Shards:              1,
		WorkerConcurrency:   20,
		Prefetch:            10,
		WorkerFetchers:      4,
		ShutdownTimeout:     10 * time.Second,
		RedisTimeout:        80 * time.Millisecond,
		JanitorInterval:     5 * time.Minute,
		WebhookRetention:    30 * 24 * time.Hour,
		PanelFrameAncestors: "*",
		UpgradeURL:          "https://agentq.example/upgrade",
		Roles:               slices.Clone(AllRoles),
	}
}

// FromEnv overlays the environment on Defaults.
func FromEnv() (Config, error) {
	c := Defaults()
	str := func(name string, dst *string) {
		if v, ok := os.LookupEnv(name); ok && v != "" {
			*dst = v
		}
	}
	var errs []string
	num := func(name string, dst *int, min int) {
		if v, ok := os.LookupEnv(name); ok && v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < min {
				errs = append(errs, fmt.Sprintf("%s=%q: want an integer >= %d", name, v, min))
				return
			}
			*dst = n
		}
	}
	str("AGENTQ_HTTP_ADDR", &c.HTTPAddr)
	str("REDIS_URL", &c.RedisURL)
	str("DATABASE_URL", &c.DatabaseURL)
	str("AGENTQ_LEADER_DATABASE_URL", &c.LeaderDatabaseURL)
	str("DATABASE_REPLICA_URL", &c.ReplicaDatabaseURL)
	str("AGENTQ_ADMIN_TOKEN", &c.AdminToken)
	if v := os.Getenv("AGENTQ_ADMIN_TOKENS"); v != "" {
		creds, err := ParseAdminTokens(v)
		if err != nil {
			errs = append(errs, err.Error())
		}
		c.AdminTokens = creds
	}
	str("AGENTQ_REDIS_PREFIX", &c.RedisPrefix)
	str("AGENTQ_PLANS_FILE", &c.PlansFile)
	str("AGENTQ_UPGRADE_URL", &c.UpgradeURL)
	str("AGENTQ_AGENT_SECRET", &c.AgentSecret)
	str("AGENTQ_PANEL_SECRET", &c.PanelSecret)
	str("AGENTQ_PANEL_FRAME_ANCESTORS", &c.PanelFrameAncestors)
	str("AGENTQ_PUBLIC_URL", &c.PublicURL)
	if v := os.Getenv("REDIS_CLUSTER_ADDRS"); v != "" {
		for a := range strings.SplitSeq(v, ",") {
			if a = strings.TrimSpace(a); a != "" {
				c.RedisClusterAddrs = append(c.RedisClusterAddrs, a)
			}
		}
		// Spread the scheduler's shared structures over many slots, so no one node
		// carries every dispatch.
		c.Shards = ClusterShards
	}
	num("AGENTQ_SHARDS", &c.Shards, 1)
	num("AGENTQ_WORKER_CONCURRENCY", &c.WorkerConcurrency, 1)
	num("AGENTQ_PREFETCH", &c.Prefetch, 0)
	num("AGENTQ_WORKER_FETCHERS", &c.WorkerFetchers, 1)
	dur := func(name string, dst *time.Duration) {
		if v := os.Getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				errs = append(errs, fmt.Sprintf("%s=%q: want a duration such as 10s", name, v))
				return
			}
			*dst = d
		}
	}
	dur("AGENTQ_SHUTDOWN_TIMEOUT", &c.ShutdownTimeout)
	dur("AGENTQ_REDIS_TIMEOUT", &c.RedisTimeout)
	dur("AGENTQ_JANITOR_INTERVAL", &c.JanitorInterval)
	dur("AGENTQ_WEBHOOK_RETENTION", &c.WebhookRetention)
	str("AGENTQ_PPROF_ADDR", &c.PprofAddr)
	if v := os.Getenv("AGENTQ_WEBHOOK_ALLOW_NETS"); v != "" {
		nets, err := netguard.ParseNets(v)
		if err != nil {
			errs = append(errs, fmt.Sprintf("AGENTQ_WEBHOOK_ALLOW_NETS=%q: want comma-separated CIDRs such as 10.1.0.0/16", v))
		}
		c.WebhookAllowNets = nets
	}
	limit := func(name string, dst **float64) {
		if v := os.Getenv(name); v != "" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f < 0 {
				errs = append(errs, fmt.Sprintf("%s=%q: want a number >= 0 (0 disables)", name, v))
				return
			}
			*dst = &f
		}
	}
	limit("AGENTQ_RATE_KEY_RPS", &c.RateKeyRPS)
	limit("AGENTQ_RATE_KEY_BURST", &c.RateKeyBurst)
	limit("AGENTQ_RATE_TENANT_RPS", &c.RateTenantRPS)
	limit("AGENTQ_RATE_TENANT_BURST", &c.RateTenantBurst)
	limit("AGENTQ_TENANT_MAX_INFLIGHT", &c.TenantMaxInflight)
	if len(errs) > 0 {
		return c, fmt.Errorf("config: %s", strings.Join(errs, "; "))
	}
	return c, nil
}

// ParseRoles parses a comma-separated --roles value.
func ParseRoles(s string) ([]string, error) {
	var roles []string
	for _, r := range strings.Split(s, ",") {
		r = strings.TrimSpace(r)
		if r == "" {
			continue
		}
		if !slices.Contains(AllRoles, r) {
			return nil, fmt.Errorf("config: unknown role %q (want %s)", r, strings.Join(AllRoles, ", "))
		}
		if !slices.Contains(roles, r) {
			roles = append(roles, r)
		}
	}
	if len(roles) == 0 {
		return nil, fmt.Errorf("config: --roles names no role")
	}
	return roles, nil
}

// Error is a configuration agentq.New refuses; Field names the Config field.
type Error struct {
	Field   string
	Message string
}

// Error names the field and says what is wrong with it.
func (e *Error) Error() string { return "agentq: config: " + e.Field + " " + e.Message }

// Validate reports the first field agentq.New would refuse, as an *Error.
func (c Config) Validate() error { return c.Check(false, false) }

// Check is Validate; with haveRedis (havePool) a connection is given, so the URL it
// would be made from may be empty.
func (c Config) Check(haveRedis, havePool bool) error {
	bad := func(field, format string, args ...any) error {
		return &Error{Field: field, Message: fmt.Sprintf(format, args...)}
	}
	if len(c.Roles) == 0 {
		return bad("Roles", "names no role (want some of %s)", strings.Join(AllRoles, ", "))
	}
	for i, r := range c.Roles {
		if !slices.Contains(AllRoles, r) {
			return bad("Roles", "holds unknown role %q (want some of %s)", r, strings.Join(AllRoles, ", "))
		}
		if slices.Contains(c.Roles[:i], r) {
			return bad("Roles", "names %q twice", r)
		}
	}
	if c.Has(RoleAPI) && c.HTTPAddr == "" {
		return bad("HTTPAddr", "is empty; the api role needs an address to listen on (host:port)")
	}
	if c.PublicURL != "" {
		if u, err := url.Parse(c.PublicURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("PublicURL", "is not an http(s) URL (https://agentq.example.com)")
		}
	}
	if err := c.checkApprovalLinks(); err != nil {
		return err
	}
	if err := c.checkAdminTokens(); err != nil {
		return err
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

// checkApprovalLinks refuses a process that pauses tasks (the worker role) without
// serving the API and without a secret it shares with the API: the approval links it
// writes into a pause's event are checked by another process, so they must be signed
// with PanelSecret or the admin token, not a key made up at start. Where those links
// point (PublicURL, or the address an API process advertised) is settled at start.
func (c Config) checkApprovalLinks() error {
	if !c.Has(RoleWorker) || c.Has(RoleAPI) {
		return nil
	}
	if c.PanelSecret == "" && c.AdminToken == "" {
		return &Error{Field: "PanelSecret", Message: "is empty and so is AdminToken; a worker without the api role signs the approval links " +
			"of paused tasks for the API to verify: set AGENTQ_PANEL_SECRET (or AGENTQ_ADMIN_TOKEN) to the API's value"}
	}
	return nil
}

// Has reports whether the process runs role.
func (c Config) Has(role string) bool { return slices.Contains(c.Roles, role) }

// PublicBase is the API's public base URL: PublicURL, or one made from HTTPAddr.
func (c Config) PublicBase() string {
	if c.PublicURL != "" {
		return strings.TrimRight(c.PublicURL, "/")
	}
	host, port, err := net.SplitHostPort(c.HTTPAddr)
	if err != nil {
		return "http://localhost:8080"
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port)
}
