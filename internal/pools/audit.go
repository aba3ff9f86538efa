package pools

import (
	"context"
	"errors"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// The writes of pools and bindings, each on the transaction of its audit row. With a
// revert row, each first checks that its object is still as that row left it (an
// *audit.ConflictError otherwise) and records the revert of that row.

// Actions of the rows.
const (
	actionPoolPut       = "pool.put"
	actionPoolDelete    = "pool.delete"
	actionBindingPut    = "binding.put"
	actionBindingDelete = "binding.delete"
)

func poolObject(name string) audit.Object { return audit.Object{Kind: audit.KindPool, ID: name} }
func bindingObject(agent string) audit.Object {
	return audit.Object{Kind: audit.KindBinding, ID: agent}
}

// lockPool is pool name's state, locked; nil when there is none.
func lockPool(ctx context.Context, tx *store.Store, name string) (*audit.PoolState, error) {
	p, err := tx.LockPool(ctx, name)
	if errors.Is(err, agentqtype.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return audit.Pool(p), nil
}

// lockBinding is agent's binding state, locked; nil when it has none.
func lockBinding(ctx context.Context, tx *store.Store, agent string) (*audit.BindingState, error) {
	b, err := tx.LockAgentPool(ctx, agent)
	if errors.Is(err, agentqtype.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return audit.Binding(b), nil
}

// record appends e, or the revert of row revert from e's before to its after.
func record(ctx context.Context, tx *store.Store, e audit.Entry, revert *audit.Row) (audit.Head, error) {
	if revert != nil {
		e = audit.RevertOf(*revert, e.Before, e.After)
	}
	return audit.Append(ctx, tx, e)
}

func checkRevert(revert *audit.Row, current any) error {
	if revert == nil {
		return nil
	}
	return audit.Check(*revert, current)
}

func putPool(ctx context.Context, tx *store.Store, c quotas.PoolConfig, revert *audit.Row) (bool, audit.Head, error) {
	old, err := lockPool(ctx, tx, c.Name)
	if err != nil {
		return false, audit.Head{}, err
	}
	if err := checkRevert(revert, old); err != nil {
		return false, audit.Head{}, err
	}
	p, created, err := tx.PutPool(ctx, store.PutPoolParams{
		Name: c.Name, TokensPerMinute: c.TokensPerMinute, BurstTokens: c.BurstTokens, RequestsPerMinute: c.RequestsPerMinute,
	})
	if err != nil {
		return false, audit.Head{}, err
	}
	h, err := record(ctx, tx, audit.Entry{Action: actionPoolPut, Object: poolObject(c.Name), Before: old, After: audit.Pool(p)}, revert)
	return created, h, err
}

// deletePool deletes pool name, and records the unbinding of each agent bound to it
// (a binding.delete row each, which a revert can undo once the pool is back).
func deletePool(ctx context.Context, tx *store.Store, name string, revert *audit.Row) (audit.Head, error) {
	old, err := lockPool(ctx, tx, name)
	if err == nil && old == nil {
		err = agentqtype.ErrNotFound
	}
	if err != nil {
		return audit.Head{}, err
	}
	if err := checkRevert(revert, old); err != nil {
		return audit.Head{}, err
	}
	bs, err := tx.ListPoolAgents(ctx, name)
	if err != nil {
		return audit.Head{}, err
	}
	if err := tx.DeletePool(ctx, name); err != nil {
		return audit.Head{}, err
	}
	for _, b := range bs {
		if _, err := audit.Append(ctx, tx, audit.Entry{Action: actionBindingDelete, Object: bindingObject(b.Agent), Before: audit.Binding(b)}); err != nil {
			return audit.Head{}, err
		}
	}
	return record(ctx, tx, audit.Entry{Action: actionPoolDelete, Object: poolObject(name), Before: old}, revert)
}

func putBinding(ctx context.Context, tx *store.Store, p BindParams, revert *audit.Row) (bool, audit.Head, error) {
	old, err := lockBinding(ctx, tx, p.Agent)
	if err != nil {
		return false, audit.Head{}, err
	}
	if err := checkRevert(revert, old); err != nil {
		return false, audit.Head{}, err
	}
	b, created, err := tx.PutAgentPool(ctx, store.PutAgentPoolParams{Agent: p.Agent, Pool: p.Pool, TokensPerStep: p.TokensPerStep})
	if err != nil {
		return false, audit.Head{}, err
	}
	h, err := record(ctx, tx, audit.Entry{Action: actionBindingPut, Object: bindingObject(p.Agent), Before: old, After: audit.Binding(b)}, revert)
	return created, h, err
}

func deleteBinding(ctx context.Context, tx *store.Store, agent string, revert *audit.Row) (audit.Head, error) {
	old, err := lockBinding(ctx, tx, agent)
	if err == nil && old == nil {
		err = agentqtype.ErrNotFound
	}
	if err != nil {
		return audit.Head{}, err
	}
	if err := checkRevert(revert, old); err != nil {
		return audit.Head{}, err
	}
	if err := tx.DeleteAgentPool(ctx, agent); err != nil {
		return audit.Head{}, err
	}
	return record(ctx, tx, audit.Entry{Action: actionBindingDelete, Object: bindingObject(agent), Before: old}, revert)
}

// RevertPool undoes audit row r of a pool (put, delete, or a revert): the pool goes
// back to r's before, deleted when it did not exist, created again when r deleted it.
func (s *Service) RevertPool(ctx context.Context, r audit.Row) (audit.Head, error) {
	b, err := audit.Decode[audit.PoolState](r.Before)
	if err != nil {
		return audit.Head{}, err
	}
	defer s.forget()
	var h audit.Head
	err = s.d.Store.InTx(ctx, func(tx *store.Store) error {
		if b == nil {
			h, err = deletePool(ctx, tx, r.Object.ID, &r)
			return err
		}
		c := quotas.PoolConfig{Name: r.Object.ID, TokensPerMinute: b.TokensPerMinute, BurstTokens: b.BurstTokens, RequestsPerMinute: b.RequestsPerMinute}
		if err := checkConfig(c); err != nil {
			return err
		}
		_, h, err = putPool(ctx, tx, c, &r)
		return err
	})
	return h, revertErr(r, err, "")
}

// RevertBinding undoes audit row r of an agent's binding (bound, unbound, or a
// revert): the binding goes back to r's before.
func (s *Service) RevertBinding(ctx context.Context, r audit.Row) (audit.Head, error) {
	b, err := audit.Decode[audit.BindingState](r.Before)
	if err != nil {
		return audit.Head{}, err
	}
	defer s.forget()
	var h audit.Head
	err = s.d.Store.InTx(ctx, func(tx *store.Store) error {
		if b == nil {
			h, err = deleteBinding(ctx, tx, r.Object.ID, &r)
			return err
		}
		p := BindParams{Agent: r.Object.ID, Pool: b.Pool, TokensPerStep: b.TokensPerStep}
		if err := s.checkAgent(ctx, p.Agent); err != nil {
			return err
		}
		_, h, err = putBinding(ctx, tx, p, &r)
		return err
	})
	pool := ""
	if b != nil {
		pool = b.Pool
	}
	return h, revertErr(r, err, pool)
}

// revertErr words a revert's failure: an object gone that the row's after says
// exists is a conflict, a pool gone that a binding's before names is one too.
func revertErr(r audit.Row, err error, pool string) error {
	var nf *agentqtype.NotFoundError
	switch {
	case errors.As(err, &nf): // the agent a binding's before names
		return &audit.ConflictError{ID: r.ID, Object: audit.Object{Kind: audit.KindAgent, ID: nf.Name}, Existence: "deleted"}
	case errors.Is(err, agentqtype.ErrNotFound):
		return &audit.ConflictError{ID: r.ID, Object: r.Object, Existence: "deleted"}
	case errors.Is(err, store.ErrMissingReference): // the pool a binding's before names
		return &audit.ConflictError{ID: r.ID, Object: audit.Object{Kind: audit.KindPool, ID: pool}, Existence: "deleted"}
	}
	return err
}
