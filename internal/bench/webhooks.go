package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/billing/webhooks"
	"github.com/agentq/agentq/internal/netguard"
	"github.com/agentq/agentq/internal/pg"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/migrations"
	"github.com/agentq/agentq/quotas"
)

// Webhooks is the result of `agentq bench webhooks`: how long after an event becomes
// visible (its transaction committed) a healthy endpoint gets its first attempt,
// with one hung endpoint (it takes every event and never answers) holding a backlog
// of due deliveries, and the same with no hung endpoint, in one run.
type Webhooks struct {
	Hung     WebhookDelays `json:"hung"`
	Baseline WebhookDelays `json:"baseline"`
	// Backlog is each hung endpoint's due deliveries when the probes start.
	Backlog   int `json:"backlog"`
	HungCount int `json:"hung_endpoints"`
	Endpoints int `json:"healthy_endpoints"`
	// TimeoutS is the relay's request timeout: what each hung send waits for.
	TimeoutS    float64 `json:"timeout_s"`
	Workers     int     `json:"workers"`
	PerEndpoint int     `json:"per_endpoint"`
}

// WebhookDelays are one phase's delays from an event's commit to its first attempt at
// its healthy endpoint.
type WebhookDelays struct {
	Probes int     `json:"probes"`
	Missed int     `json:"missed"` // probes that never arrived within the phase's deadline
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	MaxMs  float64 `json:"max_ms"`
}

// WebhooksOptions configure the benchmark; zero fields take the defaults.
type WebhooksOptions struct {
	DatabaseURL string
	Backlog     int           // the events every hung endpoint has due, 10,000
	Hung        int           // hung endpoints, each taking every event, 1
	Probes      int           // events to the healthy endpoints per phase, 100
	Endpoints   int           // healthy endpoints, one tenant each, 4
	Interval    time.Duration // between probes, 50 ms
	// Relay is the relays' configuration (the production defaults when zero, whose
	// archetype discards the logs); its AllowNets are the benchmark's.
	Relay    webhooks.RelayConfig
	Progress io.Writer
}

// RunWebhooks runs the phase with the hung endpoint, then the baseline, each on a
// fresh Postgres schema it drops at the end.
func RunWebhooks(ctx context.Context, o WebhooksOptions) (Webhooks, error) {
	o.Backlog = orInt(o.Backlog, 10000)
	o.Probes = orInt(o.Probes, 100)
	o.Endpoints = orInt(o.Endpoints, 4)
	o.Hung = orInt(o.Hung, 1)
	if o.Interval <= 0 {
		o.Interval = 50 * time.Millisecond
	}
	o.Relay.AllowNets = netguard.Loopback() // the receivers are local servers
	out := Webhooks{Backlog: o.Backlog, Endpoints: o.Endpoints, HungCount: o.Hung}
	log := func(f string, a ...any) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, f+"\n", a...)
		}
	}
	log("%d hung endpoint(s) taking every event, %d due deliveries to each, %d probes to %d healthy endpoints…", o.Hung, o.Backlog, o.Probes, o.Endpoints)
	var err error
	if out.Hung, err = runWebhookPhase(ctx, o, true, &out); err != nil {
		return out, fmt.Errorf("hung: %w", err)
	}
	log("baseline: the same probes with no hung endpoint…")
	if out.Baseline, err = runWebhookPhase(ctx, o, false, &out); err != nil {
		return out, fmt.Errorf("baseline: %w", err)
	}
	return out, nil
}

// webhookPhase is one phase's schema and receivers.
type webhookPhase struct {
	st   *store.Store
	mu   sync.Mutex
	seen map[string]time.Time // event id → first attempt at a healthy endpoint
}

func runWebhookPhase(ctx context.Context, o WebhooksOptions, hung bool, out *Webhooks) (WebhookDelays, error) {
	schema := "bench_webhooks_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	admin, err := pg.Connect(ctx, o.DatabaseURL, "")
	if err != nil {
		return WebhookDelays{}, err
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return WebhookDelays{}, err
	}
	defer func() { _, _ = admin.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+schema+" CASCADE") }()
	pool, err := pg.Connect(ctx, o.DatabaseURL, schema)
	if err != nil {
		return WebhookDelays{}, err
	}
	defer pool.Close()
	if _, err := migrations.Up(ctx, pool); err != nil {
		return WebhookDelays{}, err
	}
	p := &webhookPhase{st: store.New(pool), seen: map[string]time.Time{}}
	// The receivers are this process's own local servers.
	hooks := webhooks.NewWebhooks(p.st, webhooks.WebhooksOptions{AllowNets: netguard.Loopback()})
	stopHung := make(chan struct{})
	if hung {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-stopHung:
			}
		}))
		defer srv.Close()
		for i := range o.Hung {
			if err := p.endpoint(ctx, hooks, fmt.Sprintf("%s/h%d", srv.URL, i), ""); err != nil {
				return WebhookDelays{}, err
			}
		}
	}
	defer close(stopHung) // before the hung server closes: its handlers return
	healthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		p.arrived(r.Header.Get("webhook-id"), time.Now())
		w.WriteHeader(http.StatusNoContent)
	}))
	defer healthy.Close()
	for i := range o.Endpoints {
		if err := p.endpoint(ctx, hooks, fmt.Sprintf("%s/t%d", healthy.URL, i), fmt.Sprintf("probe%d", i)); err != nil {
			return WebhookDelays{}, err
		}
	}
	if hung {
		if err := p.backlog(ctx, o.Backlog); err != nil {
			return WebhookDelays{}, err
		}
	}
	relay := webhooks.NewRelay(p.st, o.Relay)
	cfg := relay.Config()
	out.TimeoutS, out.Workers, out.PerEndpoint = cfg.Timeout.Seconds(), cfg.Workers, cfg.PerEndpoint
	if err := relay.Start(ctx); err != nil {
		return WebhookDelays{}, err
	}
	defer relay.Stop()
	written, err := p.probe(ctx, o)
	if err != nil {
		return WebhookDelays{}, err
	}
	return p.delays(ctx, written), nil
}

// endpoint creates an endpoint for tenant ("" every tenant's events) and the tenant.
func (p *webhookPhase) endpoint(ctx context.Context, hooks *webhooks.Webhooks, url, tenant string) error {
	if tenant != "" {
		if _, err := p.st.CreateTenant(ctx, store.CreateTenantParams{ID: tenant, Name: tenant, Plan: "pro"}); err != nil {
			return err
		}
	}
	_, err := hooks.Create(ctx, webhooks.CreateWebhookParams{URL: url, Types: []string{outbox.TypeLimitHit}, TenantID: tenant})
	return err
}

func (p *webhookPhase) arrived(id string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.seen[id]; !ok {
		p.seen[id] = at
	}
}

var webhookEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// write commits evs in one transaction and returns when it committed.
func (p *webhookPhase) write(ctx context.Context, evs []outbox.Event) (time.Time, error) {
	err := p.st.InTx(ctx, func(tx *store.Store) error {
		for _, ev := range evs {
			if _, err := outbox.WriteEvent(ctx, tx, ev); err != nil {
				return err
			}
		}
		return nil
	})
	return time.Now(), err
}

func hitEvent(tenant string, i int) (outbox.Event, error) {
	return outbox.Events{}.LimitHit(outbox.Refusal{TenantID: tenant, Plan: "pro", LimitType: quotas.TenantRate,
		Limit: 1, Used: 1, At: webhookEpoch.Add(time.Duration(i) * time.Minute)})
}

// backlog writes n events of a tenant only the hung endpoint takes and fans them out,
// so n deliveries to it are due before the relay starts.
func (p *webhookPhase) backlog(ctx context.Context, n int) error {
	if _, err := p.st.CreateTenant(ctx, store.CreateTenantParams{ID: "backlog", Name: "backlog", Plan: "pro"}); err != nil {
		return err
	}
	for i := 0; i < n; i += 1000 {
		var evs []outbox.Event
		for j := i; j < min(n, i+1000); j++ {
			ev, err := hitEvent("backlog", j)
			if err != nil {
				return err
			}
			evs = append(evs, ev)
		}
		if _, err := p.write(ctx, evs); err != nil {
			return err
		}
	}
	for done, deadline := 0, time.Now().Add(time.Minute); done < n; {
		if time.Now().After(deadline) {
			return fmt.Errorf("fanned out %d of the %d backlog deliveries in a minute", done, n)
		}
		fo, err := p.st.UnscopedFanOutWebhooks(ctx, store.FanOutParams{Now: time.Now(), Limit: store.MaxEventsPage})
		if err != nil {
			return err
		}
		done += fo.Deliveries
	}
	return nil
}

// probe writes o.Probes events, one every o.Interval, spread over the healthy
// endpoints' tenants, and returns when each committed.
func (p *webhookPhase) probe(ctx context.Context, o WebhooksOptions) (map[string]time.Time, error) {
	written := map[string]time.Time{}
	for i := range o.Probes {
		ev, err := hitEvent(fmt.Sprintf("probe%d", i%o.Endpoints), i)
		if err != nil {
			return nil, err
		}
		at, err := p.write(ctx, []outbox.Event{ev})
		if err != nil {
			return nil, err
		}
		written[ev.ID] = at
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(o.Interval):
		}
	}
	return written, nil
}

// delays waits (up to a minute) for every probe to arrive and returns the delays.
func (p *webhookPhase) delays(ctx context.Context, written map[string]time.Time) WebhookDelays {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		p.mu.Lock()
		n := 0
		for id := range written {
			if _, ok := p.seen[id]; ok {
				n++
			}
		}
		p.mu.Unlock()
		if n == len(written) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := WebhookDelays{Probes: len(written)}
	var ms []float64
	for id, at := range written {
		got, ok := p.seen[id]
		if !ok {
			out.Missed++
			continue
		}
		ms = append(ms, float64(got.Sub(at).Microseconds())/1000)
	}
	out.P50Ms, out.P90Ms, out.MaxMs = round1(percentile(ms, 0.5)), round1(percentile(ms, 0.9)), round1(percentile(ms, 1))
	return out
}
