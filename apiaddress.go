package agentq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/config"
)

// A worker run apart from the API writes approval links that the API serves, so they
// must start with the address people reach the API at. AGENTQ_PUBLIC_URL says it;
// without it the worker takes the address a process serving the API advertised last,
// which each such process records in Postgres when it starts. A worker that finds
// neither refuses to start rather than write links to its own localhost.

// advertiseAPIAddress records where this process serves the API, when that address is
// one others can use: the configured public URL, or the listener's address when it is
// bound to a host (a wildcard bind says nothing of how people reach it).
func (a *App) advertiseAPIAddress(ctx context.Context) {
	if !a.cfg.Has(config.RoleAPI) {
		return
	}
	base := a.cfg.PublicURL
	if base == "" {
		addr := a.Addr()
		if addr == nil {
			return
		}
		host, _, err := net.SplitHostPort(addr.String())
		if ip := net.ParseIP(host); err != nil || host == "" || (ip != nil && ip.IsUnspecified()) {
			return
		}
		base = a.publicBase()
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := a.store.AdvertiseAPIAddress(ctx, strings.TrimRight(base, "/")); err != nil {
		// The API serves all the same; a worker that needs the address says so itself.
		a.log.Warn("recording the API's address for workers failed", "err", err)
	}
}

// learnPublicBase gives a worker without the api role and without a configured public
// URL the address an API process advertised, or refuses to start without one.
func (a *App) learnPublicBase(ctx context.Context) error {
	if !a.cfg.Has(config.RoleWorker) || a.cfg.Has(config.RoleAPI) || a.cfg.PublicURL != "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	base, err := a.store.NewestAPIAddress(ctx)
	switch {
	case errors.Is(err, agentqtype.ErrNotFound):
		return &ConfigError{Field: "PublicURL", Message: "is empty and no process serving the API has advertised its address; " +
			"a worker without the api role writes the approval links of paused tasks, which the API serves: " +
			"set AGENTQ_PUBLIC_URL to the address people reach the API at, or start a process with the api role first"}
	case err != nil:
		return fmt.Errorf("agentq: reading the API's advertised address: %w", err)
	}
	a.learnedBase = base
	a.log.Info("approval links use the API's advertised address", "public_url", base)
	return nil
}
