package webhooks_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/billing/webhooks"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/netguard"
)

// syncBuffer is a log destination the relay's goroutines write to.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}
func (b *syncBuffer) String() string { b.mu.Lock(); defer b.mu.Unlock(); return b.buf.String() }

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// hangUp is a loopback server that closes every connection as soon as it takes it.
func hangUp(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// noResolver is a client whose name lookups fail before any query leaves the
// machine: its resolver has no server to ask.
func noResolver() *http.Client {
	d := &net.Dialer{Resolver: &net.Resolver{PreferGo: true, Dial: func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("no name server at 10.0.0.53:53 (resolver.internal)")
	}}}
	tr := &http.Transport{DialContext: d.DialContext}
	return &http.Client{Transport: tr}
}

// An attempt without an answer shows its tenant one word of a fixed vocabulary;
// the failure as the network said it (addresses, names) is in the operator's log
// only.
func TestAttemptErrorsAreAFixedVocabulary(t *testing.T) {
	t.Parallel()
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) }))
	t.Cleanup(tlsSrv.Close)
	hung := newHungReceiver(t)
	plain := newReceiver(t, nil)
	for _, c := range []struct {
		name, url, want, logged string
		cfg                     func(*webhooks.RelayConfig)
	}{
		{name: "refused", url: "http://" + closedPort(t) + "/hook", want: "connect_refused", logged: "connection refused"},
		{name: "timeout", url: hung.srv.URL + "/hook", want: "timeout", logged: "no answer within",
			cfg: func(c *webhooks.RelayConfig) { c.Timeout = 200 * time.Millisecond }},
		{name: "tls", url: tlsSrv.URL + "/hook", want: "tls_error", logged: "certificate"},
		{name: "dns", url: "http://receiver.agentq.test/hook", want: "dns_error", logged: "10.0.0.53",
			cfg: func(c *webhooks.RelayConfig) { c.Client = noResolver() }},
		{name: "guard", url: strings.Replace(plain.srv.URL, "127.0.0.1", "localhost", 1) + "/hook", want: "refused:loopback",
			logged: "a loopback address", cfg: func(c *webhooks.RelayConfig) { c.AllowNets = nil }},
		{name: "hang up", url: "http://" + hangUp(t) + "/hook", want: "connection_error", logged: "err="},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newRelayEnv(t)
			w := e.create(t, c.url, "acme", outbox.TypeLimitHit)
			var logs syncBuffer
			cfg := webhooks.RelayConfig{
				Schedule: []time.Duration{0, time.Minute}, Jitter: func(d time.Duration) time.Duration { return d },
				Timeout: 5 * time.Second, AllowNets: netguard.Loopback(),
				Archetype: &baseservice.Archetype{Clock: e.clock.Now, Logger: slog.New(slog.NewTextHandler(&logs, nil))},
			}
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			e.write(t, e.hit(t, "acme", 1))
			var page webhooks.AttemptsPage
			runUntil(t, e.ctx, webhooks.NewRelay(e.st, cfg), func() bool {
				var err error
				if page, err = e.hooks.Attempts(e.ctx, w.Webhook.ID.String(), webhooks.AttemptsParams{}); err != nil {
					t.Fatal(err)
				}
				return len(page.Attempts) == 1
			})
			if got := page.Attempts[0].Error; got != c.want {
				t.Errorf("the attempt shows %q, want %q", got, c.want)
			}
			if l := logs.String(); !strings.Contains(l, c.logged) || !strings.Contains(l, "error_class="+c.want) {
				t.Errorf("the operator's log does not say %q (class %s): %s", c.logged, c.want, l)
			}
		})
	}
}
