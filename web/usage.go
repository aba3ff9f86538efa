package web

import (
	"math"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

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
}

// UsageReport is GET /v1/usage, modelled on GitHub's GET /rate_limit.
type UsageReport struct {
	TenantID string                `json:"tenant_id"`
	Plan     string                `json:"plan"`
	AsOf     time.Time             `json:"as_of"`
	Degraded bool                  `json:"degraded,omitempty"`
	Limits   map[string]LimitUsage `json:"limits"`
}

var units = map[string]string{
	quotas.KeyRate: "requests", quotas.TenantRate: "requests", quotas.KeyAgentRate: "tasks",
	quotas.UserTasksHourly: "tasks", quotas.ConcurrentSessions: "sessions", quotas.LongRunningInflight: "tasks",
	quotas.QueueBacklog: "tasks", quotas.Running: "tasks", quotas.AgentStepsDaily: "steps",
	quotas.AITokensMonthly: "tokens", quotas.USDMonthly: "usd", quotas.InflightRequests: "requests",
}

// usage reports the caller tenant's limits with the numbers admission enforces: it runs
// the admission script in peek mode, which reads the same keys and takes nothing.
func (s *Server) usage(c echo.Context) error {
	ctx := c.Request().Context()
	key := keyRecord(c)
	for k := range c.QueryParams() {
		if k != "user" && k != "agent" {
			return apiErr(http.StatusBadRequest, CodeInvalidRequest, "Unknown query parameter %q.", k)
		}
	}
	t, err := s.Tenants.Lookup(ctx, key.TenantID)
	if err != nil {
		return err
	}
	eff, limits, err := s.limitsFor(t)
	if err != nil {
		return err
	}
	now := time.Now()
	period := t.Anchor().PeriodAt(now)
	d, err := s.Admission.Admit(ctx, quotas.AdmitParams{
		Mode: quotas.ModePeek, TenantID: t.ID, Kid: key.Kid, Agent: c.QueryParam("agent"), User: c.QueryParam("user"),
		Limits: limits, Period: period,
	})
	if err != nil {
		return admissionFailure(err)
	}
	setRateHeaders(c.Response().Header(), d, now)
	running, err := s.Queue.Running(ctx, t.ID)
	if err != nil {
		return admissionFailure(err)
	}
	var rejected map[string]int64
	if s.Rejections != nil {
		if rejected, err = s.Rejections.Current(ctx, t.ID, now); err != nil {
			return err
		}
	}
	rep := UsageReport{TenantID: t.ID, Plan: t.Plan, AsOf: now.UTC(), Limits: map[string]LimitUsage{}}
	limitOf := map[string]quotas.Limit{}
	for _, name := range quotas.LimitTypes {
		limitOf[name] = quotas.Unlimited // a limit the plan leaves out is off
		if v, ok := eff[name]; ok {
			limitOf[name] = v
		}
	}
	periodS := int64(period.End.Sub(period.Start).Seconds())
	for _, sc := range d.Scopes {
		used := sc.Used
		if sc.Name == quotas.USDMonthly {
			used /= 1e6
		}
		lu := LimitUsage{Used: round(used), Unit: units[sc.Name], Rejected: rejected[sc.Name]}
		if l := limitOf[sc.Name]; !l.Off() {
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
		rep.Limits[sc.Name] = lu
	}
	// Limits the script does not report: off, or enforced elsewhere (running caps are
	// enforced by the dispatcher).
	for _, name := range quotas.LimitTypes {
		if _, ok := rep.Limits[name]; ok {
			continue
		}
		lu := LimitUsage{Unit: units[name], Rejected: rejected[name]}
		if name == quotas.Running {
			lu.Used = float64(running)
		}
		if name == quotas.InflightRequests { // this request included
			limitOf[name] = quotas.Limit(quotas.InflightLimit(eff))
			if limitOf[name] == 0 {
				limitOf[name] = quotas.Unlimited
			}
			lu.Used = float64(inflightSlot(c).Held)
		}
		if l := limitOf[name]; !l.Off() {
			lu.Limit = ptr(float64(l))
			lu.Remaining = ptr(math.Max(0, float64(l)-lu.Used))
		}
		rep.Limits[name] = lu
	}
	return c.JSON(http.StatusOK, rep)
}

func ptr[T any](v T) *T { return &v }

func round(f float64) float64 { return math.Round(f*1e6) / 1e6 }
