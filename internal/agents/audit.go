package agents

import (
	"context"
	"errors"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/internal/store"
)

// actionPut is the audit action of a registration or a replacement.
const actionPut = "agent.put"

func object(name string) audit.Object { return audit.Object{Kind: audit.KindAgent, ID: name} }

// lockAgent is agent name's state, locked; nil when there is none.
func lockAgent(ctx context.Context, tx *store.Store, name string) (*audit.AgentState, error) {
	a, err := tx.LockAgent(ctx, name)
	if errors.Is(err, agentqtype.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return audit.Agent(a), nil
}

// Revert undoes audit row r of an agent's replacement (or a revert): its URL and step
// timeout go back to r's before. Its headers and signing secret stay as they are now:
// the row holds them masked, and a revert never writes a secret. A registration
// cannot be undone (it would delete the agent), nor a deletion or a rotation (they
// would need the secrets back): an *audit.NotRevertibleError.
func (s *Service) Revert(ctx context.Context, r audit.Row) (audit.Head, error) {
	if r.Action != actionPut && r.Action != audit.KindAgent+".revert" {
		return audit.Head{}, audit.NotRevertible(r, "")
	}
	b, err := audit.Decode[audit.AgentState](r.Before)
	if err != nil || b == nil {
		return audit.Head{}, audit.NotRevertible(r, "it registered the agent, and a revert does not delete one (DELETE it instead)")
	}
	var h audit.Head
	err = s.store.InTx(ctx, func(tx *store.Store) error {
		old, err := lockAgent(ctx, tx, r.Object.ID)
		if err != nil {
			return err
		}
		if err := audit.Check(r, old); err != nil {
			return err
		}
		a, err := tx.SetAgentSettings(ctx, store.SetAgentSettingsParams{Name: r.Object.ID, URL: b.URL, StepTimeoutS: b.StepTimeoutS})
		if err != nil {
			return err
		}
		h, err = audit.Append(ctx, tx, audit.RevertOf(r, old, audit.Agent(a)))
		return err
	})
	return h, err
}
