package store

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/agentq/agentq/agentqtype"
)

// Webhook endpoints are the operator's or a tenant's own. The operator's calls, the
// deliveries and the attempts are unscoped (an operator's endpoint may take every
// tenant's events) and serve the admin API, the CLI and the relays only; a tenant's
// own endpoints are reached through the tenant-scoped calls (…TenantWebhook…),
// which see that tenant's own endpoints and nothing else.

// WebhookEndpoint is a webhook endpoint as stored.
type WebhookEndpoint struct {
	ID       uuid.UUID
	URL      string
	Types    []string
	TenantID string // "" = every tenant
	// TenantOwned: the tenant registered it for its own events (TenantID is set).
	TenantOwned    bool
	DisabledAt     *time.Time
	DisabledReason string
	CreatedAt      time.Time
	UpdatedAt      time.Time
	// PreviousSecretExpiresAt is when the secret before the last rotation stops
	// signing; nil when there is none.
	PreviousSecretExpiresAt *time.Time
	// Secret and PreviousSecret sign the deliveries. For the relay and the create
	// and rotate answers only: never shown by reads, never logged.
	Secret         string
	PreviousSecret string
}

const webhookCols = `id, url, types, COALESCE(tenant_id, ''), tenant_owned, disabled_at, COALESCE(disabled_reason, ''),
	created_at, updated_at, previous_secret_expires_at, secret, COALESCE(previous_secret, '')`

func scanWebhook(row pgx.Row) (WebhookEndpoint, error) {
	var w WebhookEndpoint
	err := row.Scan(&w.ID, &w.URL, &w.Types, &w.TenantID, &w.TenantOwned, &w.DisabledAt, &w.DisabledReason,
		&w.CreatedAt, &w.UpdatedAt, &w.PreviousSecretExpiresAt, &w.Secret, &w.PreviousSecret)
	if errors.Is(err, pgx.ErrNoRows) {
		return w, agentqtype.ErrNotFound
	}
	return w, err
}

// CreateWebhookParams are a new endpoint.
type CreateWebhookParams struct {
	ID       uuid.UUID
	URL      string
	Types    []string
	TenantID string // "" = every tenant
	Secret   string
}

// UnscopedCreateWebhook stores an endpoint. It receives the events whose transaction
// got its id after this call's. agentqtype.ErrNotFound when TenantID names no tenant.
func (s *Store) UnscopedCreateWebhook(ctx context.Context, p CreateWebhookParams) (WebhookEndpoint, error) {
	var tenant *string
	if p.TenantID != "" {
		tenant = &p.TenantID
	}
	w, err := scanWebhook(s.db.QueryRow(ctx, `
		INSERT INTO webhook_endpoints (id, url, types, tenant_id, secret) VALUES ($1, $2, $3, $4, $5)
		RETURNING `+webhookCols, p.ID, p.URL, p.Types, tenant, p.Secret))
	if isForeignKeyViolation(err) {
		return w, agentqtype.ErrNotFound
	}
	return w, err
}

// UnscopedGetWebhook reads an endpoint; agentqtype.ErrNotFound if there is none.
func (s *Store) UnscopedGetWebhook(ctx context.Context, id uuid.UUID) (WebhookEndpoint, error) {
	return scanWebhook(s.db.QueryRow(ctx, `SELECT `+webhookCols+` FROM webhook_endpoints WHERE id = $1`, id))
}

// UnscopedListWebhooks lists every endpoint, oldest first.
func (s *Store) UnscopedListWebhooks(ctx context.Context) ([]WebhookEndpoint, error) {
	rows, err := s.db.Query(ctx, `SELECT `+webhookCols+` FROM webhook_endpoints ORDER BY created_at, id`)
	return collect(rows, err, scanWebhook)
}

// UnscopedDeleteWebhook deletes an endpoint with its deliveries and attempts;
// agentqtype.ErrNotFound if there is none. A send in flight finishes, and its outcome
// is dropped.
func (s *Store) UnscopedDeleteWebhook(ctx context.Context, id uuid.UUID) error {
	tag, err := s.db.Exec(ctx, `DELETE FROM webhook_endpoints WHERE id = $1`, id)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return agentqtype.ErrNotFound
	}
	return nil
}

// RotateWebhookParams replace an endpoint's secret.
type RotateWebhookParams struct {
	ID     uuid.UUID
	Secret string
	// PreviousExpiresAt is until when the replaced secret keeps signing.
	PreviousExpiresAt time.Time
}

// UnscopedRotateWebhookSecret makes Secret the endpoint's secret and the one it had
// the previous one, until PreviousExpiresAt; agentqtype.ErrNotFound if there is no
// endpoint.
func (s *Store) UnscopedRotateWebhookSecret(ctx context.Context, p RotateWebhookParams) (WebhookEndpoint, error) {
	return scanWebhook(s.db.QueryRow(ctx, `
		UPDATE webhook_endpoints SET previous_secret = secret, previous_secret_expires_at = $3, secret = $2,
			updated_at = now()
		WHERE id = $1 RETURNING `+webhookCols, p.ID, p.Secret, p.PreviousExpiresAt))
}

// ErrWebhookLimit is a tenant endpoint refused because the tenant has as many of
// its own as its limit allows.
var ErrWebhookLimit = errors.New("store: the tenant's webhook endpoint limit is reached")

// CreateTenantWebhookParams are a tenant's new endpoint of its own.
type CreateTenantWebhookParams struct {
	TenantID string
	ID       uuid.UUID
	URL      string
	Types    []string
	Secret   string
	// Max is how many endpoints of its own the tenant may have, this one included;
	// below 0, no cap.
	Max int64
}

// CreateTenantWebhook stores a tenant's own endpoint, for that tenant's events only,
// unless the tenant already has Max of its own (ErrWebhookLimit, with the count).
// The tenant's row is locked for the count and the insert, so concurrent creations
// cannot pass the limit together. agentqtype.ErrNotFound when the tenant does not exist.
func (s *Store) CreateTenantWebhook(ctx context.Context, p CreateTenantWebhookParams) (WebhookEndpoint, int64, error) {
	if p.TenantID == "" {
		return WebhookEndpoint{}, 0, ErrNoTenant
	}
	var w WebhookEndpoint
	var n int64
	err := s.InTx(ctx, func(tx *Store) error {
		var one int
		err := tx.db.QueryRow(ctx, `SELECT 1 FROM tenants WHERE id = $1 FOR NO KEY UPDATE`, p.TenantID).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return agentqtype.ErrNotFound
		}
		if err != nil {
			return err
		}
		if err := tx.db.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoints WHERE tenant_id = $1 AND tenant_owned`,
			p.TenantID).Scan(&n); err != nil {
			return err
		}
		if p.Max >= 0 && n >= p.Max {
			return ErrWebhookLimit
		}
		w, err = scanWebhook(tx.db.QueryRow(ctx, `
			INSERT INTO webhook_endpoints (id, url, types, tenant_id, tenant_owned, secret) VALUES ($1, $2, $3, $4, true, $5)
			RETURNING `+webhookCols, p.ID, p.URL, p.Types, p.TenantID, p.Secret))
		return err
	})
	return w, n, err
}

// ListTenantWebhooksParams name the tenant whose own endpoints are listed.
type ListTenantWebhooksParams struct{ TenantID string }

// ListTenantWebhooks lists a tenant's own endpoints, oldest first.
func (s *Store) ListTenantWebhooks(ctx context.Context, p ListTenantWebhooksParams) ([]WebhookEndpoint, error) {
	if p.TenantID == "" {
		return nil, ErrNoTenant
	}
	rows, err := s.db.Query(ctx, `SELECT `+webhookCols+` FROM webhook_endpoints WHERE tenant_id = $1 AND tenant_owned
		ORDER BY created_at, id`, p.TenantID)
	return collect(rows, err, scanWebhook)
}

// TenantWebhookParams name one of a tenant's own endpoints.
type TenantWebhookParams struct {
	TenantID string
	ID       uuid.UUID
}

// GetTenantWebhook reads one of a tenant's own endpoints; agentqtype.ErrNotFound for
// any other id (another tenant's, the operator's).
func (s *Store) GetTenantWebhook(ctx context.Context, p TenantWebhookParams) (WebhookEndpoint, error) {
	if p.TenantID == "" {
		return WebhookEndpoint{}, ErrNoTenant
	}
	return scanWebhook(s.db.QueryRow(ctx, `SELECT `+webhookCols+` FROM webhook_endpoints
		WHERE id = $1 AND tenant_id = $2 AND tenant_owned`, p.ID, p.TenantID))
}

// DeleteTenantWebhook deletes one of a tenant's own endpoints with its deliveries and
// attempts; agentqtype.ErrNotFound for any other id.
func (s *Store) DeleteTenantWebhook(ctx context.Context, p TenantWebhookParams) error {
	if p.TenantID == "" {
		return ErrNoTenant
	}
	tag, err := s.db.Exec(ctx, `DELETE FROM webhook_endpoints WHERE id = $1 AND tenant_id = $2 AND tenant_owned`,
		p.ID, p.TenantID)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return agentqtype.ErrNotFound
	}
	return nil
}

// RotateTenantWebhookParams replace the secret of one of a tenant's own endpoints.
type RotateTenantWebhookParams struct {
	TenantID string
	RotateWebhookParams
}

// RotateTenantWebhookSecret is UnscopedRotateWebhookSecret for one of a tenant's own
// endpoints; agentqtype.ErrNotFound for any other id.
func (s *Store) RotateTenantWebhookSecret(ctx context.Context, p RotateTenantWebhookParams) (WebhookEndpoint, error) {
	if p.TenantID == "" {
		return WebhookEndpoint{}, ErrNoTenant
	}
	return scanWebhook(s.db.QueryRow(ctx, `
		UPDATE webhook_endpoints SET previous_secret = secret, previous_secret_expires_at = $3, secret = $2,
			updated_at = now()
		WHERE id = $1 AND tenant_id = $4 AND tenant_owned RETURNING `+webhookCols, p.ID, p.Secret, p.PreviousExpiresAt, p.TenantID))
}

// FanOutParams bound one fan-out.
type FanOutParams struct {
	Now   time.Time // the deliveries are due from then
	Limit int       // events read at most
}

// FanOut is what one fan-out did.
type FanOut struct {
	Events     int  // events read past the cursor
	Deliveries int  // deliveries written
	Busy       bool // another relay held the cursor: nothing was done
}

// UnscopedFanOutWebhooks reads up to Limit events after the relays' shared cursor,
// in feed order behind the oldest running transaction, writes a pending delivery for
// each endpoint each one is for (enabled, of its type, of its tenant or of every
// tenant, created before the event), and moves the cursor past them, in one
// transaction. The cursor row is locked for it; a relay that finds it locked does
// nothing (Busy), so an event is fanned out once however many relays run.
func (s *Store) UnscopedFanOutWebhooks(ctx context.Context, p FanOutParams) (FanOut, error) {
	if p.Limit <= 0 || p.Limit > MaxEventsPage {
		p.Limit = MaxEventsPage
	}
	var out FanOut
	err := s.InTx(ctx, func(tx *Store) error {
		var xid string
		var seq int64
		err := tx.db.QueryRow(ctx, `SELECT xid::text, seq FROM webhook_fanout_cursor FOR UPDATE SKIP LOCKED`).Scan(&xid, &seq)
		if errors.Is(err, pgx.ErrNoRows) {
			out.Busy = true
			return nil
		}
		if err != nil {
			return err
		}
		var lastXID *string
		var lastSeq *int64
		err = tx.db.QueryRow(ctx, `
			WITH batch AS (
				SELECT xid, seq, id, tenant_id, type, audience FROM events
				WHERE (xid, seq) > ($1::text::xid8, $2) AND xid < pg_snapshot_xmin(pg_current_snapshot())
				ORDER BY xid, seq LIMIT $3
			), ins AS (
				INSERT INTO webhook_deliveries (endpoint_id, event_seq, event_id, next_attempt_at)
				SELECT w.id, b.seq, b.id, $4 FROM batch b JOIN webhook_endpoints w
					ON b.type = ANY (w.types) AND (w.tenant_id IS NULL OR w.tenant_id = b.tenant_id)
					AND (b.audience = 'all' OR (b.audience = 'tenant') = w.tenant_owned)
					AND w.disabled_at IS NULL AND b.xid > w.start_xid
				ORDER BY b.xid, b.seq
				ON CONFLICT (endpoint_id, event_seq) DO NOTHING
				RETURNING 1
			), last AS (
				SELECT xid::text AS xid, seq FROM batch ORDER BY xid DESC, seq DESC LIMIT 1
			)
			SELECT (SELECT count(*) FROM batch), (SELECT count(*) FROM ins), (SELECT xid FROM last), (SELECT seq FROM last)`,
			xid, seq, p.Limit, p.Now).Scan(&out.Events, &out.Deliveries, &lastXID, &lastSeq)
		if err != nil || lastXID == nil {
			return err
		}
		_, err = tx.db.Exec(ctx, `UPDATE webhook_fanout_cursor SET xid = $1::text::xid8, seq = $2`, *lastXID, *lastSeq)
		return err
	})
	return out, err
}

// ClaimDeliveriesParams select the deliveries a relay sends next.
type ClaimDeliveriesParams struct {
	Now   time.Time
	Lease time.Duration // how long the claim keeps other relays off
	Limit int
	// PerEndpoint caps the deliveries of one endpoint under a live lease, this
	// claim's and every relay's before it together (no cap when 0).
	PerEndpoint int
}

// DeliveryClaim is a delivery a relay holds until Now + Lease, with what it sends.
type DeliveryClaim struct {
	ID         int64
	LeaseID    uuid.UUID // the claim: its outcome is written only while the delivery still carries it
	Attempt    int       // this attempt's number, from 1
	EndpointID uuid.UUID
	URL        string
	EventID    string
	Payload    []byte // the event's bytes as stored
	// Secret and PreviousSecret sign the request; PreviousSecret only until
	// PreviousSecretExpiresAt.
	Secret                  string
	PreviousSecret          string
	PreviousSecretExpiresAt *time.Time
}

// UnscopedClaimWebhookDeliveries claims up to Limit pending deliveries that are due
// at Now and not claimed by a live lease, of enabled endpoints, taken endpoint by
// endpoint in turn: the oldest due of each endpoint, then the second oldest of each,
// and so on, so that one endpoint's backlog never crowds another's out. An endpoint
// gets no more than PerEndpoint minus its deliveries already under a live lease, and
// one whose last recorded attempt did not succeed (it failed, or there is none yet)
// no more than one, a slow start: a receiver that never answered, or stopped
// answering, holds one send of the relays, whatever its backlog, until a delivery to
// it succeeds. (With PerEndpoint 0 there is no cap of either kind.)
//
// The claim locks the endpoints it claims for (skipping those another relay is
// claiming for) before it counts their leases, in a statement of its own, so the
// count sees every claim committed before: several relays together keep the cap.
// Rows another relay is claiming are skipped, not waited for, and the lease keeps
// them off every other relay until it lapses: no delivery is sent twice at once.
func (s *Store) UnscopedClaimWebhookDeliveries(ctx context.Context, p ClaimDeliveriesParams) ([]DeliveryClaim, error) {
	lease := uuid.New()
	perEndpoint, probing := p.PerEndpoint, 1
	if perEndpoint <= 0 {
		perEndpoint, probing = p.Limit, p.Limit
	}
	var claims []DeliveryClaim
	err := s.InTx(ctx, func(tx *Store) error {
		// Only the endpoints with a due delivery are locked: a claim writes no lock on
		// the endpoints that have nothing to send, however many there are.
		rows, err := tx.db.Query(ctx, `SELECT w.id FROM webhook_endpoints w WHERE w.disabled_at IS NULL
			AND EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.endpoint_id = w.id AND d.state = 'pending'
				AND d.next_attempt_at <= $1 AND (d.locked_until IS NULL OR d.locked_until <= $1))
			FOR NO KEY UPDATE OF w SKIP LOCKED`, p.Now)
		endpoints, err := collect(rows, err, func(row pgx.Row) (uuid.UUID, error) {
			var id uuid.UUID
			return id, row.Scan(&id)
		})
		if err != nil || len(endpoints) == 0 {
			return err
		}
		rows, err = tx.db.Query(ctx, claimDeliveriesSQL, p.Now, p.Now.Add(p.Lease), p.Limit, lease, perEndpoint, endpoints, probing)
		claims, err = collect(rows, err, func(row pgx.Row) (DeliveryClaim, error) {
			c := DeliveryClaim{LeaseID: lease}
			err := row.Scan(&c.ID, &c.Attempt, &c.EndpointID, &c.URL, &c.EventID, &c.Payload, &c.Secret,
				&c.PreviousSecret, &c.PreviousSecretExpiresAt)
			return c, err
		})
		return err
	})
	return claims, err
}

// claimDeliveriesSQL picks, for each endpoint ($6), its oldest due deliveries up to
// what its cap ($5) leaves after its live leases (both read from their partial
// indexes, so a backlog costs nothing here), ranks them round-robin across the
// endpoints, and leases the first $3.
const claimDeliveriesSQL = `
	WITH picked AS (
		SELECT d.id, d.endpoint_id, d.next_attempt_at
		FROM unnest($6::uuid[]) AS w(id)
		CROSS JOIN LATERAL (
			SELECT count(*) AS n FROM webhook_deliveries l
			WHERE l.endpoint_id = w.id AND l.state = 'pending' AND l.locked_until IS NOT NULL AND l.locked_until > $1
		) busy
		CROSS JOIN LATERAL (
			SELECT CASE WHEN (
				SELECT a.result FROM webhook_attempts a WHERE a.endpoint_id = w.id ORDER BY a.id DESC LIMIT 1
			) IS DISTINCT FROM 'succeeded' THEN $7::int ELSE $5::int END AS n
		) cap
		CROSS JOIN LATERAL (
			SELECT d.id, d.endpoint_id, d.next_attempt_at FROM webhook_deliveries d
			WHERE d.endpoint_id = w.id AND d.state = 'pending' AND d.next_attempt_at <= $1
				AND (d.locked_until IS NULL OR d.locked_until <= $1)
			ORDER BY d.next_attempt_at, d.id
			LIMIT GREATEST(LEAST(cap.n - busy.n, $3), 0)
			FOR UPDATE OF d SKIP LOCKED
		) d
	), due AS (
		SELECT id FROM (
			SELECT id, next_attempt_at,
				row_number() OVER (PARTITION BY endpoint_id ORDER BY next_attempt_at, id) AS turn
			FROM picked
		) ranked
		ORDER BY turn, next_attempt_at, id LIMIT $3
	), claimed AS (
		UPDATE webhook_deliveries d SET lease_id = $4, locked_until = $2, attempts = d.attempts + 1
		FROM due WHERE d.id = due.id
		RETURNING d.id, d.attempts, d.endpoint_id, d.event_seq, d.event_id
	)
	SELECT c.id, c.attempts, c.endpoint_id, w.url, c.event_id, e.payload, w.secret,
		COALESCE(w.previous_secret, ''), w.previous_secret_expires_at
	FROM claimed c JOIN webhook_endpoints w ON w.id = c.endpoint_id JOIN events e ON e.seq = c.event_seq
	ORDER BY c.id`

// Attempt results.
const (
	AttemptSucceeded = "succeeded" // a 2xx: the delivery is done
	AttemptRetrying  = "retrying"  // a failure with attempts left: the delivery is due again at NextAttemptAt
	AttemptFailed    = "failed"    // a failure without attempts left: the delivery is given up
	AttemptGone      = "gone"      // a 410: the endpoint is disabled and its pending deliveries cancelled
)

// RecordAttemptParams are the outcome of one send of a claimed delivery.
type RecordAttemptParams struct {
	Claim         DeliveryClaim
	At            time.Time // when the request was sent
	Duration      time.Duration
	StatusCode    int    // 0: no answer
	Error         string // why there was no answer, or none
	Result        string // one of the Attempt results
	NextAttemptAt time.Time
}

// UnscopedRecordWebhookAttempt records an attempt and, while the delivery still
// carries the attempt's claim, its outcome: done, due again at NextAttemptAt, or
// given up; AttemptGone also disables the endpoint and cancels its pending
// deliveries. An attempt whose claim lapsed (another relay claimed the delivery since)
// is still recorded but decides nothing (owned=false); one whose endpoint was deleted
// is dropped.
func (s *Store) UnscopedRecordWebhookAttempt(ctx context.Context, p RecordAttemptParams) (owned bool, err error) {
	var status *int
	if p.StatusCode != 0 {
		status = &p.StatusCode
	}
	var errText *string
	if p.Error != "" {
		errText = &p.Error
	}
	err = s.InTx(ctx, func(tx *Store) error {
		_, err := tx.db.Exec(ctx, `
			INSERT INTO webhook_attempts (delivery_id, endpoint_id, event_id, attempt, attempted_at, status_code, error, duration_ms, result)
			SELECT d.id, d.endpoint_id, d.event_id, $2, $3, $4, $5, $6, $7 FROM webhook_deliveries d WHERE d.id = $1`,
			p.Claim.ID, p.Claim.Attempt, p.At, status, errText, p.Duration.Milliseconds(), p.Result)
		if err != nil {
			return err
		}
		var state string
		var next *time.Time
		switch p.Result {
		case AttemptSucceeded:
			state = "succeeded"
		case AttemptRetrying:
			state, next = "pending", &p.NextAttemptAt
		case AttemptFailed, AttemptGone:
			state = "failed"
		default:
			return errors.New("store: unknown attempt result " + strconv.Quote(p.Result))
		}
		tag, err := tx.db.Exec(ctx, `
			UPDATE webhook_deliveries SET state = $3, next_attempt_at = COALESCE($4, next_attempt_at),
				lease_id = NULL, locked_until = NULL, last_status = $5,
				finished_at = CASE WHEN $3 = 'pending' THEN NULL ELSE now() END
			WHERE id = $1 AND lease_id = $2 AND state = 'pending'`, p.Claim.ID, p.Claim.LeaseID, state, next, status)
		if err != nil {
			return err
		}
		owned = tag.RowsAffected() == 1
		if !owned || p.Result != AttemptGone {
			return nil
		}
		if _, err := tx.db.Exec(ctx, `
			UPDATE webhook_endpoints SET disabled_at = $2, disabled_reason = $3, updated_at = now()
			WHERE id = $1 AND disabled_at IS NULL`,
			p.Claim.EndpointID, p.At, "the endpoint answered 410 Gone"); err != nil {
			return err
		}
		_, err = tx.db.Exec(ctx, `
			UPDATE webhook_deliveries SET state = 'cancelled', lease_id = NULL, locked_until = NULL, finished_at = now()
			WHERE endpoint_id = $1 AND state = 'pending'`, p.Claim.EndpointID)
		return err
	})
	return owned, err
}

// WebhookAttempt is one recorded attempt.
type WebhookAttempt struct {
	ID          int64
	DeliveryID  int64
	EndpointID  uuid.UUID
	EventID     string
	Attempt     int
	AttemptedAt time.Time
	StatusCode  int // 0: no answer
	Error       string
	Duration    time.Duration
	Result      string
}

// MaxWebhookAttemptsPage bounds a page of attempts.
const MaxWebhookAttemptsPage = 1000

// ListWebhookAttemptsParams select a page of an endpoint's attempts, newest first:
// those recorded before the attempt Before (0: from the newest), at most Limit.
type ListWebhookAttemptsParams struct {
	EndpointID uuid.UUID
	Before     int64
	Limit      int
}

// UnscopedListWebhookAttempts returns a page of an endpoint's attempts, newest first.
func (s *Store) UnscopedListWebhookAttempts(ctx context.Context, p ListWebhookAttemptsParams) ([]WebhookAttempt, error) {
	if p.Limit <= 0 || p.Limit > MaxWebhookAttemptsPage {
		p.Limit = MaxWebhookAttemptsPage
	}
	q := `SELECT id, delivery_id, endpoint_id, event_id, attempt, attempted_at, COALESCE(status_code, 0),
		COALESCE(error, ''), duration_ms, result FROM webhook_attempts WHERE endpoint_id = $1`
	args := []any{p.EndpointID, p.Limit}
	if p.Before > 0 {
		q += ` AND id < $3`
		args = append(args, p.Before)
	}
	rows, err := s.db.Query(ctx, q+` ORDER BY id DESC LIMIT $2`, args...)
	return collect(rows, err, func(row pgx.Row) (WebhookAttempt, error) {
		var a WebhookAttempt
		var ms int64
		err := row.Scan(&a.ID, &a.DeliveryID, &a.EndpointID, &a.EventID, &a.Attempt, &a.AttemptedAt, &a.StatusCode,
			&a.Error, &ms, &a.Result)
		a.Duration = time.Duration(ms) * time.Millisecond
		return a, err
	})
}

// WebhookDelivery is a delivery's state (tests, diagnostics).
type WebhookDelivery struct {
	ID            int64
	EndpointID    uuid.UUID
	EventID       string
	State         string
	Attempts      int
	NextAttemptAt time.Time
	LastStatus    int
}

// UnscopedListWebhookDeliveries lists an endpoint's deliveries in the order they were
// written.
func (s *Store) UnscopedListWebhookDeliveries(ctx context.Context, endpoint uuid.UUID) ([]WebhookDelivery, error) {
	rows, err := s.db.Query(ctx, `SELECT id, endpoint_id, event_id, state, attempts, next_attempt_at, COALESCE(last_status, 0)
		FROM webhook_deliveries WHERE endpoint_id = $1 ORDER BY id`, endpoint)
	return collect(rows, err, func(row pgx.Row) (WebhookDelivery, error) {
		var d WebhookDelivery
		err := row.Scan(&d.ID, &d.EndpointID, &d.EventID, &d.State, &d.Attempts, &d.NextAttemptAt, &d.LastStatus)
		return d, err
	})
}

// UnscopedLockWebhook reads an endpoint and locks it for the rest of the transaction;
// agentqtype.ErrNotFound if there is none.
func (s *Store) UnscopedLockWebhook(ctx context.Context, id uuid.UUID) (WebhookEndpoint, error) {
	return scanWebhook(s.db.QueryRow(ctx, `SELECT `+webhookCols+` FROM webhook_endpoints WHERE id = $1 FOR UPDATE`, id))
}

// SetWebhookEnabledParams enable or disable an endpoint.
type SetWebhookEnabledParams struct {
	ID      uuid.UUID
	Enabled bool
	// At and Reason are when and why it is disabled (Enabled false).
	At     time.Time
	Reason string
}

// UnscopedSetWebhookEnabled enables an endpoint (its pending deliveries are sent
// again) or disables it (nothing is sent to it, its pending deliveries wait);
// agentqtype.ErrNotFound if there is none. Disabling a disabled endpoint keeps when
// and why it was.
func (s *Store) UnscopedSetWebhookEnabled(ctx context.Context, p SetWebhookEnabledParams) (WebhookEndpoint, error) {
	if p.Enabled {
		return scanWebhook(s.db.QueryRow(ctx, `UPDATE webhook_endpoints SET disabled_at = NULL, disabled_reason = NULL,
			updated_at = now() WHERE id = $1 RETURNING `+webhookCols, p.ID))
	}
	return scanWebhook(s.db.QueryRow(ctx, `UPDATE webhook_endpoints SET disabled_at = COALESCE(disabled_at, $2),
		disabled_reason = COALESCE(disabled_reason, $3), updated_at = now() WHERE id = $1 RETURNING `+webhookCols,
		p.ID, p.At, p.Reason))
}
