package admission

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/quotas"
)

// Refused admissions are counted in Redis by the admission script itself (one HINCRBY
// per refusal, see admitScript), per tenant, minute and combination of limits that
// refused, and flushed to Postgres by a janitor pass (rejections.Rejections). So a refusal
// costs no Postgres write and no extra round trip, and a tenant refused thousands of
// times a second costs one row per limit per minute.

// RejectionCounts are the refusal counts the admission script keeps in Redis, as the
// flush to Postgres reads and prunes them.
type RejectionCounts struct{ conn }

// RejectingTenants returns the tenants of a shard with refusal counts in Redis.
func (rj *RejectionCounts) RejectingTenants(ctx context.Context, shard int) ([]string, error) {
	ids, err := rj.rdb.SMembers(ctx, rj.keys.RejectingTenants(shard)).Result()
	if err != nil {
		return nil, fmt.Errorf("quotas: rejecting tenants: %w", err)
	}
	slices.Sort(ids)
	return ids, nil
}

// Rejections reads tenants' refusal counts, one pipelined read.
func (rj *RejectionCounts) Rejections(ctx context.Context, tenants []string) ([]quotas.TenantRejections, error) {
	pipe := rj.rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(tenants))
	for i, t := range tenants {
		cmds[i] = pipe.HGetAll(ctx, rj.keys.Rejections(t))
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, fmt.Errorf("quotas: rejections: %w", err)
	}
	out := make([]quotas.TenantRejections, len(tenants))
	for i, t := range tenants {
		out[i] = tenantRejections(t, cmds[i].Val())
	}
	return out, nil
}

// QueueRejections queues the read of one tenant's refusal counts on pipe, for a
// caller that sends it with other reads in one round trip; the function returned
// gives its answer once pipe was sent.
func (rj *RejectionCounts) QueueRejections(ctx context.Context, pipe redis.Pipeliner, tenant string) func() (quotas.TenantRejections, error) {
	cmd := pipe.HGetAll(ctx, rj.keys.Rejections(tenant))
	return func() (quotas.TenantRejections, error) {
		if err := cmd.Err(); err != nil && err != redis.Nil {
			return quotas.TenantRejections{}, fmt.Errorf("quotas: rejections: %w", err)
		}
		return tenantRejections(tenant, cmd.Val()), nil
	}
}

func tenantRejections(tenant string, fields map[string]string) quotas.TenantRejections {
	tr := quotas.TenantRejections{TenantID: tenant, Fields: map[string]int64{}}
	for f, v := range fields {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			tr.Fields[f] = n
		}
	}
	return tr
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
func (rj *RejectionCounts) PruneRejections(ctx context.Context, tenantID string, fields map[string]int64) (int, error) {
	args := make([]any, 0, 1+2*len(fields))
	args = append(args, tenantID)
	for f, n := range fields {
		args = append(args, f, strconv.FormatInt(n, 10))
	}
	n, err := pruneRejectionsScript.Run(ctx, rj.rdb,
		[]string{rj.keys.Rejections(tenantID), rj.keys.RejectingTenants(rj.keys.Shard(tenantID))}, args...).Int()
	if err != nil {
		return 0, fmt.Errorf("quotas: prune rejections: %w", err)
	}
	return n, nil
}
