package usage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/quotas"
)

// The usage report's history: a tenant's latest limit hits and its use per day.

// DefaultRecentHits is how many limit hits the usage report shows.
const DefaultRecentHits = 20

// LimitHit is one usage.limit_hit event of a tenant, as the usage report and the
// panel show it: the event id is the one the finance feed and the webhooks carry.
type LimitHit struct {
	EventID           string                `json:"event_id"`
	Time              time.Time             `json:"time"`
	LimitType         string                `json:"limit_type"`
	LimitValue        outbox.Amount         `json:"limit_value"`
	CurrentUsage      outbox.Amount         `json:"current_usage"`
	SLAClassification outbox.Classification `json:"sla_classification"`
	Enforcement       outbox.Enforcement    `json:"enforcement"`
}

// limitHits reads the limit hits of usage.limit_hit events.
func limitHits(evs []store.Event) ([]LimitHit, error) {
	out := make([]LimitHit, 0, len(evs))
	for _, e := range evs {
		var ce struct {
			ID   string           `json:"id"`
			Time time.Time        `json:"time"`
			Data outbox.LimitData `json:"data"`
		}
		if err := json.Unmarshal(e.Payload, &ce); err != nil {
			return nil, fmt.Errorf("billing: event %s: %w", e.ID, err)
		}
		out = append(out, LimitHit{
			EventID: e.ID, Time: ce.Time.UTC(), LimitType: ce.Data.LimitType,
			LimitValue: ce.Data.LimitValue, CurrentUsage: ce.Data.CurrentUsage,
			SLAClassification: ce.Data.SLAClassification, Enforcement: ce.Data.Enforcement,
		})
	}
	return out, nil
}

// The range of days the usage report takes.
const (
	DefaultUsageDays = 30
	MaxUsageDays     = 90
)

// ErrBadDays: a number of days outside 1..MaxUsageDays.
var ErrBadDays = errors.New("billing: days out of range")

// DayUsage is a tenant's use on one day of its zone. CostUSD is CostMicroUSD as a
// decimal string of dollars.
type DayUsage struct {
	Day          string `json:"day"` // yyyy-mm-dd in the tenant's zone
	Steps        int64  `json:"steps"`
	Tokens       int64  `json:"tokens"`
	CostMicroUSD int64  `json:"cost_micro_usd"`
	CostUSD      string `json:"cost_usd"`
}

// History is the tenant's latest usage.limit_hit events (at most hits, and at most
// store.MaxRecentEvents), newest first, and its use per day of its zone for the last n
// days up to now, today included, oldest first, from the daily rollups (a day without
// use is listed with zeros): what the usage report shows, read in one round trip to
// Postgres. ErrBadDays unless 1 <= n <= MaxUsageDays.
func (r *Rollups) History(ctx context.Context, tenantID string, hits int, a quotas.Anchor, n int, now time.Time) ([]LimitHit, []DayUsage, error) {
	if tenantID == "" {
		return nil, nil, outbox.ErrNoTenant
	}
	if n < 1 || n > MaxUsageDays {
		return nil, nil, ErrBadDays
	}
	p, first, loc := daysRange(tenantID, a, n, now)
	evs, rows, err := r.st.RecentEventsAndDailyRollups(ctx,
		store.RecentEventsParams{TenantID: tenantID, Type: outbox.TypeLimitHit, Limit: hits}, p)
	if err != nil {
		return nil, nil, err
	}
	lh, err := limitHits(evs)
	if err != nil {
		return nil, nil, err
	}
	return lh, days(rows, first, loc, n), nil
}

// daysRange is the rollups of the last n days of the tenant's zone up to now, the
// first of them (at noon) and the zone.
func daysRange(tenantID string, a quotas.Anchor, n int, now time.Time) (store.DailyRollupsParams, time.Time, *time.Location) {
	loc := a.Zone
	if loc == nil {
		loc = time.UTC
	}
	today := now.In(loc)
	first := time.Date(today.Year(), today.Month(), today.Day()-(n-1), 12, 0, 0, 0, loc)
	return store.DailyRollupsParams{TenantID: tenantID, From: first.Format(time.DateOnly), To: today.Format(time.DateOnly)}, first, loc
}

// days lists the n days from first with their rollups (zeros for a day without one).
func days(rows []store.DayRollup, first time.Time, loc *time.Location, n int) []DayUsage {
	byDay := make(map[string]store.Rollup, len(rows))
	for _, row := range rows {
		byDay[row.Day] = row.Rollup
	}
	out := make([]DayUsage, n)
	for i := range n {
		// noon steps over days whatever the zone's daylight saving time does
		day := time.Date(first.Year(), first.Month(), first.Day()+i, 12, 0, 0, 0, loc).Format(time.DateOnly)
		u := byDay[day]
		out[i] = DayUsage{Day: day, Steps: u.Steps, Tokens: u.Tokens, CostMicroUSD: u.CostMicro, CostUSD: outbox.FormatUSD(u.CostMicro)}
	}
	return out
}

// BreachesOver is how far back a tenant's missed commitments are reported.
const BreachesOver = 30 * 24 * time.Hour

// SLABreaches is a tenant's missed commitments of one kind over BreachesOver: its
// eligible_breach events and the last one's committed and measured milliseconds.
type SLABreaches struct {
	LimitType       string    `json:"limit_type"` // sla_start_within_s or sla_pool_wait_within_s
	Count           int64     `json:"count"`
	Last            time.Time `json:"last"`
	LastCommittedMs int64     `json:"last_committed_ms"`
	LastMeasuredMs  int64     `json:"last_measured_ms"`
}

// SLABreaches returns the tenant's missed commitments since now − BreachesOver, by
// limit_type.
func (r *Rollups) SLABreaches(ctx context.Context, tenantID string, now time.Time) ([]SLABreaches, error) {
	if tenantID == "" {
		return nil, outbox.ErrNoTenant
	}
	bs, err := r.st.SLABreaches(ctx, tenantID, now.Add(-BreachesOver))
	if err != nil {
		return nil, err
	}
	out := make([]SLABreaches, len(bs))
	for i, b := range bs {
		out[i] = SLABreaches{LimitType: b.LimitType, Count: b.Count, Last: b.Last.UTC(),
			LastCommittedMs: b.LastCommittedMs, LastMeasuredMs: b.LastMeasuredMs}
	}
	return out, nil
}
