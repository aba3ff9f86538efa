// Package config reads agentq's configuration from the environment.
package config

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

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

// Config is the process configuration as read from the environment. The library
// exports it as agentq.Config, which documents each field: the two must keep the
// same fields, in the same order, for the conversion between them to compile.
type Config struct {
	HTTPAddr            string        // AGENTQ_HTTP_ADDR
	RedisURL            string        // REDIS_URL
	RedisClusterAddrs   []string      // REDIS_CLUSTER_ADDRS
	DatabaseURL         string        // DATABASE_URL
	LeaderDatabaseURL   string        // AGENTQ_LEADER_DATABASE_URL
	ReplicaDatabaseURL  string        // DATABASE_REPLICA_URL
	AdminToken          string        // AGENTQ_ADMIN_TOKEN
	RedisPrefix         string        // AGENTQ_REDIS_PREFIX
	Shards              int           // AGENTQ_SHARDS
	WorkerConcurrency   int           // AGENTQ_WORKER_CONCURRENCY
	Prefetch            int           // AGENTQ_PREFETCH
	WorkerFetchers      int           // AGENTQ_WORKER_FETCHERS
	ShutdownTimeout     time.Duration // AGENTQ_SHUTDOWN_TIMEOUT
	PlansFile           string        // AGENTQ_PLANS_FILE
	UpgradeURL          string        // AGENTQ_UPGRADE_URL
	Roles               []string
	RedisTimeout        time.Duration  // AGENTQ_REDIS_TIMEOUT: admission's Redis deadline
	AgentSecret         string         // AGENTQ_AGENT_SECRET: signs steps of HTTP agents registered before per-agent secrets, until rotated
	JanitorInterval     time.Duration  // AGENTQ_JANITOR_INTERVAL
	PanelSecret         string         // AGENTQ_PANEL_SECRET: signs the tenant panel's links
	PanelFrameAncestors string         // AGENTQ_PANEL_FRAME_ANCESTORS: who may embed the panel (CSP frame-ancestors)
	PprofAddr           string         // AGENTQ_PPROF_ADDR
	WebhookAllowNets    []netip.Prefix // AGENTQ_WEBHOOK_ALLOW_NETS
	WebhookRetention    time.Duration  // AGENTQ_WEBHOOK_RETENTION: how long finished webhook deliveries are kept

	// Global limit values (nil = the plan catalogue's); see quotas.Globals.
	RateKeyRPS, RateKeyBurst, RateTenantRPS, RateTenantBurst, TenantMaxInflight *float64
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
	str("AGENTQ_REDIS_PREFIX", &c.RedisPrefix)
	str("AGENTQ_PLANS_FILE", &c.PlansFile)
	str("AGENTQ_UPGRADE_URL", &c.UpgradeURL)
	str("AGENTQ_AGENT_SECRET", &c.AgentSecret)
	str("AGENTQ_PANEL_SECRET", &c.PanelSecret)
	str("AGENTQ_PANEL_FRAME_ANCESTORS", &c.PanelFrameAncestors)
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

// Has reports whether the process runs role.
func (c Config) Has(role string) bool { return slices.Contains(c.Roles, role) }
