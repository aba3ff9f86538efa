package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/uuid"

	"github.com/agentq/agentq/quotas"
)

// The event types.
const (
	TypeApproachingLimit = "usage.approaching_limit"
	TypeLimitHit         = "usage.limit_hit"
)

// KnownType reports whether typ is one of the event types (a feed's type filter).
func KnownType(typ string) bool {
	return typ == TypeApproachingLimit || typ == TypeLimitHit || typ == TypeLimitsChanged
}

// Types are the event types, as the refusals of an unknown one list them.
var Types = []string{TypeLimitHit, TypeApproachingLimit, TypeLimitsChanged}

// The limit_types of a task ended budget_exceeded by its own budget, not one of the
// tenant's quotas: each names the budget field that ended it, so finance tells a task
// stopped at its step cap from one stopped at its cost cap. LimitTaskBudget is a
// budget end whose field is not known.
const (
	LimitTaskBudget       = "task_budget"
	LimitTaskMaxSteps     = quotas.TaskMaxSteps
	LimitTaskMaxCostUSD   = quotas.TaskMaxCostUSD   // micro-dollars, a USD amount in JSON
	LimitTaskMaxWallclock = quotas.TaskMaxWallclock // whole seconds
)

// Classification is an event's sla_classification.
type Classification string

// The classifications.
const (
	Informational  Classification = "informational"   // 80 % of a period quota
	AtRisk         Classification = "at_risk"         // 90 %
	EnforcedLimit  Classification = "enforced_limit"  // the tenant's own plan limit refused work (100 %)
	EligibleBreach Classification = "eligible_breach" // the platform limited work, not the tenant's plan (Rules)
)

// Enforcement is what was done to the tenant's work when the event was written.
type Enforcement string

// The enforcements.
const (
	EnforcementNone    Enforcement = "none"    // a warning: nothing was refused
	EnforcementRefused Enforcement = "refused" // work was refused: an admission, or a step
	EnforcementStopped Enforcement = "stopped" // a running task was ended
	EnforcementDelayed Enforcement = "delayed" // a step waited, without a worker, for token capacity
	EnforcementPaused  Enforcement = "paused"  // a task was paused at the limit, to resume on approval or by itself
)

// Thresholds are the percentages of a period quota whose crossing writes an event:
// approaching_limit at 80 and 90, limit_hit at 100.
var Thresholds = []int{80, 90, 100}

// DedupeWindow is the window of a limit that is not a period quota (rates,
// concurrency, backlog, a task's budget, the platform's own limits): at most one
// limit_hit per tenant and limit in it.
const DedupeWindow = time.Minute

// ThresholdValue is the usage at which threshold percent of limit is reached: the
// smallest integer u with u >= limit·threshold/100. Computed without overflowing for
// any limit an int64 holds.
func ThresholdValue(limit int64, threshold int) int64 {
	t := int64(threshold)
	return limit/100*t + (limit%100*t+99)/100
}

// Crossed returns the thresholds a change of usage from before to after reached, in
// increasing order. The rule is >=: usage reaches threshold t of limit when
// usage >= limit·t/100, so 800 of 1000 reaches 80 %. A threshold reached already
// (before at or above it) is not crossed again. A limit at or below 0 (off, or
// allowing nothing) has no thresholds: what it refuses is a refusal's event.
func Crossed(before, after, limit int64) []int {
	if limit <= 0 {
		return nil
	}
	var out []int
	for _, t := range Thresholds {
		if v := ThresholdValue(limit, t); before < v && after >= v {
			out = append(out, t)
		}
	}
	return out
}

// IsPeriodQuota reports whether limitType is a period quota: its events dedupe per
// billing period (per UTC day for the daily steps), the others per DedupeWindow.
func IsPeriodQuota(limitType string) bool {
	switch limitType {
	case quotas.AgentStepsDaily, quotas.AITokensMonthly, quotas.USDMonthly:
		return true
	}
	return false
}

// PeriodKey is the dedupe key of a period quota's event at a threshold:
// "tenant|limit_type|period start|threshold". One event per threshold per period.
func PeriodKey(tenant, limitType string, periodStart time.Time, threshold int) string {
	return strings.Join([]string{tenant, limitType, periodStart.UTC().Format(time.RFC3339), strconv.Itoa(threshold)}, "|")
}

// TreeKey is the dedupe key of a tree's refusals by limitType: one event per tree
// and limit.
func TreeKey(tenant string, root uuid.UUID, limitType string) string {
	return strings.Join([]string{tenant, "tree", root.String(), limitType}, "|")
}

// WindowStart is the start of the DedupeWindow holding at.
func WindowStart(at time.Time) time.Time { return at.UTC().Truncate(DedupeWindow) }

// WindowKey is the dedupe key of a limit_hit of a limit that is not a period quota:
// "tenant|limit_type|window start". One event per limit per window.
func WindowKey(tenant, limitType string, at time.Time) string {
	return strings.Join([]string{tenant, limitType, WindowStart(at).Format(time.RFC3339)}, "|")
}

// idSpace is the UUIDv5 namespace of event ids.
var idSpace = uuid.MustParse("1b6784ee-c741-4743-96b9-2616bdbe521e")

// EventID is the CloudEvents id of the event with dedupeKey: a UUIDv5 of it, so a
// replica writing the same event again names it the same.
func EventID(dedupeKey string) string { return uuid.NewSHA1(idSpace, []byte(dedupeKey)).String() }

// DaySpan is the UTC day holding at: the period the daily steps quota's events dedupe
// in (the quota itself is a sliding day).
func DaySpan(at time.Time) Span {
	d := at.UTC().Truncate(24 * time.Hour)
	return Span{Start: d, End: d.Add(24 * time.Hour)}
}

// Span is a period or a window: [Start, End).
type Span struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
}

// Amount is a limit or a usage: a count, or, for usd_monthly, micro-dollars, which
// JSON carries as a decimal string of dollars ("12.500000") so no float rounds them.
type Amount struct {
	N   int64
	USD bool
}

// MarshalJSON writes a count as a number and USD as a decimal string.
func (a Amount) MarshalJSON() ([]byte, error) {
	if !a.USD {
		return strconv.AppendInt(nil, a.N, 10), nil
	}
	return json.Marshal(FormatUSD(a.N))
}

// UnmarshalJSON reads what MarshalJSON writes.
func (a *Amount) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		n, err := ParseUSD(s)
		*a = Amount{N: n, USD: true}
		return err
	}
	var n int64
	if err := json.Unmarshal(b, &n); err != nil {
		return err
	}
	*a = Amount{N: n}
	return nil
}

// FormatUSD writes micro-dollars as dollars with six decimals.
func FormatUSD(micro int64) string {
	sign := ""
	u := uint64(micro)
	if micro < 0 {
		sign, u = "-", uint64(-micro)
	}
	return fmt.Sprintf("%s%d.%06d", sign, u/1_000_000, u%1_000_000)
}

// ParseUSD reads a decimal string of dollars, at most six decimals, as micro-dollars.
func ParseUSD(s string) (int64, error) {
	neg := strings.HasPrefix(s, "-")
	whole, frac, _ := strings.Cut(strings.TrimPrefix(s, "-"), ".")
	if whole == "" || len(frac) > 6 || strings.ContainsAny(whole+frac, "+-") {
		return 0, fmt.Errorf("billing: %q is not a USD amount", s)
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || w > (1<<63-1)/1_000_000-1 {
		return 0, fmt.Errorf("billing: %q is not a USD amount", s)
	}
	f := int64(0)
	if frac != "" {
		if f, err = strconv.ParseInt(frac+strings.Repeat("0", 6-len(frac)), 10, 64); err != nil {
			return 0, fmt.Errorf("billing: %q is not a USD amount", s)
		}
	}
	n := w*1_000_000 + f
	if neg {
		n = -n
	}
	return n, nil
}

// LimitData is the data of both event types.
type LimitData struct {
	TenantID     string `json:"tenant_id"`
	Plan         string `json:"plan"`
	LimitType    string `json:"limit_type"`
	LimitValue   Amount `json:"limit_value"`
	CurrentUsage Amount `json:"current_usage"`
	// Threshold is the percentage reached: 80 or 90 for approaching_limit, 100 for a
	// period quota's limit_hit; absent for the other limits.
	Threshold   int         `json:"threshold,omitempty"`
	Period      *Span       `json:"period,omitempty"` // period quotas
	Window      *Span       `json:"window,omitempty"` // the others: the DedupeWindow of the refusal
	Enforcement Enforcement `json:"enforcement"`
	// CommittedMs and MeasuredMs are, on a missed commitment (limit_type
	// sla_start_within_s or sla_pool_wait_within_s), what the plan commits to and what
	// was measured, in milliseconds; absent otherwise.
	CommittedMs *int64 `json:"committed_ms,omitempty"`
	MeasuredMs  *int64 `json:"measured_ms,omitempty"`
	// RefusedBy is RefusedByPlatform when the platform refused the work (degraded
	// mode, a shared pool, a global limit), not the tenant's plan; absent otherwise.
	RefusedBy  string `json:"refused_by,omitempty"`
	UpgradeURL string `json:"upgrade_url"`
	// TaskID is the task a pause stopped, or the tree task a budget stopped (or whose
	// spawn its tree refused); absent otherwise. ApprovalURL (a pause's only) is the
	// signed link through which a person sees its usage and approves a raise that
	// resumes it, valid until ApprovalExpires (when its pause times out).
	TaskID string `json:"task_id,omitempty"`
	// RootID is the root of the task tree the task belongs to (a task that spawned,
	// or one spawned): every tree's events can be told apart. Absent outside a tree.
	RootID            string         `json:"root_id,omitempty"`
	ApprovalURL       string         `json:"approval_url,omitempty"`
	ApprovalExpires   *time.Time     `json:"approval_expires_at,omitempty"`
	SLAClassification Classification `json:"sla_classification"`
}

// RefusedByPlatform is LimitData.RefusedBy of the platform's refusals.
const RefusedByPlatform = "platform"

// Event is one built event, ready for the outbox.
type Event struct {
	ID        string
	Type      string
	TenantID  string
	DedupeKey string
	// Payload is the structured CloudEvent JSON: what is stored, and sent as it is.
	Payload []byte
	// Audience is who may read it (store.AudienceAll when empty): an event some
	// readers must not see is written once per audience.
	Audience string
}

// DefaultSource is the CloudEvents source when Events.Source is empty.
const DefaultSource = "/agentq"

// Events builds the usage events of a deployment.
type Events struct {
	Source     string // CloudEvents source; DefaultSource when empty
	UpgradeURL string // the upgrade_url of every event
}

// Quota is a tenant's period quota, what a crossing is measured against.
type Quota struct {
	TenantID  string
	Plan      string
	LimitType string // agent_steps_daily, ai_tokens_monthly or usd_monthly
	Limit     int64  // micro-dollars for usd_monthly
	Period    Span   // the billing period (DaySpan for the daily steps)
}

// Crossings returns the events of a change of q's usage from before to after, at
// time at: for each threshold crossed (Crossed), approaching_limit at 80 and 90 and
// limit_hit at 100, each deduplicated per threshold and period.
func (e Events) Crossings(q Quota, before, after int64, at time.Time) ([]Event, error) {
	if !IsPeriodQuota(q.LimitType) {
		return nil, fmt.Errorf("billing: %q is not a period quota", q.LimitType)
	}
	var out []Event
	for _, t := range Crossed(before, after, q.Limit) {
		typ, enf := TypeApproachingLimit, EnforcementNone
		if t >= 100 {
			typ, enf = TypeLimitHit, EnforcementRefused
		}
		period := q.Period
		ev, err := e.build(typ, PeriodKey(q.TenantID, q.LimitType, q.Period.Start, t), at, LimitData{
			TenantID: q.TenantID, Plan: q.Plan, LimitType: q.LimitType,
			LimitValue: amount(q.LimitType, q.Limit), CurrentUsage: amount(q.LimitType, after),
			Threshold: t, Period: &period, Enforcement: enf, SLAClassification: Classify(Cause{Threshold: t, By: LimitedByTenant, How: How(enf)}),
		})
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	return out, nil
}

// Refusal is work refused by a limit, or a task ended by its budget.
type Refusal struct {
	TenantID  string
	Plan      string
	LimitType string
	Limit     int64 // micro-dollars for usd_monthly and a budget's cost
	Used      int64
	// Period is the billing period of a period quota (required for one): its refusals
	// share the period's 100 % event. Other limits dedupe per DedupeWindow.
	Period *Span
	// Platform: the platform refused the work (degraded mode, a shared pool, a global
	// limit), not the tenant's plan.
	Platform    bool
	Enforcement Enforcement // EnforcementRefused when empty
	At          time.Time
	// TaskID and RootID name the task the refusal stopped or paused and its tree's
	// root (see LimitData); empty for an admission's refusal.
	TaskID, RootID string
}

// LimitHit returns the limit_hit event of a refusal. Its dedupe key is the period's
// 100 % key for a period quota (so reaching the quota and refusals after it write one
// event) and the refusal's window key otherwise. The platform's refusals (Platform)
// say so (refused_by) and are keyed apart from the plan's: a window in which both the
// plan and the platform refused has one event of each.
func (e Events) LimitHit(r Refusal) (Event, error) {
	d, key, err := refusalData(r)
	if err != nil {
		return Event{}, err
	}
	return e.build(TypeLimitHit, key, r.At, d)
}

// refusalData is the data of a refusal's limit_hit and its dedupe key (see LimitHit).
func refusalData(r Refusal) (LimitData, string, error) {
	d := LimitData{
		TenantID: r.TenantID, Plan: r.Plan, LimitType: r.LimitType,
		LimitValue: amount(r.LimitType, r.Limit), CurrentUsage: amount(r.LimitType, r.Used),
		Enforcement: r.Enforcement, SLAClassification: Classify(causeOf(r)), TaskID: r.TaskID, RootID: r.RootID,
	}
	if r.Platform {
		d.RefusedBy = RefusedByPlatform
	}
	if d.Enforcement == "" {
		d.Enforcement = EnforcementRefused
	}
	var key string
	if IsPeriodQuota(r.LimitType) {
		if r.Period == nil {
			return LimitData{}, "", fmt.Errorf("billing: a refusal by %s needs its period", r.LimitType)
		}
		period := *r.Period
		d.Threshold, d.Period = 100, &period
		key = PeriodKey(r.TenantID, r.LimitType, period.Start, 100)
	} else {
		start := WindowStart(r.At)
		d.Window = &Span{Start: start, End: start.Add(DedupeWindow)}
		key = WindowKey(r.TenantID, r.LimitType, r.At)
	}
	if r.Platform {
		key += "|" + RefusedByPlatform
	}
	return d, key, nil
}

func amount(limitType string, n int64) Amount {
	return Amount{N: n, USD: limitType == quotas.USDMonthly || limitType == LimitTaskMaxCostUSD || limitType == quotas.TreeMaxCostUSD}
}

// build makes the CloudEvent with the CloudEvents SDK and writes its structured JSON.
func (e Events) build(typ, key string, at time.Time, d LimitData) (Event, error) {
	if d.TenantID == "" {
		return Event{}, errors.New("billing: an event needs its tenant")
	}
	d.UpgradeURL = e.UpgradeURL
	if d.Period != nil {
		d.Period = &Span{Start: d.Period.Start.UTC(), End: d.Period.End.UTC()}
	}
	return e.buildData(typ, key, d.TenantID, at, d)
}

// buildData makes the CloudEvent of type typ about tenant with data d.
func (e Events) buildData(typ, key, tenant string, at time.Time, d any) (Event, error) {
	source := e.Source
	if source == "" {
		source = DefaultSource
	}
	id := EventID(key)
	ce := cloudevents.New(cloudevents.CloudEventsVersionV1)
	ce.SetID(id)
	ce.SetSource(source)
	ce.SetType(typ)
	ce.SetSubject(tenant)
	ce.SetTime(at.UTC())
	if err := ce.SetData(cloudevents.ApplicationJSON, d); err != nil {
		return Event{}, fmt.Errorf("billing: event data: %w", err)
	}
	if err := ce.Validate(); err != nil {
		return Event{}, fmt.Errorf("billing: event: %w", err)
	}
	payload, err := json.Marshal(ce)
	if err != nil {
		return Event{}, fmt.Errorf("billing: event: %w", err)
	}
	return Event{ID: id, Type: typ, TenantID: tenant, DedupeKey: key, Payload: payload}, nil
}
