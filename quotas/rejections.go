package quotas

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/rkeys"
)

// Refused admissions are counted in Redis by the admission script itself (one HINCRBY
// per refusal, see admitScript), per tenant, minute and combination of limits that
// refused, and flushed to Postgres by a janitor pass (rejections.Rejections). So a refusal
// costs no Postgres write and no extra round trip, and a tenant refused thousands of
// times a second costs one row per limit per minute.

// RejectionsTTL bounds the life of a tenant's refusal counts that are never flushed
// (no janitor running): the flush prunes them long before.
const RejectionsTTL = 24 * time.Hour

// RejectionCount is how many of a tenant's admissions one limit refused in one minute.
// An admission refused by several limits counts once for each.
type RejectionCount struct {
	LimitType string
	Minute    time.Time // the minute's start, UTC
	Count     int64
	// Period is the id of the billing period a monthly quota's refusals were decided
	// in (the earliest, if a minute holds several); "" for the other limits.
	Period string
}

// TenantRejections are a tenant's refusal counts as Redis holds them.
type TenantRejections struct {
	TenantID string
	// Fields are the raw counts (rkeys.RejectionField → count), which Prune compares
	// before it deletes one.
	Fields map[string]int64
}

// Counts expands the raw counts into counts per limit and minute, sorted by minute and
// limit type.
func (r TenantRejections) Counts() []RejectionCount {
	type key struct {
		limit  string
		minute int64
	}
	sum := map[key]int64{}
	periods := map[key]string{}
	for f, n := range r.Fields {
		mask, minute, period, err := rkeys.ParseRejectionField(f)
		if err != nil {
			continue // not written by the admission script
		}
		for _, name := range scopeOrder {
			if mask&scopeBits[name] == 0 {
				continue
			}
			k := key{name, minute}
			sum[k] += n
			if monthly := name == AITokensMonthly || name == USDMonthly; monthly && period != "" {
				if p, ok := periods[k]; !ok || period < p {
					periods[k] = period
				}
			}
		}
	}
	out := make([]RejectionCount, 0, len(sum))
	for k, n := range sum {
		out = append(out, RejectionCount{LimitType: k.limit, Minute: time.UnixMilli(k.minute * 60000).UTC(), Count: n, Period: periods[k]})
	}
	slices.SortFunc(out, func(a, b RejectionCount) int {
		if c := a.Minute.Compare(b.Minute); c != 0 {
			return c
		}
		return cmp.Compare(a.LimitType, b.LimitType)
	})
	return out
}

// scopeOrder lists the scope bits' limits in bit order.
var scopeOrder = func() []string {
	names := make([]string, 0, len(scopeBits))
	for name := range scopeBits {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int { return int(scopeBits[a] - scopeBits[b]) })
	return names
}()

// RejectingTenants returns the tenants of a shard with refusal counts in Redis.
func (q *Quotas) RejectingTenants(ctx context.Context, shard int) ([]string, error) {
	ids, err := q.rdb.SMembers(ctx, q.keys.RejectingTenants(shard)).Result()
	if err != nil {
		return nil, fmt.Errorf("quotas: rejecting tenants: %w", err)
	}
	slices.Sort(ids)
	return ids, nil
}

// Rejections reads tenants' refusal counts, one pipelined read.
func (q *Quotas) Rejections(ctx context.Context, tenants []string) ([]TenantRejections, error) {
	pipe := q.rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(tenants))
	for i, t := range tenants {
		cmds[i] = pipe.HGetAll(ctx, q.keys.Rejections(t))
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, fmt.Errorf("quotas: rejections: %w", err)
	}
	out := make([]TenantRejections, len(tenants))
	for i, t := range tenants {
		out[i] = TenantRejections{TenantID: t, Fields: map[string]int64{}}
		for f, v := range cmds[i].Val() {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				out[i].Fields[f] = n
			}
		}
	}
	return out, nil
}

// pruneRejectionsScript deletes refusal counts that were flushed, and drops the tenant
// from its shard's set once none are left. A field is deleted only if it still holds
// the count flushed: one counted again since stays for the next flush.
//
// KEYS[1] the tenant's refusal counts (hash)   KEYS[2] the shard's rejecting tenants (set)
// ARGV[1] tenant id, then pairs: field, the count flushed
// Returns the number of fields deleted.
var pruneRejectionsScript = redis.NewScript(`
local deleted = 0
for i = 2, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    deleted = deleted + redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
if redis.call('HLEN', KEYS[1]) == 0 then
  redis.call('SREM', KEYS[2], ARGV[1])
end
return deleted
`)

// PruneRejections deletes a tenant's counts of fields whose value is still the one
// flushed (fields maps field → count flushed), and forgets the tenant once it has no
// counts left. It returns how many fields it deleted.
func (q *Quotas) PruneRejections(ctx context.Context, tenantID string, fields map[string]int64) (int, error) {
	args := make([]any, 0, 1+2*len(fields))
	args = append(args, tenantID)
	for f, n := range fields {
		args = append(args, f, strconv.FormatInt(n, 10))
	}
	n, err := pruneRejectionsScript.Run(ctx, q.rdb,
		[]string{q.keys.Rejections(tenantID), q.keys.RejectingTenants(q.keys.Shard(tenantID))}, args...).Int()
	if err != nil {
		return 0, fmt.Errorf("quotas: prune rejections: %w", err)
	}
	return n, nil
}
