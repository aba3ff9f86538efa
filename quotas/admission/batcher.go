package admission

import (
	"context"
	"time"

	"github.com/agentq/agentq/internal/groupcommit"
	"github.com/agentq/agentq/quotas"
)

// Coalescing: while one admission script call of a shard is in flight, admissions that
// arrive for that shard queue up and go together in the next call (a group commit).
// An idle system sends each admission alone at once, so coalescing adds no latency;
// under load it turns N round trips and N script invocations into one, which is where
// most of an admission's cost went.

// maxBatch bounds one call: its KEYS (admitKeysPerCall per admission) and its run time, since Redis
// serves nothing else while a script runs.
const maxBatch = 32

// batchCallers is the number of script calls a shard may have in flight at once: one
// batch builds and parses in Go while the other is in Redis. Admissions in flight
// together have no order between them anyway.
const batchCallers = 2

// defaultCoalesceTimeout bounds a coalesced script call when Options give no bound.
const defaultCoalesceTimeout = 5 * time.Second

// admitReq is one admission in a shard's group commit, and its answer.
type admitReq struct {
	ctx context.Context
	p   quotas.AdmitParams
	a   answer
	err error
}

// newAdmitGroups makes a group commit per shard.
func (a *Admitter) newAdmitGroups() []groupcommit.Group[*admitReq] {
	gs := make([]groupcommit.Group[*admitReq], a.keys.Shards())
	for i := range gs {
		gs[i].Flush = a.admitCall
		gs[i].MaxBatch = maxBatch
		gs[i].Flushers = batchCallers
	}
	return gs
}

// admitCoalesced sends p in its shard's next script call.
func (a *Admitter) admitCoalesced(ctx context.Context, p quotas.AdmitParams) (answer, error) {
	r := &admitReq{ctx: ctx, p: p}
	a.admits[a.keys.Shard(p.TenantID)].Do(r)
	if r.err != nil {
		return answer{}, r.err
	}
	if err := ctx.Err(); err != nil {
		// The call may have taken the admission; the caller treats this as a failure
		// and its lease, if any, expires or is reconciled.
		return answer{}, err
	}
	return r.a, nil
}

// admitCall runs one batch in one script call and answers each caller.
func (a *Admitter) admitCall(batch []*admitReq) {
	live := batch[:0:0]
	ps := make([]quotas.AdmitParams, 0, len(batch))
	for _, r := range batch {
		if r.ctx.Err() != nil { // the caller gave up: take nothing for it
			r.err = r.ctx.Err()
			continue
		}
		live = append(live, r)
		ps = append(ps, r.p)
	}
	if len(ps) == 0 {
		return
	}
	// One caller leaving must not fail the others: the call is bounded by the
	// coalescing timeout only.
	cctx, cancel := context.WithTimeout(context.Background(), a.coalesceTimeout)
	ds, err := a.admitBatch(cctx, ps)
	cancel()
	for i, r := range live {
		if err != nil {
			r.err = err
		} else {
			r.a = ds[i]
		}
	}
}
