package admission

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/agentq/agentq/quotas"
)

// While Redis is unreachable, admissions are decided in process (Guard.degraded) and
// the admission script, which counts refusals in Redis, does not run. The Guard counts
// those refusals itself, in memory, per tenant, limit and minute, and a flush in the
// same process (rejections.Rejections.FlushLocal) copies them to Postgres, where they are
// told as the platform's refusals, not the plan's.

type localKey struct {
	tenant, limit string
	minute        int64 // minutes since the epoch
}

// localCounts are the Guard's in-process refusal counts.
type localCounts struct {
	mu      sync.Mutex
	counts  map[localKey]int64
	dropped int64 // refusals not counted since the last forget, for lack of room
}

// add counts one refusal by each of limits at now; reports whether one was dropped
// for the first time since the last forget.
func (c *localCounts) add(tenant string, limits []string, now time.Time) (firstDrop bool) {
	minute := now.Unix() / 60
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		c.counts = map[localKey]int64{}
	}
	for _, l := range limits {
		k := localKey{tenant, l, minute}
		if _, ok := c.counts[k]; !ok && len(c.counts) >= quotas.MaxLocalRejections {
			c.dropped++
			firstDrop = firstDrop || c.dropped == 1
			continue
		}
		c.counts[k]++
	}
	return firstDrop
}

func (c *localCounts) snapshot(replica string) quotas.LocalRejections {
	c.mu.Lock()
	keys := make([]localKey, 0, len(c.counts))
	for k := range c.counts {
		keys = append(keys, k)
	}
	out := quotas.LocalRejections{Replica: replica, Counts: make([]quotas.LocalRejection, len(keys))}
	slices.SortFunc(keys, func(a, b localKey) int {
		return cmp.Or(cmp.Compare(a.tenant, b.tenant), cmp.Compare(a.minute, b.minute), cmp.Compare(a.limit, b.limit))
	})
	for i, k := range keys {
		out.Counts[i] = quotas.LocalRejection{TenantID: k.tenant,
			RejectionCount: quotas.RejectionCount{LimitType: k.limit, Minute: time.Unix(k.minute*60, 0).UTC(), Count: c.counts[k]}}
	}
	c.mu.Unlock()
	return out
}

// forget deletes the counts of flushed that are of minutes before before and still
// hold the count flushed; it returns how many it deleted.
func (c *localCounts) forget(flushed quotas.LocalRejections, before time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, rc := range flushed.Counts {
		k := localKey{rc.TenantID, rc.LimitType, rc.Minute.Unix() / 60}
		if rc.Minute.Before(before) && c.counts[k] == rc.Count {
			delete(c.counts, k)
			n++
		}
	}
	c.dropped = 0
	return n
}

// LocalRejections returns the refusals this replica decided in process (Redis
// unreachable) and has not forgotten: what a flush copies to Postgres.
func (g *Guard) LocalRejections() quotas.LocalRejections { return g.rejected.snapshot(g.id) }

// ForgetLocalRejections deletes the counts of flushed, once they are in Postgres,
// that are of minutes before before (ended, so they will not grow) and did not change
// since they were read. It returns how many it deleted. Counts not flushed (Postgres
// was down) stay, for the next flush.
func (g *Guard) ForgetLocalRejections(flushed quotas.LocalRejections, before time.Time) int {
	return g.rejected.forget(flushed, before)
}

// countLocal counts an admission refused in process.
func (g *Guard) countLocal(p quotas.AdmitParams, d quotas.Decision, now time.Time) {
	if p.Mode != quotas.ModeAdmit || d.Allowed || len(d.Violated) == 0 {
		return
	}
	if g.rejected.add(p.TenantID, d.Violated, now) {
		g.log.Warn("in-process refusal counts are full: refusals go uncounted until the next flush", "max", quotas.MaxLocalRejections)
	}
}
