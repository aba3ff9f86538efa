package usage

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"time"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// Rollups rebuilds and reads the usage rollups.
type Rollups struct {
	st *store.Store
}

// TenantPeriod is one tenant's billing period.
type TenantPeriod struct {
	TenantID string
	Period   quotas.Period
}

// NewRollups returns Rollups over st.
func NewRollups(st *store.Store) *Rollups { return &Rollups{st: st} }

// Rebuild recomputes the tenant's rollups from the ledger over [from, to), widened to
// whole billing periods; with both zero, all of them (after a change of its billing
// anchor), a billing period per transaction. Steps recorded for the tenant wait for
// each transaction.
func (r *Rollups) Rebuild(ctx context.Context, tenantID string, from, to time.Time) error {
	return r.st.UnscopedRebuildRollups(ctx, store.RebuildRollupsParams{TenantID: tenantID, From: from, To: to})
}

// RebuildAll is Rebuild of every rollup of the tenant, on tx (where its pieces are
// savepoints of the one transaction; on a Store over the pool each is a transaction
// of its own, which is how the tenant service rewrites a tenant's rollups once a
// change of its billing anchor committed).
func RebuildAll(ctx context.Context, tx *store.Store, tenantID string) error {
	return tx.UnscopedRebuildRollups(ctx, store.RebuildRollupsParams{TenantID: tenantID})
}

// The meters of the ledger and the export.
const (
	MeterSteps     = "steps"
	MeterTokens    = "tokens"
	MeterCostMicro = "cost_micro_usd"
)

// Meters are the meters in export order.
var Meters = []string{MeterSteps, MeterTokens, MeterCostMicro}

// ErrBadPeriod: an export's period is not YYYY-MM. The API and the CLI show
// BadPeriodMessage for it.
var ErrBadPeriod = errors.New("billing: period must be a month, YYYY-MM")

// BadPeriodMessage is the sentence shown for ErrBadPeriod.
const BadPeriodMessage = "period must be a month, YYYY-MM (2026-11)."

var monthRE = regexp.MustCompile(`^([0-9]{4})-(0[1-9]|1[0-2])$`)

// ParseMonth reads "YYYY-MM" (years 2000 to 9998).
func ParseMonth(s string) (int, time.Month, error) {
	m := monthRE.FindStringSubmatch(s)
	if m == nil {
		return 0, 0, ErrBadPeriod
	}
	y, _ := strconv.Atoi(m[1])
	mo, _ := strconv.Atoi(m[2])
	if y < 2000 || y > 9998 {
		return 0, 0, ErrBadPeriod
	}
	return y, time.Month(mo), nil
}

// MeterUsage is one meter's total. USD is set for cost_micro_usd: the same amount as
// a decimal string of dollars with six decimals.
type MeterUsage struct {
	Meter    string `json:"meter"`
	Quantity int64  `json:"quantity"`
	USD      string `json:"usd,omitempty"`
}

// TenantUsage is one tenant's use in its billing period.
type TenantUsage struct {
	TenantID string      `json:"tenant_id"`
	Plan     string      `json:"plan"`
	PeriodID string      `json:"period_id"` // the period's start date in the tenant's zone, yyyymmdd
	Period   outbox.Span `json:"period"`
	// Meters: steps, tokens and cost_micro_usd, in that order, zeros included.
	Meters []MeterUsage `json:"meters"`
	// Rejections counts the tenant's refused submissions per limit_type in the period,
	// as the refusal-count flush copied them to Postgres (within about a second of
	// each refusal; see Rejections).
	Rejections map[string]int64 `json:"rejections"`
}

// UsageExport is every tenant's use in its billing period that starts in Month.
type UsageExport struct {
	Month   string        `json:"period"` // YYYY-MM
	Tenants []TenantUsage `json:"tenants"`
	// Totals sums Tenants per meter.
	Totals []MeterUsage `json:"totals"`
}

func meters(steps, tokens, micro int64) []MeterUsage {
	return []MeterUsage{
		{Meter: MeterSteps, Quantity: steps},
		{Meter: MeterTokens, Quantity: tokens},
		{Meter: MeterCostMicro, Quantity: micro, USD: outbox.FormatUSD(micro)},
	}
}

// Export returns the usage export of month "YYYY-MM": for every tenant that existed
// before the end of its billing period starting in that month (in its own zone, on
// its billing day), that period's steps, tokens and micro-dollars, read from the
// period rollups, which equal the ledger's sums over exactly [period start, period
// end), and the plan in force in the period as the rollups recorded it (the tenant's
// current plan if it never changed). ErrBadPeriod for a month that is not YYYY-MM.
// Tenants are in id order.
func (r *Rollups) Export(ctx context.Context, month string) (UsageExport, error) {
	y, m, err := ParseMonth(month)
	if err != nil {
		return UsageExport{}, err
	}
	tenants, err := r.st.UnscopedListTenants(ctx)
	if err != nil {
		return UsageExport{}, err
	}
	var periods []TenantPeriod
	var keys []store.PeriodOf
	plans := map[string]string{} // the current plans, for periods that recorded none
	for _, t := range tenants {
		p := t.Anchor().PeriodStartingIn(y, m)
		if !t.CreatedAt.Before(p.End) {
			continue
		}
		periods = append(periods, TenantPeriod{TenantID: t.ID, Period: p})
		keys = append(keys, store.PeriodOf{TenantID: t.ID, Start: p.Start})
		plans[t.ID] = t.Plan
	}
	used, err := r.st.UnscopedPeriodRollups(ctx, keys)
	if err != nil {
		return UsageExport{}, err
	}
	windows := make([]store.UsageWindow, len(periods))
	for i, p := range periods {
		windows[i] = store.UsageWindow{TenantID: p.TenantID, PeriodStart: p.Period.Start, PeriodEnd: p.Period.End}
	}
	rej, err := r.st.UnscopedRejectionTotals(ctx, windows)
	if err != nil {
		return UsageExport{}, err
	}
	out := UsageExport{Month: month, Tenants: make([]TenantUsage, 0, len(periods))}
	var steps, tokens, micro int64
	for _, p := range periods {
		u := used[p.TenantID]
		plan := u.Plan
		if plan == "" {
			plan = plans[p.TenantID]
		}
		tu := TenantUsage{
			TenantID: p.TenantID, Plan: plan, PeriodID: p.Period.ID,
			Period: outbox.Span{Start: p.Period.Start, End: p.Period.End},
			Meters: meters(u.Steps, u.Tokens, u.CostMicro), Rejections: rej[p.TenantID],
		}
		if tu.Rejections == nil {
			tu.Rejections = map[string]int64{}
		}
		steps, tokens, micro = steps+u.Steps, tokens+u.Tokens, micro+u.CostMicro
		out.Tenants = append(out.Tenants, tu)
	}
	sort.Slice(out.Tenants, func(i, j int) bool { return out.Tenants[i].TenantID < out.Tenants[j].TenantID })
	out.Totals = meters(steps, tokens, micro)
	return out, nil
}

// CSVHeader is the header row of the CSV export.
var CSVHeader = []string{"period", "tenant_id", "plan", "period_id", "period_start", "period_end", "meter", "quantity", "usd"}

// WriteCSV writes e as CSV (encoding/csv): a header row, then one row per tenant and
// meter (usd set on the cost_micro_usd row), then one per tenant and limit_type with
// refusals, whose meter is "rejections:<limit_type>". Times are RFC 3339 UTC.
func WriteCSV(w io.Writer, e UsageExport) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return err
	}
	for _, t := range e.Tenants {
		base := []string{e.Month, t.TenantID, t.Plan, t.PeriodID,
			t.Period.Start.UTC().Format(time.RFC3339), t.Period.End.UTC().Format(time.RFC3339)}
		for _, m := range t.Meters {
			if err := cw.Write(append(base[:len(base):len(base)], m.Meter, strconv.FormatInt(m.Quantity, 10), m.USD)); err != nil {
				return err
			}
		}
		limits := make([]string, 0, len(t.Rejections))
		for l := range t.Rejections {
			limits = append(limits, l)
		}
		sort.Strings(limits)
		for _, l := range limits {
			if err := cw.Write(append(base[:len(base):len(base)], "rejections:"+l, strconv.FormatInt(t.Rejections[l], 10), "")); err != nil {
				return err
			}
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("billing: csv: %w", err)
	}
	return nil
}
