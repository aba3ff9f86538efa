package quotas

import (
	"context"
	"sync"
	"time"

	"github.com/riverqueue/river/rivershared/startstop"
)

// Coalescing: while one admission script call of a shard is in flight, admissions that
// arrive for that shard queue up and go together in the next call (a group commit).
// An idle system sends each admission alone at once, so coalescing adds no latency;
// under load it turns N round trips and N script invocations into one, which is where
// most of an admission's cost went.

// maxBatch bounds one call: its KEYS (admitKeysPerCall per admission) and its run time, since Redis
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

	// closed is set when the Coalescer stops: later admissions go straight to Redis.
	// Senders hold mu for reading while they queue, so once closed is set under the
	// write lock nothing more is queued and the runners can drain what is left.
	mu     sync.RWMutex
	closed bool
}

func (b *batcher) admit(ctx context.Context, p AdmitParams) (Decision, error) {
	r := admitReq{ctx: ctx, p: p, res: make(chan admitRes, 1)}
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return b.q.admitOne(ctx, p)
	}
	select {
	case b.reqs <- r:
		b.mu.RUnlock()
	case <-ctx.Done():
		b.mu.RUnlock()
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

func (b *batcher) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
}

// run sends queued admissions a batch per call until quit is closed, then answers what
// is still queued and returns.
func (b *batcher) run(quit <-chan struct{}) {
	batch := make([]admitReq, 0, maxBatch)
	for {
		batch = batch[:0]
		select {
		case <-quit:
			for {
				select {
				case r := <-b.reqs:
					if batch = append(batch, r); len(batch) == maxBatch {
						b.call(batch)
						batch = batch[:0]
					}
				default:
					b.call(batch)
					return
				}
			}
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
		b.call(batch)
	}
}

// call runs one batch in one script call and answers each caller.
func (b *batcher) call(batch []admitReq) {
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
		return
	}
	// Each caller bounds its own wait; the call itself is bounded by the timeout only,
	// so a stopping coalescer still answers the batch it holds.
	cctx, cancel := context.WithTimeout(context.Background(), b.timeout)
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

// Coalescer turns on coalescing for a Quotas while it runs: a batcher per shard, whose
// goroutines send the admissions queued for that shard together. Stopped, admissions
// go straight to Redis again.
type Coalescer struct {
	startstop.BaseStartStop

	q       *Quotas
	timeout time.Duration
}

// NewCoalescer returns a stopped Coalescer for q; timeout bounds each script call.
func NewCoalescer(q *Quotas, timeout time.Duration) *Coalescer {
	return &Coalescer{q: q, timeout: timeout}
}

// Start turns coalescing on until Stop or ctx ends.
func (c *Coalescer) Start(ctx context.Context) error {
	ctx, shouldStart, started, stopped := c.StartInit(ctx)
	if !shouldStart {
		return nil
	}
	bs := make([]*batcher, c.q.keys.Shards())
	quit := make(chan struct{})
	var wg sync.WaitGroup
	for i := range bs {
		b := &batcher{q: c.q, reqs: make(chan admitReq, 4*maxBatch), timeout: c.timeout}
		bs[i] = b
		// Two callers per shard: one batch builds and parses in Go while the other is
		// in Redis. Admissions in flight together have no order between them anyway.
		for range batchCallers {
			wg.Go(func() { b.run(quit) })
		}
	}
	c.q.setBatchers(bs)
	go func() {
		started()
		defer stopped()
		<-ctx.Done()
		c.q.setBatchers(nil)
		for _, b := range bs {
			b.close()
		}
		close(quit)
		wg.Wait()
	}()
	return nil
}

func (q *Quotas) setBatchers(bs []*batcher) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.batchers = bs
}

func (q *Quotas) batcherFor(tenantID string) *batcher {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.batchers == nil {
		return nil
	}
	return q.batchers[q.keys.Shard(tenantID)]
}
