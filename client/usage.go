package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// UsageQuery selects what GET /v1/usage reports beside the tenant's limits.
type UsageQuery struct {
	User  string // the user whose user_tasks_hourly bucket to report
	Agent string // the agent whose key_agent_rate bucket (of the caller's key) to report
	Days  int    // days of history, 1..90; 0 for the server's default (30)
}

// LimitUsage is one limit of the usage report. Limit and Remaining are nil when the
// limit is off. While the report is Degraded (the server's Redis did not answer in
// time), Used and Rejected of the limits Redis counts are unknown: they read 0, and
// Remaining and ResetAt are nil.
type LimitUsage struct {
	Limit     *float64   `json:"limit"`
	Used      float64    `json:"used"`
	Remaining *float64   `json:"remaining"`
	ResetAt   *time.Time `json:"reset_at"`
	WindowS   *int64     `json:"window_s"`
	Unit      string     `json:"unit"`
	Rejected  int64      `json:"rejected"`
}

// LimitHit is one of the tenant's usage.limit_hit events; EventID is the id the
// event feeds and the webhooks carry.
type LimitHit struct {
	EventID           string    `json:"event_id"`
	Time              time.Time `json:"time"`
	LimitType         string    `json:"limit_type"`
	LimitValue        Amount    `json:"limit_value"`
	CurrentUsage      Amount    `json:"current_usage"`
	SLAClassification string    `json:"sla_classification"`
	Enforcement       string    `json:"enforcement"`
}

// SLA is what a plan commits to, in seconds: a number, or "unlimited" (none).
type SLA struct {
	StartWithinS    Limit `json:"start_within_s"`
	PoolWaitWithinS Limit `json:"pool_wait_within_s"`
}

// SLABreaches are a tenant's missed commitments of one kind (limit_type
// sla_start_within_s or sla_pool_wait_within_s) in the last 30 days.
type SLABreaches struct {
	LimitType       string    `json:"limit_type"`
	Count           int64     `json:"count"`
	Last            time.Time `json:"last"`
	LastCommittedMs int64     `json:"last_committed_ms"`
	LastMeasuredMs  int64     `json:"last_measured_ms"`
}

// QueueUsage counts the tenant's queued (Depth) and running tasks.
type QueueUsage struct {
	Depth   int64 `json:"depth"`
	Running int64 `json:"running"`
}

// UsageTask is one of the tenant's live tasks.
type UsageTask struct {
	ID         string      `json:"id"`
	State      string      `json:"state"`
	Agent      string      `json:"agent"`
	User       *string     `json:"user"`
	CreatedAt  time.Time   `json:"created_at"`
	StartedAt  *time.Time  `json:"started_at"`
	WaitReason *WaitReason `json:"wait_reason"` // as Task's; nil for a running task
}

// DayUsage is the tenant's use on one day of its time zone.
type DayUsage struct {
	Day          string `json:"day"` // yyyy-mm-dd
	Steps        int64  `json:"steps"`
	Tokens       int64  `json:"tokens"`
	CostMicroUSD int64  `json:"cost_micro_usd"`
	CostUSD      string `json:"cost_usd"` // decimal dollars, six decimals
}

// UsageReport is GET /v1/usage.
type UsageReport struct {
	TenantID        string                `json:"tenant_id"`
	Plan            string                `json:"plan"`
	AsOf            time.Time             `json:"as_of"`
	Degraded        bool                  `json:"degraded"`
	Limits          map[string]LimitUsage `json:"limits"`
	UpgradeURL      string                `json:"upgrade_url"`
	SLA             SLA                   `json:"sla"`
	SLABreaches     []SLABreaches         `json:"sla_breaches"`
	RecentLimitHits []LimitHit            `json:"recent_limit_hits"`
	Queue           QueueUsage            `json:"queue"`
	Tasks           []UsageTask           `json:"tasks"`
	Days            []DayUsage            `json:"days"`
}

// GetUsage returns the caller tenant's usage report: every limit with what admission
// enforces, the live tasks, the latest limit hits and the use per day. It spends one
// token of the key's bucket and nothing else.
func (c *Client) GetUsage(ctx context.Context, q UsageQuery) (*UsageReport, error) {
	v := url.Values{}
	if q.User != "" {
		v.Set("user", q.User)
	}
	if q.Agent != "" {
		v.Set("agent", q.Agent)
	}
	if q.Days != 0 {
		v.Set("days", strconv.Itoa(q.Days))
	}
	var r UsageReport
	if err := c.t.do(ctx, http.MethodGet, "/v1/usage", v, nil, nil, &r); err != nil {
		return nil, err
	}
	return &r, nil
}
