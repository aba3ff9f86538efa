package quotas

import (
	"math"
	"time"
)

// Limits are the effective admission limits of one request: the tenant's plan with its
// overrides and the key's own limits applied. A value >= 0 is the limit (0 allows
// nothing); Off (-1) disables it. Build them with LimitsOf, or start from NoLimits.
type Limits struct {
	KeyRate, KeyBurst           float64 // per second
	TenantRate, TenantBurst     float64 // per second
	KeyAgentRate, KeyAgentBurst float64 // per second, per (key, agent)
	UserHourly, UserBurst       float64 // per hour, per on-behalf-of user
	Sessions                    int64
	LongRunning                 int64
	Backlog                     int64
	StepsDaily                  int64
	TokensMonthly               int64
	USDMonthlyMicro             int64
	// TokensPerMinute and TokensPerMinuteBurst are the ai_tokens_per_minute bucket,
	// in tokens; reserved by the worker before each step, not by admission. A rate
	// of 0 or below is not enforced (overrides refuse 0: a bucket that never fills
	// could only keep steps waiting for good).
	TokensPerMinute, TokensPerMinuteBurst int64
}

// Off is the value of a disabled limit in Limits and in the scripts.
const Off = -1

// NoLimits returns Limits with every limit off.
func NoLimits() Limits {
	return Limits{
		KeyRate: Off, KeyBurst: 1, TenantRate: Off, TenantBurst: 1, KeyAgentRate: Off, KeyAgentBurst: 1,
		UserHourly: Off, UserBurst: 1, Sessions: Off, LongRunning: Off, Backlog: Off, StepsDaily: Off,
		TokensMonthly: Off, USDMonthlyMicro: Off, TokensPerMinute: Off, TokensPerMinuteBurst: 1,
	}
}

// burstOr returns the "<name>_burst" value, or factor × the rate (at least 1) when
// none is set.
func burstOr(m map[string]Limit, name string, rate, factor float64) float64 {
	if b, ok := m[name+"_burst"]; ok && b >= 1 {
		return float64(b)
	}
	return math.Max(1, rate*factor)
}

// LimitsOf turns an effective limit map (Catalogue.Effective) into Limits. A limit the
// map lacks is off.
func LimitsOf(m map[string]Limit) Limits {
	f := func(name string) float64 {
		if v := lookup(m, name); !v.Off() {
			return float64(v)
		}
		return Off
	}
	n := func(name string) int64 { return int64(f(name)) }
	l := Limits{
		KeyRate:         f(KeyRate),
		TenantRate:      f(TenantRate),
		KeyAgentRate:    f(KeyAgentRate),
		UserHourly:      f(UserTasksHourly),
		Sessions:        n(ConcurrentSessions),
		LongRunning:     n(LongRunningInflight),
		Backlog:         n(QueueBacklog),
		StepsDaily:      n(AgentStepsDaily),
		TokensMonthly:   n(AITokensMonthly),
		USDMonthlyMicro: Off,
		TokensPerMinute: n(AITokensPerMinute),
	}
	if usd := f(USDMonthly); usd >= 0 {
		l.USDMonthlyMicro = int64(math.Round(usd * 1e6))
	}
	l.KeyBurst = burstOr(m, KeyRate, l.KeyRate, 2)
	l.TenantBurst = burstOr(m, TenantRate, l.TenantRate, 2)
	l.KeyAgentBurst = burstOr(m, KeyAgentRate, l.KeyAgentRate, 1)
	l.UserBurst = burstOr(m, UserTasksHourly, l.UserHourly, 1)
	l.TokensPerMinuteBurst = int64(burstOr(m, AITokensPerMinute, float64(l.TokensPerMinute), 1))
	return l
}

// LongRunningThreshold: tasks whose wallclock budget is above it hold a
// long_running_inflight lease.
const LongRunningThreshold = 5 * time.Minute

// TokensPerMinuteBucket is the ai_tokens_per_minute bucket's rate and burst as the
// step scripts take them: rate 0 when the limit is off.
func (l Limits) TokensPerMinuteBucket() (rate, burst int64) {
	if l.TokensPerMinute <= 0 {
		return 0, 1
	}
	burst = l.TokensPerMinuteBurst
	if burst <= 0 {
		burst = l.TokensPerMinute
	}
	return l.TokensPerMinute, burst
}
