package agentq

import "github.com/agentq/agentq/internal/config"

// Config is a process's configuration (see the README's configuration table).
type Config = config.Config

// Roles a process can run.
const (
	RoleAPI       = config.RoleAPI
	RoleScheduler = config.RoleScheduler
	RoleWorker    = config.RoleWorker
	RoleJanitor   = config.RoleJanitor
)

// DefaultConfig is the configuration used when nothing is set: every role, local
// Redis and Postgres.
func DefaultConfig() Config { return config.Defaults() }

// ConfigFromEnv overlays the environment (AGENTQ_*, REDIS_URL, DATABASE_URL) on
// DefaultConfig.
func ConfigFromEnv() (Config, error) { return config.FromEnv() }
