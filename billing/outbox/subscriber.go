package outbox

import (
	"context"
	"log/slog"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tasks/change"
)

// Subscriber writes the usage events of tasks' state changes: it is the outbox's
// subscriber to the task lifecycle (change.Subscriber). The events a change causes
// are written in its transaction, so they exist exactly when it committed:
//
//   - a step recorded: the threshold crossings of the period quotas (Crossings.Step);
//   - an end as budget_exceeded: the limit_hit of the limit that stopped it
//     (Events.BudgetStop);
//   - a park for the tenant's tokens per minute: the wait's limit_hit (Waits.Parked);
//   - a pause at a limit: the pause's limit_hit with its approval link
//     (Pauses.Paused).
//
// The commitments a start or an expiry shows missed are judged after the change
// committed (Commitments.Started and Expired, on Store): judging a late one reads
// Redis, which no transaction waits on, and the start every task makes stays one
// statement. A crash in between loses that one event.
type Subscriber struct {
	// Store is where the commitments' events are written after the commit.
	Store       *store.Store
	Events      Events
	Crossings   Crossings
	Waits       Waits
	Pauses      Pauses
	Commitments *Commitments // nil: no commitments are checked
	Log         *slog.Logger // nil: slog.Default()
}

// Writes reports the changes whose transaction holds an event of s.
func (s *Subscriber) Writes(kind change.Kind) bool {
	switch kind {
	case change.Step, change.Finished, change.Parked, change.Paused:
		return true
	}
	return false
}

// InTx writes, on tx, the events change c causes.
func (s *Subscriber) InTx(ctx context.Context, tx *store.Store, c change.Change) error {
	switch c.Kind {
	case change.Step:
		if c.Recorded == nil {
			return nil
		}
		return s.Crossings.Step(ctx, tx, *c.Recorded)
	case change.Finished:
		if c.Task.State != agentqtype.TaskStateBudgetExceeded {
			return nil
		}
		return s.Events.BudgetStop(ctx, tx, c.Task, c.Stop)
	case change.Parked:
		return s.Waits.Parked(ctx, tx, c.Task)
	case change.Paused:
		return s.Pauses.Paused(ctx, tx, c.Task, c.Stop)
	}
	return nil
}

// AfterCommit checks a start, or an expiry, against its plan's commitments. Its
// failure cannot undo the change: it is logged, and the lapse goes uncredited.
func (s *Subscriber) AfterCommit(ctx context.Context, c change.Change) {
	if s.Commitments == nil {
		return
	}
	var err error
	switch c.Kind {
	case change.Started:
		err = s.Commitments.Started(ctx, s.Store, c.Task)
	case change.Expired:
		err = s.Commitments.Expired(ctx, s.Store, c.Task)
	default:
		return
	}
	if err != nil {
		log := s.Log
		if log == nil {
			log = slog.Default()
		}
		log.Warn("checking a task against its plan's start commitments failed", "task_id", c.Task.ID, "change", c.Kind, "err", err)
	}
}
