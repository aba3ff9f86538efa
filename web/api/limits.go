package api

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/quotas"
)

// policyName is the item name of a scope in the RateLimit-Policy and RateLimit fields.
var policyName = map[string]string{
	quotas.KeyRate: "key", quotas.TenantRate: "tenant", quotas.KeyAgentRate: "key_agent",
	quotas.UserTasksHourly: "user", quotas.ConcurrentSessions: "sessions", quotas.InflightRequests: "inflight",
	quotas.LongRunningInflight: "long_running", quotas.QueueBacklog: "backlog",
	quotas.AgentStepsDaily: "steps_daily", quotas.AITokensMonthly: "tokens_monthly",
	quotas.USDMonthly: "usd_monthly",
}

// limitsFor returns the tenant's effective limits.
func (s *API) limitsFor(t tenants.Tenant) (map[string]quotas.Limit, quotas.Limits, error) {
	p, err := s.Tenants.Policy(t)
	if err != nil {
		return nil, quotas.Limits{}, err
	}
	return p.Effective, p.Limits, nil
}

func ceilSeconds(d time.Duration) int64 { return int64(math.Ceil(d.Seconds())) }

// setRateHeaders writes the rate-limit response contract: the
// X-RateLimit-* trio for the binding scope (closest to exhaustion), the IETF
// RateLimit-Policy and RateLimit fields with one item per applied scope, and
// Retry-After on refusals.
func setRateHeaders(h http.Header, d quotas.Decision, now time.Time) {
	// Every answer carries these: built in two buffers, not a string per item, each
	// sized once for every scope (an item is under 48 bytes) rather than grown.
	var policy, state []byte
	if len(d.Scopes) > 0 {
		policy, state = make([]byte, 0, 48*len(d.Scopes)), make([]byte, 0, 48*len(d.Scopes))
	}
	binding := -1
	bindingRatio := math.Inf(1)
	for i, sc := range d.Scopes {
		if sc.Limit < 0 { // off
			continue
		}
		name := policyName[sc.Name]
		limit, remaining := sc.Limit, sc.Remaining
		if sc.Name == quotas.USDMonthly { // micro-dollars inside, dollars outside
			limit, remaining = limit/1e6, int64(math.Floor(float64(remaining)/1e6))
		}
		if len(policy) > 0 {
			policy, state = append(policy, ", "...), append(state, ", "...)
		}
		policy = strconv.AppendFloat(append(strconv.AppendQuote(policy, name), ";q="...), limit, 'f', -1, 64)
		if sc.Window > 0 {
			policy = strconv.AppendInt(append(policy, ";w="...), int64(sc.Window.Seconds()), 10)
		}
		state = strconv.AppendInt(append(strconv.AppendQuote(state, name), ";r="...), remaining, 10)
		state = strconv.AppendInt(append(state, ";t="...), ceilSeconds(sc.Reset), 10)
		ratio := math.Inf(1) // a limit of 0 that admitted this binds nothing (a $0 quota)
		if sc.Limit > 0 {
			ratio = float64(sc.Remaining) / sc.Limit
		}
		if sc.Violated {
			ratio = -1 + float64(i)*1e-9 // a violated scope binds
		}
		if ratio < bindingRatio || binding < 0 {
			binding, bindingRatio = i, ratio
		}
	}
	if binding >= 0 {
		b := d.Scopes[binding]
		if b.Name == quotas.USDMonthly {
			b.Limit, b.Remaining = b.Limit/1e6, int64(math.Floor(float64(b.Remaining)/1e6))
		}
		// The names as net/http spells them on the wire (X-RateLimit-Limit goes out
		// as X-Ratelimit-Limit): Set then has no name to rewrite, which allocates.
		h.Set("X-Ratelimit-Limit", strconv.FormatFloat(math.Floor(b.Limit), 'f', -1, 64))
		h.Set("X-Ratelimit-Remaining", strconv.FormatInt(b.Remaining, 10))
		h.Set("X-Ratelimit-Reset", strconv.FormatInt(now.Add(b.Reset).Unix()+boolInt(b.Reset%time.Second != 0), 10))
		h.Set("Ratelimit-Policy", string(policy))
		h.Set("Ratelimit", string(state))
	}
	if !d.Allowed && !d.OutOfScope {
		h.Set("Retry-After", strconv.FormatInt(retryAfter(d), 10))
	}
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// retryAfter is the longest wait among violated scopes, in whole seconds, at least 1.
func retryAfter(d quotas.Decision) int64 {
	var longest time.Duration
	for _, sc := range d.Scopes {
		if sc.Violated && sc.RetryAfter > longest {
			longest = sc.RetryAfter
		}
	}
	return max(1, ceilSeconds(longest))
}

var quotaLimits = map[string]bool{quotas.AgentStepsDaily: true, quotas.AITokensMonthly: true, quotas.USDMonthly: true}
var rateLimits = map[string]bool{quotas.KeyRate: true, quotas.TenantRate: true, quotas.KeyAgentRate: true, quotas.UserTasksHourly: true}

// refusal builds the 429/402 error of a refused admission. A plan quota (402) outranks
// a rate (429 RATE_LIMIT_EXCEEDED), which outranks a concurrency limit: the answer
// names the limit whose lifting the caller needs first, and "violated" lists all.
func (s *API) refusal(d quotas.Decision, t tenants.Tenant) *APIError {
	var quota, rateSc, conc *quotas.Scope
	for i := range d.Scopes {
		sc := &d.Scopes[i]
		if !sc.Violated {
			continue
		}
		switch {
		case quotaLimits[sc.Name]:
			if quota == nil {
				quota = sc
			}
		case rateLimits[sc.Name]:
			if rateSc == nil || sc.RetryAfter > rateSc.RetryAfter {
				rateSc = sc
			}
		default:
			if conc == nil {
				conc = sc
			}
		}
	}
	violated := d.Violated
	if violated == nil {
		violated = []string{}
	}
	switch {
	case quota != nil:
		e := Errorf(http.StatusPaymentRequired, "QUOTA_EXCEEDED", "%s Upgrade your plan to continue.", quotaMessage(quota))
		e.Extra = map[string]any{
			"limit_type": quota.Name, "current_usage": quotaValue(quota.Name, quota.Used),
			"limit_value": quotaValue(quota.Name, quota.Limit), "upgrade_url": s.UpgradeURL,
			"tenant_id": t.ID, "violated": violated,
		}
		return e
	case rateSc != nil:
		ra := retryAfter(d)
		e := Errorf(http.StatusTooManyRequests, "RATE_LIMIT_EXCEEDED", "%s Retry in %d second%s.", rateMessage(rateSc), ra, plural(ra))
		e.Extra = map[string]any{"limit_type": rateSc.Name, "retry_after_seconds": ra, "tenant_id": t.ID, "violated": violated}
		return e
	default:
		if conc == nil { // cannot happen: a refusal names a scope
			conc = &quotas.Scope{Name: quotas.ConcurrentSessions}
		}
		msg := concurrencyMessage(conc)
		if next, ok := s.Plans.NextLimit(conc.Name, conc.Limit); ok && conc.Name == quotas.ConcurrentSessions {
			msg += fmt.Sprintf(", or upgrade for %v concurrent", next)
		}
		e := Errorf(http.StatusTooManyRequests, "CONCURRENCY_LIMIT_EXCEEDED", "%s.", msg)
		e.Extra = map[string]any{"limit_type": conc.Name, "retry_after_seconds": retryAfter(d), "tenant_id": t.ID,
			"limit_value": conc.Limit, "violated": violated}
		return e
	}
}

func plural(n int64) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func quotaValue(name string, v float64) any {
	if name == quotas.USDMonthly {
		return v / 1e6
	}
	return int64(v)
}

func rateMessage(sc *quotas.Scope) string {
	switch sc.Name {
	case quotas.KeyRate:
		return fmt.Sprintf("API key rate limit of %g requests/second exceeded.", sc.Limit)
	case quotas.TenantRate:
		return fmt.Sprintf("Tenant rate limit of %g requests/second exceeded.", sc.Limit)
	case quotas.KeyAgentRate:
		return fmt.Sprintf("Rate limit of %g tasks/second for this key and agent exceeded.", sc.Limit)
	default:
		return fmt.Sprintf("Limit of %g tasks/hour for this user exceeded.", sc.Limit)
	}
}

func concurrencyMessage(sc *quotas.Scope) string {
	switch sc.Name {
	case quotas.LongRunningInflight:
		return fmt.Sprintf("You've reached your limit of %g long-running tasks. Wait for one to finish", sc.Limit)
	case quotas.QueueBacklog:
		return fmt.Sprintf("Your queue holds its limit of %g tasks. Wait for queued tasks to start", sc.Limit)
	case quotas.InflightRequests:
		return fmt.Sprintf("You have %g requests in progress, your limit; event streams count. Wait for one to end", sc.Limit)
	default:
		return fmt.Sprintf("You've reached your concurrent-agent limit (%g). Wait for an active task to finish", sc.Limit)
	}
}

func quotaMessage(sc *quotas.Scope) string {
	switch sc.Name {
	case quotas.AgentStepsDaily:
		return fmt.Sprintf("Daily agent step limit of %g reached.", sc.Limit)
	case quotas.AITokensMonthly:
		return fmt.Sprintf("Monthly AI token limit of %g reached.", sc.Limit)
	default:
		return fmt.Sprintf("Monthly spend limit of $%.2f reached.", sc.Limit/1e6)
	}
}

const (
	ctxKeyLimits   = "agentq.limits"
	ctxKeyInflight = "agentq.inflight"
	// ctxKeyInflightReleased is set when the handler gave the request's slot back
	// itself, in the round trip of its last Redis call (a submission's queue push).
	ctxKeyInflightReleased = "agentq.inflight.released"
)

type requestLimitsVal struct {
	t      tenants.Tenant
	eff    map[string]quotas.Limit
	limits quotas.Limits
}

// requestLimits returns the caller's tenant and effective limits, worked out once per
// request.
func (s *API) requestLimits(c echo.Context) (tenants.Tenant, map[string]quotas.Limit, quotas.Limits, error) {
	if v, ok := c.Get(ctxKeyLimits).(requestLimitsVal); ok {
		return v.t, v.eff, v.limits, nil
	}
	t, err := s.Tenants.Lookup(c.Request().Context(), keyRecord(c).TenantID)
	if err != nil {
		return t, nil, quotas.Limits{}, err
	}
	eff, limits, err := s.limitsFor(t)
	if err != nil {
		return t, nil, quotas.Limits{}, err
	}
	c.Set(ctxKeyLimits, requestLimitsVal{t, eff, limits})
	return t, eff, limits, nil
}

// inflight holds one of the tenant's inflight_requests slots while the request runs,
// event streams included, and gives it back however the request ends (an error, a
// panic, a client that went away). The 33rd concurrent request of a tenant (by
// default) is refused with 429 CONCURRENCY_LIMIT_EXCEEDED.
func (s *API) inflight(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error { return s.limitRequest(c, next, false) }
}

// readLimits is inflight for reads, which also spend the caller's key bucket (every
// tenant request counts against key_rate) and write the rate-limit headers. The two
// Redis calls go out together, so a read waits for one round trip, not two.
func (s *API) readLimits(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error { return s.limitRequest(c, next, true) }
}

func (s *API) limitRequest(c echo.Context, next echo.HandlerFunc, spend bool) error {
	t, eff, limits, err := s.requestLimits(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	limit := quotas.InflightLimit(eff)
	var slot quotas.InflightSlot
	var keyErr error
	if spend && limit > 0 {
		type acquired struct {
			slot quotas.InflightSlot
			err  error
		}
		ch := make(chan acquired, 1)
		go func() {
			slot, err := s.Admission.AcquireInflight(ctx, t.ID, limit)
			ch <- acquired{slot, err}
		}()
		keyErr = s.spendKey(c, t, keyRecord(c).Kid, limits)
		a := <-ch
		slot, err = a.slot, a.err
	} else {
		slot, err = s.Admission.AcquireInflight(ctx, t.ID, limit)
		if spend {
			keyErr = s.spendKey(c, t, keyRecord(c).Kid, limits)
		}
	}
	if err == nil && slot.Allowed {
		defer func() {
			if released, _ := c.Get(ctxKeyInflightReleased).(bool); !released {
				s.Admission.ReleaseInflight(context.WithoutCancel(ctx), slot)
			}
		}()
	}
	switch {
	case keyErr != nil: // the key bucket comes first
		return keyErr
	case err != nil:
		return AdmissionFailure(err)
	case !slot.Allowed:
		return s.inflightRefusal(c, t, slot)
	}
	c.Set(ctxKeyInflight, slot)
	return next(c)
}

// inflightRefusal is the 429 of a request refused an inflight_requests slot, with the
// rate-limit headers of that limit alone.
func (s *API) inflightRefusal(c echo.Context, t tenants.Tenant, slot quotas.InflightSlot) error {
	sc := quotas.Scope{Name: quotas.InflightRequests, Limit: float64(slot.Limit), Used: float64(slot.Held),
		Reset: time.Second, RetryAfter: time.Second, Violated: true}
	d := quotas.Decision{Scopes: []quotas.Scope{sc}, Violated: []string{sc.Name}}
	h := c.Response().Header()
	h.Del("RateLimit-Policy") // the refusal's headers name the inflight limit alone
	h.Del("RateLimit")
	setRateHeaders(h, d, time.Now())
	return s.refusal(d, t)
}

// AcquireInflight takes one of tenant t's inflight_requests slots for a request the
// API's own middleware does not limit (the panel's): the slot, which the caller
// releases, or the refusal (with its rate-limit headers written).
func (s *API) AcquireInflight(c echo.Context, t tenants.Tenant) (quotas.InflightSlot, error) {
	eff, _, err := s.limitsFor(t)
	if err != nil {
		return quotas.InflightSlot{}, err
	}
	slot, err := s.Admission.AcquireInflight(c.Request().Context(), t.ID, quotas.InflightLimit(eff))
	if err != nil {
		return slot, AdmissionFailure(err)
	}
	if !slot.Allowed {
		return slot, s.inflightRefusal(c, t, slot)
	}
	return slot, nil
}

// inflightSlot is the request's inflight_requests lease (zero if the limit is off).
func inflightSlot(c echo.Context) quotas.InflightSlot {
	slot, _ := c.Get(ctxKeyInflight).(quotas.InflightSlot)
	return slot
}

// spendKey takes one token of the caller's key bucket (every tenant request counts
// against key_rate) and writes the rate-limit headers; a refusal is the error.
func (s *API) spendKey(c echo.Context, t tenants.Tenant, kid string, limits quotas.Limits) error {
	now := time.Now()
	d, err := s.Admission.Admit(c.Request().Context(), quotas.AdmitParams{
		Mode: quotas.ModeKey, TenantID: t.ID, Kid: kid, Limits: limits, Period: t.Anchor().PeriodAt(now),
	})
	if err != nil {
		return AdmissionFailure(err)
	}
	setRateHeaders(c.Response().Header(), d, now)
	if !d.Allowed {
		return s.refusal(d, t)
	}
	return nil
}

// AdmissionFailure is the answer to a limit check that could not be made: a 503 the
// client retries (Redis did not answer, or the request was cancelled), else err.
func AdmissionFailure(err error) error {
	if errors.Is(err, quotas.ErrUnavailable) {
		e := Errorf(http.StatusServiceUnavailable, CodeUnavailable,
			"Usage limits cannot be checked right now, so no work is admitted. Retry in 1 second.")
		e.Extra = map[string]any{"retry_after_seconds": 1}
		return e
	}
	if errors.Is(err, context.Canceled) {
		return Errorf(http.StatusServiceUnavailable, CodeUnavailable, "Request cancelled.")
	}
	return err
}
