// Package audit is the audit log: who changed what in the deployment's configuration
// or a tenant's spending power, when, from what to what, and why they said they did.
// Every change appends one row (Append) in the transaction of the change itself, so
// the row and the change commit or roll back together. Rows form a hash chain that
// Verify walks; Log reads, verifies and reverts them.
//
// # What a row holds
//
// The actor is the authority the change was made under, as its caller proved it
// (agentqtype.ActorFrom: a named admin credential, a tenant's key, a signed link, the
// command line); ClaimedActor and Reason are what the caller said
// (X-Agentq-Actor, X-Agentq-Reason), kept as said and not proven. Object names what
// changed ({kind, id, tenant}); Before and After are its states (null: it did not
// exist, or no longer does), built by the state functions of this package alone, which
// put Mask wherever a secret would be: API keys, signing and webhook secrets, agent
// header values never reach a row.
//
// # The chain
//
// hash = hex(SHA-256(canonical content)), where the canonical content is the JSON
// array [id, at, actor, claimed_actor, reason, action, object, before, after,
// request_id, reverts, prev_hash]: at in UTC to the microsecond
// ("2006-01-02T15:04:05.000000Z"), each jsonb value re-encoded with object keys sorted,
// no insignificant space, and every number written as its exact decimal value (so 1.0,
// 1 and 1e0 are one number, 0.25 and 2.5e-1 another), absent values null. prev_hash is the hash of the
// row before (64 zeros for the first). Appends lock the chain's head (table
// audit_head) and take their id under the lock, so the chain's order is id order.
package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
)

// Mask stands wherever a secret would be in a row: a revert never writes it back.
const Mask = "••••"

// Genesis is the prev_hash of the first row.
const Genesis = "0000000000000000000000000000000000000000000000000000000000000000"

// Object is what a change was made to: its kind, its id and the tenant it belongs to
// ("" for the deployment's own configuration).
type Object struct {
	Kind   string `json:"kind"`
	ID     string `json:"id"`
	Tenant string `json:"tenant,omitempty"`
}

// The kinds of object.
const (
	KindTenant     = "tenant"
	KindKey        = "key"
	KindAgent      = "agent"
	KindBinding    = "binding" // an agent's binding to a pool; its id is the agent's name
	KindPool       = "pool"
	KindWebhook    = "webhook"
	KindPanelLinks = "panel_links" // a tenant's panel links; its id is the tenant's
	KindTask       = "task"
	KindCredential = "credential" // an admin credential; its id is its name
)

// Entry is one change to record.
type Entry struct {
	Action string // "tenant.update", "key.rotate", ...
	Object Object
	// Before and After are the object's states (a state function's value); nil: it
	// did not exist, or no longer does.
	Before, After any
	// Reverts is the row a revert undoes (0 for any other change).
	Reverts int64
}

// Head is the chain's last row: its id and hash.
type Head struct {
	ID   int64  `json:"id"`
	Hash string `json:"hash"`
}

// library is who acts when the context names no one: a Go program calling the library.
var library = agentqtype.Actor{Kind: agentqtype.ActorLibrary, Name: "library"}

// ActorOf is who acts in ctx, the library when it names no one.
func ActorOf(ctx context.Context) agentqtype.Actor {
	if a, ok := agentqtype.ActorFrom(ctx); ok {
		return a
	}
	return library
}

// Append writes e into the log on tx, the transaction of the change it records, as
// done by ActorOf(ctx), and returns the chain's new head. It holds the chain's lock
// until tx ends.
func Append(ctx context.Context, tx *store.Store, e Entry) (Head, error) {
	row, err := rowOf(ActorOf(ctx), e)
	if err != nil {
		return Head{}, err
	}
	slot, err := tx.UnscopedTakeAuditSlot(ctx)
	if err != nil {
		return Head{}, fmt.Errorf("audit: %w", err)
	}
	row.ID, row.At, row.PrevHash = slot.ID, slot.At, slot.PrevHash
	if row.Hash, err = Hash(row); err != nil {
		return Head{}, err
	}
	if err := tx.UnscopedInsertAudit(ctx, row); err != nil {
		return Head{}, fmt.Errorf("audit: %w", err)
	}
	return Head{ID: row.ID, Hash: row.Hash}, nil
}

// Record is Append in a transaction of its own, for a change that writes nothing else
// (a signed link handed out).
func Record(ctx context.Context, st *store.Store, e Entry) (Head, error) {
	var h Head
	err := st.InTx(ctx, func(tx *store.Store) error {
		var err error
		h, err = Append(ctx, tx, e)
		return err
	})
	return h, err
}

// rowOf is e as a row, its place in the chain not yet known.
func rowOf(a agentqtype.Actor, e Entry) (store.AuditRow, error) {
	r := store.AuditRow{Action: e.Action, ClaimedActor: a.ClaimedActor, Reason: a.Reason, RequestID: a.RequestID}
	if e.Reverts > 0 {
		r.Reverts = &e.Reverts
	}
	var err error
	if r.Actor, err = json.Marshal(a); err != nil {
		return r, fmt.Errorf("audit: actor: %w", err)
	}
	if r.Object, err = json.Marshal(e.Object); err != nil {
		return r, fmt.Errorf("audit: object: %w", err)
	}
	if r.Before, err = stateJSON(e.Before); err != nil {
		return r, err
	}
	r.After, err = stateJSON(e.After)
	return r, err
}

// stateJSON is a state's JSON, nil for none.
func stateJSON(v any) ([]byte, error) {
	if v == nil {
		return nil, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("audit: state: %w", err)
	}
	if string(b) == "null" { // a nil pointer of a state type
		return nil, nil
	}
	return b, nil
}

// atLayout is how the hash writes a row's time.
const atLayout = "2006-01-02T15:04:05.000000Z"

// Hash is the hash of row r's content and r.PrevHash (see the package's doc).
func Hash(r store.AuditRow) (string, error) {
	var jsonb [4]json.RawMessage
	for i, b := range [][]byte{r.Actor, r.Object, r.Before, r.After} {
		c, err := Canonical(b)
		if err != nil {
			return "", fmt.Errorf("audit: row %d: %w", r.ID, err)
		}
		jsonb[i] = c
	}
	content, err := json.Marshal([]any{r.ID, r.At.UTC().Format(atLayout), jsonb[0], r.ClaimedActor, r.Reason, r.Action,
		jsonb[1], jsonb[2], jsonb[3], r.RequestID, r.Reverts, r.PrevHash})
	if err != nil {
		return "", fmt.Errorf("audit: row %d: %w", r.ID, err)
	}
	return sum(content), nil
}

// rowTime is how rows carry their time: UTC, to the microsecond Postgres keeps.
func rowTime(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }
