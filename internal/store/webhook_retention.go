package store

import (
	"context"
	"errors"
	"time"
)

// PruneWebhookDeliveriesParams select what one prune deletes: at most Limit (> 0)
// finished deliveries (succeeded, failed or cancelled) that finished before Before,
// oldest first, with their attempts.
type PruneWebhookDeliveriesParams struct {
	Before time.Time
	Limit  int
}

// UnscopedPruneWebhookDeliveries deletes one batch of finished deliveries older than
// the retention, every tenant's, and their attempts, and returns how many of each it
// deleted. A pending delivery is never deleted, however old: it is still to be sent,
// and its attempts are its history. Rows another transaction holds are skipped (the
// next batch takes them), so a prune never waits on a relay.
func (s *Store) UnscopedPruneWebhookDeliveries(ctx context.Context, p PruneWebhookDeliveriesParams) (deliveries, attempts int64, err error) {
	if p.Limit <= 0 {
		return 0, 0, errors.New("store: prune webhook deliveries: the batch limit must be above 0")
	}
	err = s.db.QueryRow(ctx, `
		WITH d AS (
			SELECT id FROM webhook_deliveries
			WHERE state <> 'pending' AND finished_at < $1
			ORDER BY finished_at LIMIT $2
			FOR UPDATE SKIP LOCKED
		), a AS (
			DELETE FROM webhook_attempts WHERE delivery_id IN (SELECT id FROM d) RETURNING 1
		), gone AS (
			DELETE FROM webhook_deliveries WHERE id IN (SELECT id FROM d) RETURNING 1
		)
		SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM a)`, p.Before, p.Limit).Scan(&deliveries, &attempts)
	return deliveries, attempts, err
}
