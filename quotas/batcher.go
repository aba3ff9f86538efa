package quotas

import (
	"context"
	"time"
)

// Coalescing: while one admission script call of a shard is in flight, admissions that
// arrive for that shard queue up and go together in the next call (a group commit).
// An idle system sends each admission alone at once, so coalescing adds no latency;
// under load it turns N round trips and N script invocations into one, which is where
// most of an admission's cost went.

// maxBatch bounds one call: its KEYS (5 per admission) and its run time, since Redis
// serves nothing else while a script runs.
const maxBatch = 32

// batchCallers is the number of script calls a shard may have in flight at once.
const batchCallers = 2

type admitReq struct {
	ctx context.Context
	p   AdmitParams
	res chan admitRes
}

type admitRes struct {
	d   Decision
	err error
}

type batcher struct {
	q       *Quotas
	reqs    chan admitReq
	timeout time.Duration
}

func (b *batcher) admit(ctx context.Context, p AdmitParams) (Decision, error) {
	r := admitReq{ctx: ctx, p: p, res: make(chan admitRes, 1)}
	select {
	case b.reqs <- r:
	case <-ctx.Done():
		return Decision{}, ctx.Err()
	}
	select {
	case out := <-r.res:
		return out.d, out.err
	case <-ctx.Done():
		// The call may still take the admission; the caller treats this as a failure
		// and its lease, if any, expires or is reconciled.
		return Decision{}, ctx.Err()
	}
}

func (b *batcher) run(ctx context.Context) {
	batch := make([]admitReq, 0, maxBatch)
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return
		case r := <-b.reqs:
			batch = append(batch, r)
		}
	drain:
		for len(batch) < maxBatch {
			select {
			case r := <-b.reqs:
				batch = append(batch, r)
			default:
				break drain
			}
		}
		live := batch[:0:0]
		ps := make([]AdmitParams, 0, len(batch))
		for _, r := range batch {
			if r.ctx.Err() != nil { // the caller gave up: take nothing for it
				r.res <- admitRes{err: r.ctx.Err()}
				continue
			}
			live = append(live, r)
			ps = append(ps, r.p)
		}
		if len(ps) == 0 {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, b.timeout)
		ds, err := b.q.admitBatch(cctx, ps)
		cancel()
		for i, r := range live {
			if err != nil {
				r.res <- admitRes{err: err}
			} else {
				r.res <- admitRes{d: ds[i]}
			}
		}
	}
}

// Start turns on coalescing: one batcher goroutine per shard, until Stop. timeout
// bounds each script call.
func (q *Quotas) Start(ctx context.Context, timeout time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.stop != nil {
		return
	}
	ctx, q.stop = context.WithCancel(ctx)
	q.batchers = make([]*batcher, q.keys.Shards())
	for i := range q.batchers {
		b := &batcher{q: q, reqs: make(chan admitReq, 4*maxBatch), timeout: timeout}
		q.batchers[i] = b
		// Two callers per shard: one batch builds and parses in Go while the other is
		// in Redis. Admissions in flight together have no order between them anyway.
		for range batchCallers {
			q.wg.Go(func() { b.run(ctx) })
		}
	}
}

// Stop ends coalescing; later calls go straight to Redis.
func (q *Quotas) Stop() {
	q.mu.Lock()
	stop := q.stop
	q.stop, q.batchers = nil, nil
	q.mu.Unlock()
	if stop != nil {
		stop()
		q.wg.Wait()
	}
}

func (q *Quotas) batcherFor(tenantID string) *batcher {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.batchers == nil {
		return nil
	}
	return q.batchers[q.keys.Shard(tenantID)]
}
