package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"

	"github.com/agentq/agentq/internal/baseservice"
)

// Pprof serves net/http/pprof on its own listener, a service of the process's
// lifecycle. Its address must be reachable only by operators (localhost or an admin
// network): profiles show the process's memory, and some endpoints cost CPU.
type Pprof struct {
	startstop.BaseStartStop
	Addr string
	// Archetype is where the server logs; nil: the defaults.
	Archetype *baseservice.Archetype

	mu   sync.Mutex
	addr net.Addr
}

// Start listens on Addr and serves until Stop.
func (p *Pprof) Start(ctx context.Context) error {
	ctx, shouldStart, started, stopped := p.StartInit(ctx)
	if !shouldStart {
		return nil
	}
	ln, err := net.Listen("tcp", p.Addr)
	if err != nil {
		stopped()
		return fmt.Errorf("pprof: listen %s: %w", p.Addr, err)
	}
	p.mu.Lock()
	p.addr = ln.Addr()
	p.mu.Unlock()
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log := p.Archetype.Defaults().Logger
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("pprof server stopped", "err", err)
		}
	}()
	log.Info("pprof listening", "addr", ln.Addr().String())
	go func() {
		started()
		defer stopped()
		<-ctx.Done()
		_ = srv.Close() // profiles in progress are cut short
		<-served
	}()
	return nil
}

// ListenAddr is the bound address once started (nil before).
func (p *Pprof) ListenAddr() net.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}
