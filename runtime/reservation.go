package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/quotas"
)

// reservation is a task's step capacity in one value: what its current step reserved
// against its tenant's quotas (one step, its estimated tokens and cost, in the step's
// billing period) and from its agent's model pool, which of the two it still holds,
// and what the next step is estimated at. Its methods settle or give back what is
// held and only that, so no path books a reservation twice or leaves half of one
// behind; where a method touches both, they share one round trip.
type reservation struct {
	limits Limits
	batch  *redisx.Batch
	log    *slog.Logger

	tenant string
	quotas quotas.Limits      // the tenant's
	weight int                // the tenant's fair-share weight, for the pool
	pool   quotas.PoolBinding // the model pool the agent draws on, when bound
	bound  bool

	// period is the current step's billing period: a task running across the boundary
	// books its later steps into the new period, and a settlement goes to its
	// reservation's. tokens and cost are what the step reserved: tokens its estimate
	// (see taskRun.tokenEstimate), cost what the previous step cost (the first
	// reserves nothing beyond the step itself).
	period       quotas.Period
	tokens, cost int64
	held         holding
	// unpaced says the pool granted while no tenant waited: the grant moved no pass,
	// and its settlement or give-back moves none.
	unpaced bool
	// next is the agent's estimate of its next step's tokens (0: none).
	next int64
}

// holding is what of a step's reservation is held.
type holding uint8

const (
	holdsQuota holding = 1 << iota // the step against the tenant's quotas
	holdsPool                      // its tokens from the model pool
)

// The stores a step's reservation could not reach: the task goes back to queued.
var (
	errQuotaStore = errors.New("the quota store is unreachable")
	errPoolStore  = errors.New("the model pool's store is unreachable")
)

// Reserve reserves a step estimated at tokens, in period, against the tenant's period
// quotas and tokens per minute and, when the agent is bound to a model pool, the pool.
// The pool is tried in the same round trip (along ride in it too, on its pipe): an
// uncontended pool costs no round trip of its own. The pool's line is taken only by
// a step that may run: a try takes no place unless granted, a grant to a step its
// own limits hold back is given back at once, and a step that may run but was not
// granted asks the pool again, taking its place. A held-back step waits the longer
// of its own wait and the pool's.
//
// It returns nil when the step holds its reservation; a *quotas.QuotaExceeded; a
// *quotas.CapacityWait, holding nothing; or an error wrapping errQuotaStore or
// errPoolStore, holding nothing: money and token quotas fail closed.
func (s *reservation) Reserve(ctx context.Context, period quotas.Period, tokens int64, along ...func(redis.Pipeliner)) error {
	s.period, s.tokens, s.held = period, tokens, 0
	var tried func() (quotas.TokenAnswer, error)
	if s.bound {
		along = append(along, func(pipe redis.Pipeliner) { tried = s.limits.TryPool(ctx, pipe, s.poolParams()) })
	}
	err := s.limits.ReserveStep(ctx, s.ofTenant(quotas.StepParams{Tokens: tokens, CostMicro: s.cost}), along...)
	var try quotas.TokenAnswer
	tryErr := errPoolStore // a pool not tried answers nothing
	if tried != nil {
		try, tryErr = tried()
	}
	if err != nil && tryErr == nil && try.Granted {
		s.held, s.unpaced = holdsPool, try.Unpaced
		s.Refund(ctx) // the step does not run: the pool's grant goes back
	}
	var qe *quotas.QuotaExceeded
	var wait *quotas.CapacityWait
	switch {
	case errors.As(err, &qe):
		return err
	case errors.As(err, &wait):
		if tryErr == nil && !try.Granted {
			wait.Wait = max(wait.Wait, try.Wait)
		}
		return err
	case err != nil:
		return fmt.Errorf("%w: %w", errQuotaStore, err)
	}
	s.held = holdsQuota
	if !s.bound {
		return nil
	}
	if tryErr == nil && try.Granted {
		s.held, s.unpaced = s.held|holdsPool, try.Unpaced
		return nil
	}
	ans, err := s.limits.ReservePool(ctx, s.poolParams())
	if err == nil && ans.Granted {
		s.held, s.unpaced = s.held|holdsPool, ans.Unpaced
		return nil
	}
	s.Refund(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", errPoolStore, err)
	}
	reason := s.pool.Pool.WaitReason()
	if ans.Throttled {
		reason = s.pool.Pool.ThrottleReason() // the tenant is held back after a refusal
	}
	return &quotas.CapacityWait{Reason: reason, Wait: ans.Wait}
}

// Settle books a recorded step's use against what it holds, the pool's and the
// quotas' in one round trip: the difference between what it reserved and what it
// used. What the step cost is what the next step reserves.
func (s *reservation) Settle(ctx context.Context, used quotas.StepParams) {
	held := s.held
	s.held = 0
	s.book(ctx, held, used.Tokens-s.tokens, quotas.StepParams{Tokens: used.Tokens - s.tokens, CostMicro: used.CostMicro - s.cost})
	s.cost = used.CostMicro
}

// SettleWithEnd settles a last step's use against the pool now (its tokens were drawn
// whatever becomes of its record) and returns the quotas' settlement, to make with the
// task's end once its record is written. Until then the quotas' part stays held: an
// end not recorded gives it back (Refund).
func (s *reservation) SettleWithEnd(ctx context.Context, used quotas.StepParams) quotas.StepParams {
	s.book(ctx, s.held&holdsPool, used.Tokens-s.tokens, quotas.StepParams{})
	s.held &^= holdsPool
	return s.ofTenant(quotas.StepParams{Tokens: used.Tokens - s.tokens, CostMicro: used.CostMicro - s.cost})
}

// Unbilled settles a step that ran but is recorded nowhere: the pool is settled with
// its use (its tokens were drawn), the quotas' reservation goes back (not in the
// ledger, so not billed in Redis either).
func (s *reservation) Unbilled(ctx context.Context, usedTokens int64) {
	held := s.held
	s.held = 0
	s.book(ctx, held, usedTokens-s.tokens, s.giveBack())
}

// Refund gives back what the step holds, its quotas' and its pool's reservations, in
// one round trip: the step did not run, or nothing of it is billed.
func (s *reservation) Refund(ctx context.Context) {
	held := s.held
	s.held = 0
	if held&holdsPool == 0 {
		s.book(ctx, held, 0, s.giveBack())
		return
	}
	s.send(ctx, "giving a step's reservation back", func(pipe redis.Pipeliner) {
		if held&holdsQuota != 0 {
			_ = s.limits.SettleStep(ctx, pipe, s.ofTenant(s.giveBack()))
		}
		// Its tokens, its request and its move of the tenant's pass and the pool's
		// virtual time.
		_, _ = s.limits.GiveBackPool(ctx, pipe, quotas.PoolSettleParams{Pool: s.pool.Pool, Tenant: s.tenant, Tokens: s.tokens, Unpaced: s.unpaced})
	})
}

// Throttled handles a step the agent's upstream refused: the step does not count (its
// reservation goes back) and the refusal is reported to the pool, which holds the
// tenant back (and lowers itself only on evidence across tenants). It returns the
// wait reason and the wait: the retry time, or the tenant's back-off when longer.
func (s *reservation) Throttled(ctx context.Context, retry time.Duration) (reason agentqtype.WaitReason, wait time.Duration) {
	s.Refund(ctx)
	if !s.bound {
		return agentqtype.WaitThrottled(""), retry
	}
	th, err := s.limits.ThrottlePool(ctx, quotas.PoolThrottleParams{
		Pool: s.pool.Pool, Tenant: s.tenant, Tokens: s.tokens, RetryAfter: retry})
	if err != nil {
		s.log.Warn("reporting a throttled step to its model pool failed", "pool", s.pool.Pool.Name, "err", err)
	}
	return s.pool.Pool.ThrottleReason(), max(retry, th.Backoff)
}

// Park is what a step that waits for capacity leaves for its next try: the tokens it
// was estimated at and what the previous step cost, which the task records with its
// park. A parked step holds nothing: whatever it held goes back.
func (s *reservation) Park(ctx context.Context) (tokens, cost int64) {
	s.Refund(ctx)
	return s.tokens, s.cost
}

// drawsPool reports whether the step holds tokens of its pool.
func (s *reservation) drawsPool() bool { return s.held&holdsPool != 0 }

// giveBack is the quotas' settlement that gives the step's reservation back.
func (s *reservation) giveBack() quotas.StepParams {
	return quotas.StepParams{Steps: -1, Tokens: -s.tokens, CostMicro: -s.cost}
}

// book settles what held names of the step: the pool by poolDelta tokens, the quotas
// by step, in one round trip.
func (s *reservation) book(ctx context.Context, held holding, poolDelta int64, step quotas.StepParams) {
	pool := held&holdsPool != 0 && poolDelta != 0
	quota := held&holdsQuota != 0 && (step.Steps != 0 || step.Tokens != 0 || step.CostMicro != 0)
	if !pool && !quota {
		return
	}
	s.send(ctx, "settling a step's reservation", func(pipe redis.Pipeliner) {
		if quota {
			_ = s.limits.SettleStep(ctx, pipe, s.ofTenant(step))
		}
		if pool {
			_, _ = s.limits.SettlePool(ctx, pipe, quotas.PoolSettleParams{Pool: s.pool.Pool, Tenant: s.tenant, Tokens: poolDelta, Unpaced: s.unpaced})
		}
	})
}

// send makes the calls queue adds in one round trip, shared with the worker's other
// calls of the moment; a failure is logged (the counters' recount repairs the
// quotas, the pool's bucket refills).
func (s *reservation) send(ctx context.Context, what string, queue func(redis.Pipeliner)) {
	ctx, cancel := quotaCtx(ctx)
	defer cancel()
	if err := s.batch.Do(ctx, queue); err != nil {
		s.log.Warn(what+" failed", "pool", s.pool.Pool.Name, "err", err)
	}
}

// ofTenant completes a step's quota parameters with the tenant, the step's period
// and the tenant's limits.
func (s *reservation) ofTenant(p quotas.StepParams) quotas.StepParams {
	p.TenantID, p.Period, p.Limits = s.tenant, s.period, s.quotas
	return p
}

func (s *reservation) poolParams() quotas.PoolReserveParams {
	return quotas.PoolReserveParams{Pool: s.pool.Pool, Tenant: s.tenant, Weight: s.weight, Tokens: s.tokens}
}

// quotaCtx is the context of a step's reservations: not cancelled with the delivery
// (a reservation Redis made must be answered, or what it took would never go back),
// and bounded.
func quotaCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), quotaTimeout)
}

// quotaTimeout bounds a step's reservations.
const quotaTimeout = 5 * time.Second
