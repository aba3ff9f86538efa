package billing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/agentq/agentq/internal/periodic"
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
	// Now is the clock every due time and lease is taken from (time.Now when nil).
	Now func() time.Time
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
	// Batch is how many deliveries a relay claims, and sends at once, per round
	// (32 when 0).
	Batch int
	// FanOutBatch is how many events one fan-out reads (500 when 0).
	FanOutBatch int
	// Client sends the requests; nil is a client of its own that follows no
	// redirect. Timeout applies either way.
	Client *http.Client
	// MeterProvider receives agentq.webhook_deliveries; nil is the global one.
	MeterProvider metric.MeterProvider
	Logger        *slog.Logger
}

func (c RelayConfig) withDefaults() RelayConfig {
	if len(c.Schedule) == 0 {
		c.Schedule = StandardSchedule
	}
	if c.Jitter == nil {
		c.Jitter = defaultJitter
	}
	if c.Now == nil {
		c.Now = time.Now
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
	if c.FanOutBatch <= 0 {
		c.FanOutBatch = 500
	}
	if c.Client == nil {
		c.Client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
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
type Relay struct {
	startstop.BaseStartStop
	st  *store.Store
	cfg RelayConfig
	log *slog.Logger

	deliveries metric.Int64Counter
}

// NewRelay returns a relay on st. Nothing runs until Start (or RunOnce).
func NewRelay(st *store.Store, c RelayConfig) *Relay {
	c = c.withDefaults()
	r := &Relay{st: st, cfg: c, log: c.Logger}
	mp := c.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	r.deliveries, _ = mp.Meter("github.com/agentq/agentq/billing").Int64Counter("agentq.webhook_deliveries",
		metric.WithUnit("{attempt}"),
		metric.WithDescription("Webhook delivery attempts by outcome: succeeded (2xx), retrying (failed, attempts left), failed (given up), gone (410: endpoint disabled)"))
	for _, o := range []string{store.AttemptSucceeded, store.AttemptRetrying, store.AttemptFailed, store.AttemptGone} {
		r.deliveries.Add(context.Background(), 0, deliveryAttrs(o))
	}
	return r
}

func deliveryAttrs(outcome string) metric.AddOption {
	return metric.WithAttributes(attribute.String("outcome", outcome))
}

// Start runs rounds until Stop: one at once, the next as soon as a round found a full
// batch of work, else after PollInterval.
func (r *Relay) Start(ctx context.Context) error {
	return periodic.Start(ctx, &r.BaseStartStop, func(ctx context.Context) time.Duration {
		run, err := r.RunOnce(ctx)
		if err != nil && ctx.Err() == nil {
			r.log.Warn("webhook relay round failed", "err", err)
		}
		if err == nil && (run.Sent >= r.cfg.Batch || run.FannedOut >= r.cfg.FanOutBatch) {
			return 0
		}
		return r.cfg.PollInterval
	})
}

// RelayRun is what one round did.
type RelayRun struct {
	FannedOut  int // events read by the fan-out
	Deliveries int // deliveries the fan-out wrote
	Sent       int // deliveries sent (attempts made)
}

// RunOnce is one round: a fan-out of the new events, then one batch of due
// deliveries claimed, sent at once and recorded.
func (r *Relay) RunOnce(ctx context.Context) (RelayRun, error) {
	var run RelayRun
	fo, err := r.st.UnscopedFanOutWebhooks(ctx, store.FanOutParams{Now: r.cfg.Now(), Limit: r.cfg.FanOutBatch})
	if err != nil {
		return run, fmt.Errorf("fan-out: %w", err)
	}
	run.FannedOut, run.Deliveries = fo.Events, fo.Deliveries
	claims, err := r.st.UnscopedClaimWebhookDeliveries(ctx, store.ClaimDeliveriesParams{
		Now: r.cfg.Now(), Lease: r.cfg.Lease, Limit: r.cfg.Batch,
	})
	if err != nil {
		return run, fmt.Errorf("claim: %w", err)
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
	at := r.cfg.Now()
	status, sendErr := r.send(ctx, c, at)
	took := r.cfg.Now().Sub(at)
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
		p.NextAttemptAt = r.cfg.Now().Add(r.cfg.Jitter(r.cfg.Schedule[c.Attempt]))
	default:
		p.Result = store.AttemptFailed
	}
	if sendErr != nil {
		p.Error = sendErr.Error()
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
			"attempts", c.Attempt, "status", status, "err", p.Error)
	case p.Result == store.AttemptRetrying:
		r.log.Info("webhook delivery failed; retrying", "endpoint", c.EndpointID, "event", c.EventID,
			"attempt", c.Attempt, "status", status, "err", p.Error, "next_attempt_at", p.NextAttemptAt)
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
		return 0, errors.New("the endpoint's secret cannot sign")
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
		return 0, errors.New("the endpoint's URL cannot be requested")
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

func sendError(ctx context.Context, err error, timeout time.Duration) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("no answer within %v", timeout)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	msg := err.Error()
	if len(msg) > maxErrorText {
		msg = strings.ToValidUTF8(msg[:maxErrorText], "")
	}
	return errors.New(msg)
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
