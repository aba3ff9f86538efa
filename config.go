package agentq

import "github.com/agentq/agentq/internal/config"

// Config is a process's configuration. Start from DefaultConfig (or ConfigFromEnv)
// and change what differs: the zero Config is not the defaults, and New refuses it.
// Each field names the environment variable ConfigFromEnv reads it from, and its
// default (go doc github.com/agentq/agentq/internal/config.Config lists them).
type Config = config.Config

// AdminCredential is a named admin credential of Config.AdminTokens: a name, a role
// (agentqtype.RoleAdmin, RoleOperator, RoleFinance or RoleViewer) and its bearer token.
// Printed or logged it shows its name and role, never the token.
type AdminCredential = config.AdminCredential

// ConfigError is a configuration New refuses (Config.Validate reports the first);
// Field names the Config field.
type ConfigError = config.Error

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
func DefaultConfig() Config { return config.Defaults() }

// ConfigFromEnv overlays the environment (AGENTQ_*, REDIS_URL, DATABASE_URL) on
// DefaultConfig.
func ConfigFromEnv() (Config, error) { return config.FromEnv() }
