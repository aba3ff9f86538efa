package quotas

import (
	"cmp"
	"slices"
	"time"

	"github.com/agentq/agentq/internal/rkeys"
)

// Refusal counts: admission counts what it refused per tenant, minute and combination
// of limits (one bitmask), in Redis or, while Redis is unreachable, in process; the
// flush to Postgres (billing/rejections) reads them in these words.

// Bits of the admission script's violated-scope mask, which its refusal counts keep
// (rkeys.RejectionField).
var scopeBits = map[string]int64{
	KeyRate: 1, TenantRate: 2, KeyAgentRate: 4, UserTasksHourly: 8, ConcurrentSessions: 16,
	LongRunningInflight: 32, QueueBacklog: 64, AgentStepsDaily: 128, AITokensMonthly: 256, USDMonthly: 512,
}

// ScopeBit is limitType's bit in admission's violated-scope mask (0 for a limit
// admission does not check).
func ScopeBit(limitType string) int64 { return scopeBits[limitType] }

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
	// Fields are the raw counts (rkeys.RejectionField → count), which the prune
	// (admission.RejectionCounts.PruneRejections) compares before it deletes one.
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

// MaxLocalRejections bounds a replica's in-process refusal counts: (tenant, limit,
// minute) entries. At the bound, a refusal of an entry not yet counted is dropped
// (and the drop logged) until a flush forgets the minutes it copied.
const MaxLocalRejections = 10000

// LocalRejections are a replica's in-process refusal counts, as a flush reads them.
type LocalRejections struct {
	Replica string           // the replica that counted them (admission.GuardOptions.ID)
	Counts  []LocalRejection // sorted by tenant, minute and limit
}

// LocalRejection is how many of a tenant's admissions one limit refused in process
// in one minute.
type LocalRejection struct {
	TenantID string
	RejectionCount
}
