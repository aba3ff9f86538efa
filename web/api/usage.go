package api

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/billing/usage"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
)

// LimitUsage is one limit in GET /v1/usage. Limit and Remaining are null when the
// limit is off ("unlimited"); a limit of 0 shows as 0.
type LimitUsage struct {
	Limit     *float64   `json:"limit"`
	Used      float64    `json:"used"`
	Remaining *float64   `json:"remaining"`
	ResetAt   *time.Time `json:"reset_at"`
	WindowS   *int64     `json:"window_s"`
	Unit      string     `json:"unit"`
	// Rejected counts the admissions this limit refused in its current window, the
	// one its usage.limit_hit covers: the minute, the UTC day of the daily steps, or
	// the billing period of a monthly quota.
	Rejected int64 `json:"rejected"`
	// unknown: Redis, which holds the use, did not answer in time; used, remaining,
	// reset_at and rejected show as null.
	unknown bool
}

// Unknown says Redis, which holds the use, did not answer in time.
func (l LimitUsage) Unknown() bool { return l.unknown }

// MarshalJSON writes an unknown use as null.
func (l LimitUsage) MarshalJSON() ([]byte, error) {
	type plain LimitUsage
	if !l.unknown {
		return json.Marshal(plain(l))
	}
	return json.Marshal(struct {
		plain
		Used     *float64 `json:"used"`
		Rejected *int64   `json:"rejected"`
	}{plain: plain(l)})
}

// UsageReport is GET /v1/usage, modelled on GitHub's GET /rate_limit.
type UsageReport struct {
	TenantID string                `json:"tenant_id"`
	Plan     string                `json:"plan"`
	AsOf     time.Time             `json:"as_of"`
	Degraded bool                  `json:"degraded,omitempty"`
	Limits   map[string]LimitUsage `json:"limits"`
	// SLA is what the tenant's plan (with its overrides) commits to: seconds, or
	// "unlimited" (no commitment).
	SLA quotas.SLA `json:"sla"`
	// SLABreaches are the commitments the platform missed for the tenant in the last
	// 30 days, per commitment: the eligible_breach events and the last one.
	SLABreaches []usage.SLABreaches `json:"sla_breaches"`
	// UpgradeURL is where the plan is upgraded.
	UpgradeURL string `json:"upgrade_url"`
	// RecentLimitHits are the tenant's latest usage.limit_hit events, newest first
	// (at most usage.DefaultRecentHits), with the ids the feeds and webhooks carry.
	RecentLimitHits []usage.LimitHit `json:"recent_limit_hits"`
	// Queue counts the tenant's live tasks.
	Queue QueueUsage `json:"queue"`
	// Tasks are the tenant's running and queued tasks (at most usageTasks), running
	// first, queued ones with why they wait.
	Tasks []UsageTask `json:"tasks"`
	// Days is the tenant's use per day of its zone, oldest first, today last
	// (?days=, default 30).
	Days []usage.DayUsage `json:"days"`
}

// QueueUsage is the tenant's tasks waiting (Depth: state queued) and running.
type QueueUsage struct {
	Depth   int64 `json:"depth"`
	Running int64 `json:"running"`
}

// UsageTask is a live task in the usage report.
type UsageTask struct {
	ID        string     `json:"id"`
	State     string     `json:"state"`
	Agent     string     `json:"agent"`
	User      *string    `json:"user"`
	CreatedAt time.Time  `json:"created_at"`
	StartedAt *time.Time `json:"started_at"`
	// WaitReason: as a task's (TaskJSON.WaitReason); null for a running one.
	WaitReason *WaitReasonJSON `json:"wait_reason"`
	// WaitUntil: when a task parked for token capacity expects it (null otherwise).
	WaitUntil *time.Time `json:"wait_until"`
	// Tree is, for a root that spawned sub-agents, what its whole tree holds (absent
	// otherwise).
	Tree *UsageTree `json:"tree,omitempty"`
}

// UsageTree is a live root's tree in the usage report: its tasks, how many are live,
// and what they spent.
type UsageTree struct {
	Tasks   int     `json:"tasks"`
	Live    int     `json:"live"`
	CostUSD float64 `json:"cost_usd"`
}

// usageTasks bounds the tasks of the usage report.
const usageTasks = 50

var units = map[string]string{
	quotas.KeyRate: "requests", quotas.TenantRate: "requests", quotas.KeyAgentRate: "tasks",
	quotas.UserTasksHourly: "tasks", quotas.ConcurrentSessions: "sessions", quotas.LongRunningInflight: "tasks",
	quotas.QueueBacklog: "tasks", quotas.Running: "tasks", quotas.AgentStepsDaily: "steps",
	quotas.AITokensMonthly: "tokens", quotas.USDMonthly: "usd", quotas.InflightRequests: "requests",
	quotas.AITokensPerMinute: "tokens",
}

// usage reports the caller tenant's limits with the numbers admission enforces: it runs
// the admission script in peek mode, which reads the same keys and takes nothing.
func (s *API) usage(c echo.Context) error {
	ctx := c.Request().Context()
	key := keyRecord(c)
	q := usageQuery{Kid: key.Kid, Agent: c.QueryParam("agent"), User: c.QueryParam("user"), Inflight: inflightSlot(c).Held}
	for k := range c.QueryParams() {
		if k != "user" && k != "agent" && k != "days" {
			return Errorf(http.StatusBadRequest, CodeInvalidRequest, "Unknown query parameter %q.", k)
		}
	}
	days, err := parseDays(c.QueryParam("days"), c.QueryParams().Has("days"))
	if err != nil {
		return err
	}
	q.Days = days
	t, err := s.Tenants.Lookup(ctx, key.TenantID)
	if err != nil {
		return err
	}
	rep, d, err := s.usageReport(ctx, t, q)
	if err != nil {
		return err
	}
	setRateHeaders(c.Response().Header(), d, rep.AsOf)
	return c.JSON(http.StatusOK, rep)
}

// TenantUsage is the usage report of tenant t as its panel shows it: the default days
// of history, no key's buckets.
func (s *API) TenantUsage(ctx context.Context, t tenants.Tenant) (UsageReport, error) {
	rep, _, err := s.usageReport(ctx, t, usageQuery{Days: usage.DefaultUsageDays})
	return rep, err
}

// parseDays reads ?days=: 1..usage.MaxUsageDays, usage.DefaultUsageDays when absent.
func parseDays(v string, given bool) (int, error) {
	if !given {
		return usage.DefaultUsageDays, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > usage.MaxUsageDays {
		return 0, Errorf(http.StatusBadRequest, CodeInvalidRequest, "days must be an integer between 1 and %d.", usage.MaxUsageDays)
	}
	return n, nil
}

// usageQuery is whose usage a report shows: the key (Kid; "" for none: the key
// buckets then read full), the user and agent buckets, the days of history, and the
// tenant's requests in progress (the inflight slot this request holds included).
type usageQuery struct {
	Kid, Agent, User string
	Days             int
	Inflight         int64
}

// usageReport builds a tenant's usage report; the decision is the peek's (for the
// rate-limit headers). What Postgres holds (the plan, its limits, the live tasks,
// the history) is always there; the live counters Redis holds are read within
// admission's deadline, and when Redis does not answer in time the report is
// degraded: those counters are null, and so is a queued task's wait_reason.
func (s *API) usageReport(ctx context.Context, t tenants.Tenant, q usageQuery) (UsageReport, quotas.Decision, error) {
	eff, limits, err := s.limitsFor(t)
	if err != nil {
		return UsageReport{}, quotas.Decision{}, err
	}
	now := time.Now()
	rep := UsageReport{TenantID: t.ID, Plan: t.Plan, AsOf: now.UTC(), Limits: map[string]LimitUsage{}, UpgradeURL: s.UpgradeURL,
		RecentLimitHits: []usage.LimitHit{}, Tasks: []UsageTask{}, Days: []usage.DayUsage{}, SLA: quotas.NoSLA,
		SLABreaches: []usage.SLABreaches{}}
	if pol, err := s.Tenants.Policy(t); err == nil {
		rep.SLA = pol.SLA
	}
	limitOf := map[string]quotas.Limit{}
	for _, name := range quotas.LimitTypes {
		limitOf[name] = quotas.Unlimited // a limit the plan leaves out is off
		if v, ok := eff[name]; ok {
			limitOf[name] = v
		}
	}
	// The script does not report inflight_requests: its limit is the one the request
	// slots enforce.
	inflight := quotas.Limit(quotas.InflightLimit(eff))
	if inflight == 0 {
		inflight = quotas.Unlimited
	}
	d, err := s.liveLimits(ctx, t, q, limits, limitOf, inflight, now, &rep)
	if err != nil {
		return UsageReport{}, d, err
	}
	if err := s.usageHistory(ctx, t, q, now, &rep); err != nil {
		return UsageReport{}, d, err
	}
	return rep, d, nil
}

// liveLimits fills rep.Limits with the counters admission enforces: it runs the
// admission script in peek mode, which reads the same keys and takes nothing, and
// reads the running and token counts, each within admission's deadline. When Redis
// does not answer, every limit has its value and no count, and rep is degraded.
func (s *API) liveLimits(ctx context.Context, t tenants.Tenant, q usageQuery, limits quotas.Limits,
	limitOf map[string]quotas.Limit, inflight quotas.Limit, now time.Time, rep *UsageReport) (quotas.Decision, error) {
	period := t.Anchor().PeriodAt(now)
	d, err := s.Admission.Admit(ctx, quotas.AdmitParams{
		Mode: quotas.ModePeek, TenantID: t.ID, Kid: q.Kid, Agent: q.Agent, User: q.User,
		Limits: limits, Period: period,
	})
	if errors.Is(err, quotas.ErrUnavailable) && ctx.Err() == nil {
		rep.Degraded = true
		for _, name := range quotas.LimitTypes {
			rep.Limits[name] = unknownUsage(name, limitOf[name])
		}
		rep.Limits[quotas.InflightRequests] = unknownUsage(quotas.InflightRequests, inflight)
		return quotas.Decision{}, nil
	}
	if err != nil {
		return d, AdmissionFailure(err)
	}
	// The reads besides the peek go in one round trip: the refusal counts still in
	// Redis, and the running tasks and the tokens-per-minute bucket when the script
	// does not report them, these two within admission's deadline.
	dctx, cancel := context.WithTimeout(ctx, s.Admission.Timeout())
	defer cancel()
	pipe := s.Redis.Pipeline()
	var readRejected func(context.Context) (map[string]int64, error)
	if s.Rejections != nil {
		readRejected = s.Rejections.QueueCurrent(ctx, pipe, t.ID, period, now)
	}
	reads := s.queueOtherReads(dctx, pipe, t.ID, d.Scopes, limits)
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(dctx) // each read reports its own failure
	}
	var rejected map[string]int64
	if readRejected != nil {
		if rejected, err = readRejected(ctx); err != nil {
			return d, err
		}
	}
	periodS := int64(period.End.Sub(period.Start).Seconds())
	for _, sc := range d.Scopes {
		rep.Limits[sc.Name] = scopeUsage(sc, limitOf[sc.Name], rejected[sc.Name], periodS, now)
	}
	// Limits the script does not report: off, or enforced elsewhere (running caps are
	// enforced by the dispatcher).
	for _, name := range quotas.LimitTypes {
		if _, ok := rep.Limits[name]; ok {
			continue
		}
		l := limitOf[name]
		if name == quotas.InflightRequests {
			l = inflight
		}
		lu, err := otherUsage(reads, name, limits, l, q, now)
		if err != nil {
			if ctx.Err() != nil {
				return d, AdmissionFailure(ctx.Err())
			}
			rep.Degraded = true
			lu = unknownUsage(name, l)
		}
		lu.Rejected = rejected[name]
		rep.Limits[name] = lu
	}
	return d, nil
}

// otherReads are the Redis reads of the limits the admission script does not report,
// queued on a pipe (queueOtherReads); nil when not needed.
type otherReads struct {
	running func() (int64, error)
	tokens  func() (quotas.TenantTokensState, error)
}

// queueOtherReads queues on pipe the reads otherUsage needs for the limits the peek's
// scopes do not report: the running tasks, and the tokens-per-minute bucket when it
// is on and not 0.
func (s *API) queueOtherReads(ctx context.Context, pipe redis.Pipeliner, tenant string, scopes []quotas.Scope,
	limits quotas.Limits) otherReads {
	var r otherReads
	reported := func(name string) bool {
		return slices.ContainsFunc(scopes, func(sc quotas.Scope) bool { return sc.Name == name })
	}
	if !reported(quotas.Running) {
		r.running = s.Queue.QueueRunning(ctx, pipe, tenant)
	}
	if !reported(quotas.AITokensPerMinute) && limits.TokensPerMinute > 0 {
		r.tokens = s.Admission.Buckets().QueueTenantTokensLevel(ctx, pipe, quotas.TenantTokensParams{
			Tenant: tenant, PerMinute: limits.TokensPerMinute, Burst: limits.TokensPerMinuteBurst,
		})
	}
	return r
}

// unknownUsage is a limit whose use Redis did not tell: its value alone.
func unknownUsage(name string, l quotas.Limit) LimitUsage {
	lu := LimitUsage{Unit: units[name], unknown: true}
	if !l.Off() {
		lu.Limit = ptr(float64(l))
	}
	return lu
}

// scopeUsage is one limit as the admission peek reported it.
func scopeUsage(sc quotas.Scope, l quotas.Limit, rejected, periodS int64, now time.Time) LimitUsage {
	used := sc.Used
	if sc.Name == quotas.USDMonthly {
		used /= 1e6
	}
	lu := LimitUsage{Used: round(used), Unit: units[sc.Name], Rejected: rejected}
	if !l.Off() {
		lu.Limit = ptr(float64(l))
		rem := float64(sc.Remaining)
		if sc.Name == quotas.USDMonthly {
			rem = math.Max(0, float64(l)-used)
		}
		lu.Remaining = ptr(round(rem))
	}
	reset := now.Add(sc.Reset).UTC().Truncate(time.Second)
	if sc.Reset%time.Second != 0 {
		reset = reset.Add(time.Second)
	}
	lu.ResetAt = &reset
	switch {
	case sc.Window > 0:
		lu.WindowS = ptr(int64(sc.Window.Seconds()))
	case sc.Name == quotas.AITokensMonthly || sc.Name == quotas.USDMonthly:
		lu.WindowS = ptr(periodS)
	}
	return lu
}

// otherUsage is a limit the admission script does not report: the tokens per minute
// and the running tasks (from the reads queued in reads), the requests in progress,
// and the limits that are off.
func otherUsage(reads otherReads, name string, limits quotas.Limits, l quotas.Limit, q usageQuery,
	now time.Time) (LimitUsage, error) {
	if name == quotas.AITokensPerMinute {
		return tokensPerMinuteUsage(reads.tokens, limits, now)
	}
	lu := LimitUsage{Unit: units[name]}
	switch name {
	case quotas.Running:
		running, err := reads.running()
		if err != nil {
			return lu, err
		}
		lu.Used = float64(running)
	case quotas.InflightRequests: // this request included
		lu.Used = float64(q.Inflight)
	}
	if !l.Off() {
		lu.Limit = ptr(float64(l))
		lu.Remaining = ptr(math.Max(0, float64(l)-lu.Used))
	}
	return lu, nil
}

// tokensPerMinuteUsage is the tenant's ai_tokens_per_minute bucket, which the worker
// reserves each step's tokens from (admission does not check it), reported as the
// other buckets are: used is what was reserved and not yet refilled, remaining what a
// step can reserve now, reset_at when the bucket is full again. read is the bucket's
// queued read (nil when the limit is off or 0).
func tokensPerMinuteUsage(read func() (quotas.TenantTokensState, error), l quotas.Limits, now time.Time) (LimitUsage, error) {
	lu := LimitUsage{Unit: units[quotas.AITokensPerMinute], WindowS: ptr(int64(60))}
	switch {
	case l.TokensPerMinute < 0: // off
		return lu, nil
	case l.TokensPerMinute == 0: // nothing may be reserved
		lu.Limit, lu.Remaining = ptr(0.0), ptr(0.0)
		return lu, nil
	}
	st, err := read()
	if err != nil {
		return lu, err
	}
	lu.Limit, lu.Used, lu.Remaining = ptr(float64(l.TokensPerMinute)), float64(st.Used), ptr(float64(max(0, st.Level)))
	reset := now.Add(st.FullIn).UTC().Truncate(time.Second)
	if st.FullIn%time.Second != 0 {
		reset = reset.Add(time.Second)
	}
	lu.ResetAt = &reset
	return lu, nil
}

// usageHistory adds the live tasks, the latest limit hits and the days to rep.
func (s *API) usageHistory(ctx context.Context, t tenants.Tenant, q usageQuery, now time.Time, rep *UsageReport) error {
	if s.Tasks != nil {
		live, err := s.Tasks.Live(ctx, t.ID, usageTasks)
		if err != nil {
			return err
		}
		rep.Queue = QueueUsage{Depth: live.Queued, Running: live.Running}
		for _, lt := range live.Tasks {
			ut := UsageTask{ID: lt.ID.String(), State: string(lt.State), Agent: lt.Agent, CreatedAt: lt.CreatedAt.UTC(),
				StartedAt: lt.StartedAt, WaitReason: waitReasonJSON(lt.WaitReason)}
			if lt.Undecorated {
				rep.Degraded = true
			}
			if lt.State == agentqtype.TaskStateQueued && lt.PanelTask.WaitReason != nil {
				ut.WaitUntil = lt.WaitUntil
			}
			if lt.User != "" {
				ut.User = ptr(lt.User)
			}
			if tt := lt.Tree; tt != nil {
				ut.Tree = &UsageTree{Tasks: tt.Tasks, Live: tt.Live, CostUSD: float64(tt.CostMicroUSD) / 1e6}
			}
			rep.Tasks = append(rep.Tasks, ut)
		}
	}
	if s.Usage == nil {
		return nil
	}
	days := q.Days
	if days == 0 {
		days = usage.DefaultUsageDays
	}
	hits, byDay, err := s.Usage.History(ctx, t.ID, usage.DefaultRecentHits, t.Anchor(), days, now)
	if errors.Is(err, usage.ErrBadDays) {
		return Errorf(http.StatusBadRequest, CodeInvalidRequest, "days must be an integer between 1 and %d.", usage.MaxUsageDays)
	}
	if err != nil {
		return err
	}
	rep.RecentLimitHits, rep.Days = hits, byDay
	// Sent alone, with its arguments inline: the breaches' statement is planned for them.
	breaches, err := s.Usage.SLABreaches(ctx, t.ID, rep.AsOf)
	if err != nil {
		return err
	}
	rep.SLABreaches = append(rep.SLABreaches, breaches...)
	return nil
}

func ptr[T any](v T) *T { return &v }

func round(f float64) float64 { return math.Round(f*1e6) / 1e6 }
