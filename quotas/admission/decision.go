package admission

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/agentq/agentq/quotas"
)

// state is what the admission script read, before any take, and what it decided.
type state struct {
	status               int64 // 0 ok, 1 denied, 2 out of scope
	now                  int64 // ms, the script's clock
	mask                 int64 // violated scopes, bit per scopeBits entry
	keyTAT, tenantTAT    float64
	keyAgentTAT, userTAT float64
	sessions, long       int64
	backlog, steps       int64
	oldestHour           int64
	tokens, usd          int64
}

func (a *Admitter) parseState(reply string) (state, error) {
	var vals [14]float64
	if a.textNums {
		parts := strings.Split(reply, ",")
		if len(parts) != len(vals) {
			return state{}, fmt.Errorf("quotas: admission reply of %d values, want %d", len(parts), len(vals))
		}
		for i, p := range parts {
			vals[i], _ = strconv.ParseFloat(p, 64)
		}
	} else {
		if len(reply) != 14*8 {
			return state{}, fmt.Errorf("quotas: admission reply of %d bytes, want %d", len(reply), 14*8)
		}
		for i := range vals {
			vals[i] = math.Float64frombits(binary.LittleEndian.Uint64([]byte(reply[8*i : 8*i+8])))
		}
	}
	f := func(i int) float64 { return vals[i] }
	n := func(i int) int64 { return int64(f(i)) }
	return state{
		status: n(0), now: n(1), mask: n(2),
		keyTAT: f(3), tenantTAT: f(4), keyAgentTAT: f(5), userTAT: f(6),
		sessions: n(7), long: n(8), backlog: n(9), steps: n(10), oldestHour: n(11),
		tokens: n(12), usd: n(13),
	}, nil
}

func ms(v float64) time.Duration { return time.Duration(math.Max(0, v) * float64(time.Millisecond)) }

// windows are the counted scopes' windows a Decision reports.
var windows = map[string]time.Duration{
	quotas.KeyRate: time.Second, quotas.TenantRate: time.Second, quotas.KeyAgentRate: time.Second,
	quotas.UserTasksHourly: time.Hour, quotas.AgentStepsDaily: 24 * time.Hour,
}

// decide turns the script's reply into a Decision: every applied scope with its limit,
// use, what remains after this request (counting what it took, if it took anything),
// when it resets and, if violated, when a retry can pass. The formulas are the
// script's GCRA, so the numbers are the ones admission enforces.
func decide(p quotas.AdmitParams, st state) quotas.Decision {
	d := quotas.Decision{Allowed: st.status == 0 && st.mask == 0, OutOfScope: st.status == 2}
	now := float64(st.now)
	l := p.Limits
	peek, admit := p.Mode == quotas.ModePeek, p.Mode == quotas.ModeAdmit
	// taken: the key's token is taken unless the key bucket refused or this is a peek;
	// every other scope only when the whole admission passed.
	keyTaken := !peek && st.mask&1 == 0
	restTaken := admit && d.Allowed
	bucket := func(name string, tat, rate, burst float64, period time.Duration, taken bool) {
		if rate == 0 { // a rate of 0 lets nothing through, ever
			sc := quotas.Scope{Name: name, Window: period}
			if st.mask&quotas.ScopeBit(name) != 0 {
				sc.Violated, sc.RetryAfter = true, period
			}
			d.Scopes = append(d.Scopes, sc)
			return
		}
		T := float64(period.Milliseconds()) / rate
		tau := T * burst
		t := math.Max(tat, now)
		if t > now+tau { // as the script: a limit changed since; one token left
			t = now + tau - T
		}
		sc := quotas.Scope{Name: name, Limit: rate, Window: period}
		if st.mask&quotas.ScopeBit(name) != 0 {
			sc.Violated = true
			sc.Used = (t - now) / T
			sc.Reset = ms(t - now)
			sc.RetryAfter = ms(t + T - tau - now)
		} else {
			if taken {
				t += T
			}
			sc.Used = (t - now) / T
			sc.Remaining = int64(math.Max(0, math.Floor((tau-(t-now))/T+1e-9)))
			sc.Reset = ms(t - now)
		}
		d.Scopes = append(d.Scopes, sc)
	}
	counted := func(name string, limit, used int64, reset time.Duration, takes bool) {
		sc := quotas.Scope{Name: name, Limit: float64(limit), Used: float64(used), Reset: reset, Window: windows[name]}
		if takes && restTaken {
			sc.Used++
		}
		sc.Remaining = max(0, limit-int64(sc.Used)) // 0 when the limit is off (-1): unused
		if st.mask&quotas.ScopeBit(name) != 0 {
			sc.Violated, sc.Remaining, sc.RetryAfter = true, 0, max(reset, time.Second)
		}
		d.Scopes = append(d.Scopes, sc)
	}
	if l.KeyRate >= 0 {
		bucket(quotas.KeyRate, st.keyTAT, l.KeyRate, l.KeyBurst, time.Second, keyTaken)
	}
	if p.Mode == quotas.ModeKey || st.mask&1 != 0 || st.status == 2 {
		collectViolated(&d)
		return d
	}
	if l.TenantRate >= 0 {
		bucket(quotas.TenantRate, st.tenantTAT, l.TenantRate, l.TenantBurst, time.Second, restTaken)
	}
	if l.KeyAgentRate >= 0 && p.Agent != "" {
		bucket(quotas.KeyAgentRate, st.keyAgentTAT, l.KeyAgentRate, l.KeyAgentBurst, time.Second, restTaken)
	}
	if l.UserHourly >= 0 && p.User != "" {
		bucket(quotas.UserTasksHourly, st.userTAT, l.UserHourly, l.UserBurst, time.Hour, restTaken)
	}
	if l.Sessions >= 0 || peek {
		counted(quotas.ConcurrentSessions, l.Sessions, st.sessions, time.Second, true)
	}
	if (l.LongRunning >= 0 && p.LongRunning) || peek {
		counted(quotas.LongRunningInflight, l.LongRunning, st.long, time.Second, true)
	}
	if l.Backlog >= 0 || peek {
		counted(quotas.QueueBacklog, l.Backlog, st.backlog, time.Second, true)
	}
	if l.StepsDaily >= 0 || peek {
		reset := time.Duration((st.oldestHour+24)*3600000-st.now) * time.Millisecond
		counted(quotas.AgentStepsDaily, l.StepsDaily, st.steps, reset, false)
	}
	periodLeft := time.Duration(p.Period.End.UnixMilli()-st.now) * time.Millisecond
	if l.TokensMonthly >= 0 || peek {
		counted(quotas.AITokensMonthly, l.TokensMonthly, st.tokens, periodLeft, false)
	}
	if l.USDMonthlyMicro >= 0 || peek {
		counted(quotas.USDMonthly, l.USDMonthlyMicro, st.usd, periodLeft, false)
	}
	collectViolated(&d)
	return d
}

func collectViolated(d *quotas.Decision) {
	for _, sc := range d.Scopes {
		if sc.Violated {
			d.Violated = append(d.Violated, sc.Name)
		}
	}
}
