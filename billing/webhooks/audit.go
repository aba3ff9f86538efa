package webhooks

import (
	"context"
	"errors"

	"github.com/google/uuid"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/internal/store"
)

// Audit actions of the endpoints' changes.
const (
	actionRotate = "webhook.rotate_secret"
	actionUpdate = "webhook.update"
)

// DisabledByOperator is the disabled_reason of an endpoint an operator disabled.
const DisabledByOperator = "disabled by an operator"

// record appends the audit row of an endpoint's change from before to after (nil:
// none), its secret masked, on tx.
func record(ctx context.Context, tx *store.Store, action string, before, after *Webhook) error {
	e := audit.Entry{Action: action}
	if before != nil {
		e.Before, e.Object = audit.Webhook(*before), object(*before)
	}
	if after != nil {
		e.After, e.Object = audit.Webhook(*after), object(*after)
	}
	_, err := audit.Append(ctx, tx, e)
	return err
}

func object(w Webhook) audit.Object {
	return audit.Object{Kind: audit.KindWebhook, ID: w.ID.String(), Tenant: w.TenantID}
}

// SetEnabled enables or disables an endpoint, the operator's or a tenant's. A
// disabled endpoint receives nothing (events written meanwhile are not delivered to
// it later) and its pending deliveries wait; enabled again, they are sent.
func (w *Webhooks) SetEnabled(ctx context.Context, id string, enabled bool) (Webhook, error) {
	u, err := ParseWebhookID(id)
	if err != nil {
		return Webhook{}, err
	}
	var ep Webhook
	err = w.st.InTx(ctx, func(tx *store.Store) error {
		ep, _, err = w.setEnabled(ctx, tx, u, enabled, nil)
		return err
	})
	if err != nil {
		return Webhook{}, w.notFound(err, id)
	}
	return hideSecrets(ep), nil
}

// setEnabled is SetEnabled on tx, or the revert of row revert when set (refused with
// an *audit.ConflictError unless the endpoint is as that row left it).
func (w *Webhooks) setEnabled(ctx context.Context, tx *store.Store, id uuid.UUID, enabled bool, revert *audit.Row) (Webhook, audit.Head, error) {
	old, err := tx.UnscopedLockWebhook(ctx, id)
	if err != nil {
		return Webhook{}, audit.Head{}, err
	}
	if revert != nil {
		if err := audit.Check(*revert, audit.Webhook(old)); err != nil {
			return Webhook{}, audit.Head{}, err
		}
	}
	ep, err := tx.UnscopedSetWebhookEnabled(ctx, store.SetWebhookEnabledParams{ID: id, Enabled: enabled, At: w.arch.Now(), Reason: DisabledByOperator})
	if err != nil {
		return Webhook{}, audit.Head{}, err
	}
	e := audit.Entry{Action: actionUpdate, Object: object(ep), Before: audit.Webhook(old), After: audit.Webhook(ep)}
	if revert != nil {
		e = audit.RevertOf(*revert, e.Before, e.After)
	}
	h, err := audit.Append(ctx, tx, e)
	return ep, h, err
}

// Revert undoes audit row r of an endpoint's enablement (an update, or a revert): it
// is enabled or disabled as r found it. Its other changes (creation, deletion, a new
// secret) cannot be undone: an *audit.NotRevertibleError.
func (w *Webhooks) Revert(ctx context.Context, r audit.Row) (audit.Head, error) {
	if r.Action != actionUpdate && r.Action != audit.KindWebhook+".revert" {
		return audit.Head{}, audit.NotRevertible(r, "")
	}
	b, err := audit.Decode[audit.WebhookState](r.Before)
	if err != nil || b == nil {
		return audit.Head{}, audit.NotRevertible(r, "it records no earlier state")
	}
	u, err := ParseWebhookID(r.Object.ID)
	if err != nil {
		return audit.Head{}, err
	}
	var h audit.Head
	err = w.st.InTx(ctx, func(tx *store.Store) error {
		_, h, err = w.setEnabled(ctx, tx, u, b.Enabled, &r)
		return err
	})
	if errors.Is(err, agentqtype.ErrNotFound) {
		return audit.Head{}, &audit.ConflictError{ID: r.ID, Object: r.Object, Existence: "deleted"}
	}
	return h, err
}
