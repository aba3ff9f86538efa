package webhooks

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/netguard"
	"github.com/agentq/agentq/internal/store"
)

// StandardSchedule is the delay before each attempt of a delivery, the Standard
// Webhooks schedule: at once, then 5 s, 5 min, 30 min, 2 h, 5 h, 10 h and 10 h after
// the failure before, about 28 hours in all. A delivery that fails its last attempt
// is given up.
var StandardSchedule = []time.Duration{
	0, 5 * time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 5 * time.Hour, 10 * time.Hour, 10 * time.Hour,
}

// RelayConfig configures a relay. The zero value is the production relay.
type RelayConfig struct {
	// Schedule is the delay before each attempt (its length is the number of
	// attempts); StandardSchedule when empty. The first delay is not used: a
	// delivery is due as soon as its event is fanned out.
	Schedule []time.Duration
	// Jitter spreads a retry's delay, so that the deliveries of many events that
	// failed together do not come back together; nil spreads it over ±10 %.
	Jitter func(time.Duration) time.Duration
	// PollInterval is how often an idle relay looks for new events and due
	// deliveries (250 ms when 0).
	PollInterval time.Duration
	// Timeout bounds one request, connection to last byte of the answer (15 s when
	// 0); a request that runs past it is a failed attempt.
	Timeout time.Duration
	// Lease is how long a claimed delivery is kept from the other relays (Timeout +
	// 1 min when 0). A relay that dies mid-send leaves its deliveries to be sent
	// again when their lease lapses.
	Lease time.Duration
	// Batch is how many deliveries a relay claims at most per round (32 when 0).
	Batch int
	// Workers is how many sends a started relay has in flight at most (256 when 0):
	// a pool that takes the next claim as soon as a send finishes, whatever the
	// others are waiting for.
	Workers int
	// PerEndpoint is how many deliveries of one endpoint may be in flight at once,
	// counted from the live leases of every relay together (8 when 0), so one slow
	// endpoint holds at most that many of the workers; one whose last attempt did
	// not succeed, or that has none yet, gets one (a slow start).
	PerEndpoint int
	// FanOutBatch is how many events one fan-out reads (500 when 0).
	FanOutBatch int
	// Client sends the requests; nil is a client of its own that follows no
	// redirect, uses no proxy and dials only addresses the destination guard lets
	// through (AllowNets). Timeout applies either way.
	Client *http.Client
	// AllowNets are the networks deliveries may reach although they are loopback,
	// link-local, private, CGNAT or unique local, refused otherwise when the
	// connection is made (so a name that resolves there is refused too).
	AllowNets []netip.Prefix
	// Archetype is where the relay logs and meters (agentq.webhook_deliveries), and
	// the clock every due time and lease is taken from; nil: the defaults.
	Archetype *baseservice.Archetype
}

func (c RelayConfig) withDefaults() RelayConfig {
	if len(c.Schedule) == 0 {
		c.Schedule = StandardSchedule
	}
	if c.Jitter == nil {
		c.Jitter = defaultJitter
	}
	if c.PollInterval <= 0 {
		c.PollInterval = 250 * time.Millisecond
	}
	if c.Timeout <= 0 {
		c.Timeout = 15 * time.Second
	}
	if c.Lease <= 0 {
		c.Lease = c.Timeout + time.Minute
	}
	if c.Batch <= 0 {
		c.Batch = 32
	}
	if c.Workers <= 0 {
		c.Workers = 256
	}
	if c.PerEndpoint <= 0 {
		c.PerEndpoint = 8
	}
	if c.FanOutBatch <= 0 {
		c.FanOutBatch = 500
	}
	if c.Client == nil {
		c.Client = &http.Client{
			Transport:     netguard.Guard{Allow: c.AllowNets}.Transport(),
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return c
}

// defaultJitter is d spread uniformly over [0.9·d, 1.1·d].
func defaultJitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d - d/10 + time.Duration(rand.Int64N(int64(d/5)+1))
}

// Relay delivers the events outbox to the webhook endpoints: the relay role's
// background service. Every relay of a deployment does both parts of the work, and
// any number may run:
//
//   - fan-out: the events after the relays' shared cursor, read in feed order, get
//     one delivery per endpoint they are for, in the transaction that moves the
//     cursor; one relay at a time does it (the others skip while it holds the
//     cursor), so each event is fanned out once;
//   - sending: due deliveries are claimed with a lease (skipping rows another relay is
//     claiming), so no two relays send one delivery at once; each is signed, POSTed,
//     and its attempt recorded with what was decided.
//
// Deliveries to one endpoint never wait on another's: a started relay sends from a
// pool of Workers that claims more as soon as a send finishes, the claim takes the
// endpoints in turn, and no endpoint has more than PerEndpoint deliveries in flight
// across all the relays, so a receiver that never answers holds only its own.
type Relay struct {
	startstop.BaseStartStop
	st  *store.Store
	cfg RelayConfig
	log *slog.Logger

	mu       sync.Mutex
	inFlight int           // sends of the started relay's pool
	freed    chan struct{} // a send of the pool finished (one pending signal)

	deliveries metric.Int64Counter
}

// NewRelay returns a relay on st. Nothing runs until Start (or RunOnce).
func NewRelay(st *store.Store, c RelayConfig) *Relay {
	c = c.withDefaults()
	r := &Relay{st: st, cfg: c, log: c.Archetype.Defaults().Logger, freed: make(chan struct{}, 1)}
	r.deliveries, _ = c.Archetype.Meter("github.com/agentq/agentq/billing").Int64Counter("agentq.webhook_deliveries",
		metric.WithUnit("{attempt}"),
		metric.WithDescription("Webhook delivery attempts by outcome: succeeded (2xx), retrying (failed, attempts left), failed (given up), gone (410: endpoint disabled)"))
	for _, o := range []string{store.AttemptSucceeded, store.AttemptRetrying, store.AttemptFailed, store.AttemptGone} {
		r.deliveries.Add(context.Background(), 0, deliveryAttrs(o))
	}
	return r
}

// Config is the relay's configuration with its defaults filled in.
func (r *Relay) Config() RelayConfig { return r.cfg }

func deliveryAttrs(outcome string) metric.AddOption {
	return metric.WithAttributes(attribute.String("outcome", outcome))
}

// Start runs the relay until Stop: its loop fans out and claims as many due
// deliveries as its pool has free workers, and each claimed delivery is sent by a
// goroutine of its own, owned by the loop. The loop goes again at once after a round
// that found more work than it took, when a worker frees up if the pool was full,
// and otherwise after PollInterval. Stop cuts the sends in flight short (their
// leases lapse, so they are sent again) and returns once every goroutine ended.
func (r *Relay) Start(ctx context.Context) error {
	ctx, shouldStart, started, stopped := r.StartInit(ctx)
	if !shouldStart {
		return nil
	}
	go func() {
		started()
		defer stopped()
		var sends sync.WaitGroup
		defer sends.Wait()
		t := time.NewTimer(0)
		defer t.Stop()
		var freed <-chan struct{} // r.freed while the pool is full, else nil
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-freed:
			}
			wait, full := r.pump(ctx, &sends)
			freed = nil
			if full {
				freed = r.freed
			}
			t.Reset(wait)
		}
	}()
	return nil
}

// pump is one round of the started relay: a fan-out, then a claim for the pool's
// free workers, each claimed delivery handed to a send goroutine of its own. It
// returns the wait before the next round and whether the pool is full (then the
// next round also comes as soon as a send finishes).
func (r *Relay) pump(ctx context.Context, sends *sync.WaitGroup) (time.Duration, bool) {
	fo, err := r.fanOut(ctx)
	if err != nil {
		r.roundFailed(ctx, err)
		return r.cfg.PollInterval, false
	}
	wait := r.cfg.PollInterval
	if fo.Events >= r.cfg.FanOutBatch {
		wait = 0
	}
	r.mu.Lock()
	free := r.cfg.Workers - r.inFlight
	r.mu.Unlock()
	if free <= 0 {
		return wait, true
	}
	want := min(free, r.cfg.Batch)
	claims, err := r.claim(ctx, want)
	if err != nil {
		r.roundFailed(ctx, err)
		return r.cfg.PollInterval, false
	}
	r.mu.Lock()
	r.inFlight += len(claims)
	full := r.inFlight >= r.cfg.Workers
	r.mu.Unlock()
	for _, c := range claims {
		sends.Add(1)
		go func() {
			defer sends.Done()
			if err := r.deliver(ctx, c); err != nil {
				r.roundFailed(ctx, err)
			}
			r.mu.Lock()
			r.inFlight--
			r.mu.Unlock()
			select {
			case r.freed <- struct{}{}:
			default:
			}
		}()
	}
	if len(claims) == want && !full {
		wait = 0 // there may be more due than this claim took
	}
	return wait, full
}

func (r *Relay) roundFailed(ctx context.Context, err error) {
	if ctx.Err() == nil {
		r.log.Warn("webhook relay round failed", "err", err)
	}
}

func (r *Relay) fanOut(ctx context.Context) (store.FanOut, error) {
	fo, err := r.st.UnscopedFanOutWebhooks(ctx, store.FanOutParams{Now: r.cfg.Archetype.Now(), Limit: r.cfg.FanOutBatch})
	if err != nil {
		return fo, fmt.Errorf("fan-out: %w", err)
	}
	return fo, nil
}

func (r *Relay) claim(ctx context.Context, n int) ([]store.DeliveryClaim, error) {
	claims, err := r.st.UnscopedClaimWebhookDeliveries(ctx, store.ClaimDeliveriesParams{
		Now: r.cfg.Archetype.Now(), Lease: r.cfg.Lease, Limit: n, PerEndpoint: r.cfg.PerEndpoint,
	})
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	return claims, nil
}

// RelayRun is what one round did.
type RelayRun struct {
	FannedOut  int // events read by the fan-out
	Deliveries int // deliveries the fan-out wrote
	Sent       int // deliveries sent (attempts made)
}

// RunOnce is one round run to its end, for tests and tools: a fan-out of the new
// events, then one batch of due deliveries claimed (as the pool claims them), sent
// at once and recorded before it returns. It does not use the started relay's pool.
func (r *Relay) RunOnce(ctx context.Context) (RelayRun, error) {
	var run RelayRun
	fo, err := r.fanOut(ctx)
	if err != nil {
		return run, err
	}
	run.FannedOut, run.Deliveries = fo.Events, fo.Deliveries
	claims, err := r.claim(ctx, r.cfg.Batch)
	if err != nil {
		return run, err
	}
	var wg sync.WaitGroup
	errs := make([]error, len(claims))
	for i, c := range claims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = r.deliver(ctx, c)
		}()
	}
	wg.Wait()
	run.Sent = len(claims)
	return run, errors.Join(errs...)
}

// deliver sends one claimed delivery and records the attempt.
func (r *Relay) deliver(ctx context.Context, c store.DeliveryClaim) error {
	at := r.cfg.Archetype.Now()
	status, sendErr := r.send(ctx, c, at)
	took := r.cfg.Archetype.Now().Sub(at)
	if ctx.Err() != nil {
		// Stopping: the attempt was cut short by us, not by the endpoint. The lease
		// lapses and another relay (or this one, restarted) sends it again.
		return nil
	}
	p := store.RecordAttemptParams{Claim: c, At: at, Duration: max(took, 0), StatusCode: status}
	switch {
	case status >= 200 && status <= 299:
		p.Result = store.AttemptSucceeded
	case status == http.StatusGone:
		p.Result = store.AttemptGone
	case c.Attempt < len(r.cfg.Schedule):
		p.Result = store.AttemptRetrying
		p.NextAttemptAt = r.cfg.Archetype.Now().Add(r.cfg.Jitter(r.cfg.Schedule[c.Attempt]))
	default:
		p.Result = store.AttemptFailed
	}
	var raw error
	if sendErr != nil {
		p.Error, raw = sendErr.Error(), sendErr
		if ae, ok := sendErr.(*AttemptError); ok {
			raw = ae.Raw
		}
	}
	owned, err := r.st.UnscopedRecordWebhookAttempt(ctx, p)
	if err != nil {
		return fmt.Errorf("record attempt %d of delivery %d: %w", c.Attempt, c.ID, err)
	}
	if owned {
		r.deliveries.Add(context.WithoutCancel(ctx), 1, deliveryAttrs(p.Result))
	}
	switch {
	case !owned:
		r.log.Info("webhook delivery outcome dropped: its lease lapsed or its endpoint changed",
			"endpoint", c.EndpointID, "event", c.EventID, "attempt", c.Attempt)
	case p.Result == store.AttemptGone:
		r.log.Warn("webhook endpoint answered 410 Gone: disabled", "endpoint", c.EndpointID)
	case p.Result == store.AttemptFailed:
		r.log.Warn("webhook delivery given up after its last attempt", "endpoint", c.EndpointID, "event", c.EventID,
			"attempts", c.Attempt, "status", status, "error_class", p.Error, "err", raw)
	case p.Result == store.AttemptRetrying:
		r.log.Info("webhook delivery failed; retrying", "endpoint", c.EndpointID, "event", c.EventID,
			"attempt", c.Attempt, "status", status, "error_class", p.Error, "err", raw, "next_attempt_at", p.NextAttemptAt)
	}
	return nil
}

// maxErrorText bounds an attempt's recorded error.
const maxErrorText = 300

// send POSTs the event's stored bytes, signed, and returns the answer's status, or 0
// and why there was none. The error never holds the URL (it may carry a credential)
// or a secret.
func (r *Relay) send(ctx context.Context, c store.DeliveryClaim, at time.Time) (int, error) {
	sig, err := Signature(c.Secret, c.EventID, at, c.Payload)
	if err != nil {
		return 0, &AttemptError{Class: ClassEndpoint, Raw: errors.New("the endpoint's secret cannot sign")}
	}
	if c.PreviousSecret != "" && c.PreviousSecretExpiresAt != nil && at.Before(*c.PreviousSecretExpiresAt) {
		if old, err := Signature(c.PreviousSecret, c.EventID, at, c.Payload); err == nil {
			sig += " " + old
		}
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, bytes.NewReader(c.Payload))
	if err != nil {
		return 0, &AttemptError{Class: ClassEndpoint, Raw: errors.New("the endpoint's URL cannot be requested")}
	}
	req.Header.Set("Content-Type", "application/cloudevents+json; charset=utf-8")
	req.Header.Set("User-Agent", "agentq-relay")
	req.Header.Set(standardwebhooks.HeaderWebhookID, c.EventID)
	req.Header.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(at.Unix(), 10))
	req.Header.Set(standardwebhooks.HeaderWebhookSignature, sig)
	res, err := r.cfg.Client.Do(req)
	if err != nil {
		return 0, sendError(ctx, err, r.cfg.Timeout)
	}
	defer res.Body.Close()
	// Read (a bounded part of) the answer, so the connection is reused, within the
	// timeout: a receiver that answers its status and then stalls fails too.
	if _, err := io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10)); err != nil && ctx.Err() != nil {
		return 0, sendError(ctx, err, r.cfg.Timeout)
	}
	return res.StatusCode, nil
}

// AttemptError is why an attempt got no answer: Class, one word of a fixed
// vocabulary, is what the endpoint's owner is shown (the attempt's error); Raw, the
// failure as the network put it (resolver addresses, names, internal hosts), goes to
// the operator's log only. Neither holds the URL.
type AttemptError struct {
	Class string
	Raw   error
}

func (e *AttemptError) Error() string { return e.Class }

func (e *AttemptError) Unwrap() error { return e.Raw }

// The classes of AttemptError, besides refused:<class>.
const (
	ClassDNS         = "dns_error"        // the name did not resolve
	ClassRefused     = "connect_refused"  // nothing listens at the address
	ClassTimeout     = "timeout"          // no complete answer within the relay's timeout
	ClassTLS         = "tls_error"        // the TLS handshake or the certificate failed
	ClassConnection  = "connection_error" // any other failure of the connection
	ClassEndpoint    = "invalid_endpoint" // the stored URL or secret cannot be used
	classRefusedFrom = "refused:"         // + the guard's code: the address is in a refused network
)

// sendError classifies a send's failure; the raw error loses its url.Error wrapping,
// which names the URL.
func sendError(ctx context.Context, err error, timeout time.Duration) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if msg := err.Error(); len(msg) > maxErrorText {
		err = errors.New(strings.ToValidUTF8(msg[:maxErrorText], ""))
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &AttemptError{Class: ClassTimeout, Raw: fmt.Errorf("no answer within %v: %w", timeout, err)}
	}
	return &AttemptError{Class: errorClass(err), Raw: err}
}

// errorClass is the class of a failed send's error.
func errorClass(err error) string {
	var (
		refused  *netguard.RefusedError
		dns      *net.DNSError
		netErr   net.Error
		certErr  *tls.CertificateVerificationError
		recErr   tls.RecordHeaderError
		alertErr tls.AlertError
		unknown  x509.UnknownAuthorityError
		hostErr  x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	switch {
	case errors.As(err, &refused):
		return classRefusedFrom + refused.Code
	case errors.As(err, &dns):
		return ClassDNS
	case errors.Is(err, syscall.ECONNREFUSED):
		return ClassRefused
	case errors.As(err, &certErr), errors.As(err, &recErr), errors.As(err, &alertErr),
		errors.As(err, &unknown), errors.As(err, &hostErr), errors.As(err, &invalid),
		strings.HasPrefix(err.Error(), "tls: "):
		return ClassTLS
	case errors.As(err, &netErr) && netErr.Timeout():
		return ClassTimeout
	}
	return ClassConnection
}

// Signature is the webhook-signature of one delivery with one secret, as the
// Standard Webhooks library computes it: "v1," and the base64 of the HMAC-SHA256 of
// "id.timestamp.body" keyed with the secret's bytes (after "whsec_").
func Signature(secret, id string, at time.Time, payload []byte) (string, error) {
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return "", err
	}
	return wh.Sign(id, at, payload)
}
