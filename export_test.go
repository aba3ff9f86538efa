package agentq

import (
	"context"
	"time"

	"github.com/agentq/agentq/internal/maintenance"
)

// RecoverOnce runs one recovery sweep over the queued tasks older than minAge and
// returns how many it pushed back to Redis. For tests.
func (a *App) RecoverOnce(ctx context.Context, minAge time.Duration) (int, error) {
	return maintenance.NewRecovery(a.maintenanceDeps(), maintenance.RecoveryConfig{MinAge: minAge}).RunOnce(ctx)
}

// Janitor is the app's janitor, for tests.
func (a *App) Janitor() *maintenance.Janitor { return a.janitor }
