package panel

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/agentq/agentq/billing/usage"
	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/web/api"
	"github.com/agentq/agentq/web/internal/numfmt"
)

// The page's view of the usage report.

// tenantWideLimits are shown with their use; the per-key and per-user buckets only
// with their size (each key and user has its own).
var (
	tenantWideLimits = []string{quotas.TenantRate, quotas.ConcurrentSessions, quotas.QueueBacklog, quotas.Running,
		quotas.AgentStepsDaily, quotas.AITokensMonthly, quotas.AITokensPerMinute, quotas.USDMonthly, quotas.LongRunningInflight,
		quotas.InflightRequests}
	perKeyLimits = []string{quotas.KeyRate, quotas.KeyAgentRate, quotas.UserTasksHourly}
	limitLabels  = map[string]string{
		quotas.TenantRate: "Requests per second", quotas.KeyRate: "Requests per second, per API key",
		quotas.KeyAgentRate: "Tasks per second, per API key and agent", quotas.UserTasksHourly: "Tasks per hour, per user",
		quotas.ConcurrentSessions: "Concurrent agent sessions", quotas.LongRunningInflight: "Long-running tasks",
		quotas.QueueBacklog: "Queued tasks", quotas.Running: "Running tasks", quotas.AgentStepsDaily: "Agent steps, last 24 hours",
		quotas.AITokensMonthly: "AI tokens this billing period", quotas.USDMonthly: "Spend this billing period",
		quotas.InflightRequests: "API requests in progress", quotas.AITokensPerMinute: "AI tokens per minute",
		quotas.SLAStartWithin: "Task start", quotas.SLAPoolWaitWithin: "Model pool wait",
	}
)

type panelView struct {
	Report    api.UsageReport
	AsOf      string
	Limits    []panelLimit
	PerKey    []panelLimit
	Charts    []panelChart
	Tasks     []panelTask
	Hits      []panelHit
	Breaches  []panelBreach
	Changes   []panelChange
	TasksMore bool
}

// panelChange is a change to the tenant's limits: when, and what from what to what.
type panelChange struct {
	At, AtISO string
	Fields    []panelField
}

type panelField struct{ Field, Before, After string }

// limitChangesShown is how many changes to its limits the panel shows.
const limitChangesShown = 10

func newPanelChanges(cs []audit.LimitChange) []panelChange {
	out := make([]panelChange, 0, len(cs))
	for _, c := range cs {
		pc := panelChange{At: c.At.UTC().Format("2006-01-02 15:04:05"), AtISO: c.At.UTC().Format(time.RFC3339)}
		for _, f := range c.Changes {
			pc.Fields = append(pc.Fields, panelField{Field: f.Field, Before: string(f.Before), After: string(f.After)})
		}
		out = append(out, pc)
	}
	return out
}

// panelBreach is one commitment the platform missed for the tenant (last 30 days).
type panelBreach struct {
	LimitType, Label, Committed string
	Count                       int64
	Last, LastISO, Measured     string
}

type panelLimit struct {
	Type, Label         string
	DataUsed, DataLimit string // the data-used and data-limit-value attributes
	UsedText, LimitText string
	RemainingText       string
	Pct                 float64 // 0..100, for the bar
	PctText             string
	Level               string // ok, warn (80 %), high (90 %), full (100 %), off
	Off                 bool
	ResetAt             string // RFC 3339, "" when there is nothing to count down
	ResetText           string
	Rejected            int64
	ValueNow, ValueMax  string // aria-valuenow/max
}

type panelChart struct {
	ID, Title, Unit string
	Max             string
	Total           string
	Bars            []panelBar
	FirstDay        string
	LastDay         string
}

type panelBar struct {
	X, Y, W, H float64
	Label      string
}

type panelTask struct {
	ID, ShortID, State, Agent, Created, CreatedISO, Wait string
	// Tree: a root's tree totals ("" for a task that spawned nothing).
	Tree string
	// Position and ExpectedStart: where a queued task stands ("" when not known).
	Position, ExpectedStart, ExpectedStartISO string
}

type panelHit struct {
	EventID, Time, TimeISO, LimitType, Label, Classification, Enforcement, Value string
}

func newPanelView(rep api.UsageReport) panelView {
	v := panelView{Report: rep, AsOf: rep.AsOf.UTC().Format(time.RFC3339)}
	for _, name := range tenantWideLimits {
		v.Limits = append(v.Limits, newPanelLimit(name, rep.Limits[name], rep.AsOf))
	}
	for _, name := range perKeyLimits {
		v.PerKey = append(v.PerKey, newPanelLimit(name, rep.Limits[name], rep.AsOf))
	}
	v.Charts = newPanelCharts(rep.Days)
	for _, t := range rep.Tasks {
		pt := panelTask{ID: t.ID, ShortID: shortID(t.ID), State: t.State, Agent: t.Agent,
			Created: t.CreatedAt.UTC().Format("2006-01-02 15:04:05"), CreatedISO: t.CreatedAt.UTC().Format(time.RFC3339)}
		if tr := t.Tree; tr != nil {
			pt.Tree = treeLabel(tr.Tasks, tr.Live, tr.CostUSD)
		}
		if w := t.WaitReason; w != nil {
			pt.Wait = w.Reason
			if w.Until != nil {
				pt.Wait += " until " + w.Until.UTC().Format("15:04:05")
			}
			if w.Position != nil {
				pt.Position = strconv.FormatInt(*w.Position, 10)
			}
			if w.ExpectedStart != nil {
				pt.ExpectedStart = w.ExpectedStart.UTC().Format("15:04:05")
				pt.ExpectedStartISO = w.ExpectedStart.UTC().Format(time.RFC3339)
			}
		}
		v.Tasks = append(v.Tasks, pt)
	}
	v.TasksMore = rep.Queue.Depth+rep.Queue.Running > int64(len(rep.Tasks))
	for _, h := range rep.RecentLimitHits {
		val, _ := h.CurrentUsage.MarshalJSON()
		lim, _ := h.LimitValue.MarshalJSON()
		v.Hits = append(v.Hits, panelHit{EventID: h.EventID, Time: h.Time.UTC().Format("2006-01-02 15:04:05"),
			TimeISO: h.Time.UTC().Format(time.RFC3339), LimitType: h.LimitType, Label: labelOf(h.LimitType),
			Classification: string(h.SLAClassification), Enforcement: string(h.Enforcement),
			Value: strings.Trim(string(val), `"`) + " / " + strings.Trim(string(lim), `"`)})
	}
	for _, b := range rep.SLABreaches {
		v.Breaches = append(v.Breaches, panelBreach{LimitType: b.LimitType, Label: labelOf(b.LimitType), Count: b.Count,
			Last: b.Last.UTC().Format("2006-01-02 15:04:05"), LastISO: b.Last.UTC().Format(time.RFC3339),
			Committed: seconds(b.LastCommittedMs), Measured: seconds(b.LastMeasuredMs)})
	}
	return v
}

// seconds writes milliseconds as seconds, to the millisecond.
func seconds(ms int64) string {
	return strconv.FormatFloat(float64(ms)/1000, 'f', -1, 64) + " s"
}

func labelOf(limitType string) string {
	if l, ok := limitLabels[limitType]; ok {
		return l
	}
	return strings.ReplaceAll(limitType, "_", " ")
}

func shortID(id string) string {
	if len(id) > 8 {
		return id[len(id)-8:]
	}
	return id
}

func newPanelLimit(name string, lu api.LimitUsage, now time.Time) panelLimit {
	pl := panelLimit{Type: name, Label: labelOf(name), Rejected: lu.Rejected,
		DataUsed: fmtNum(lu.Used), UsedText: fmtAmount(lu.Used, lu.Unit), ValueNow: fmtNum(lu.Used)}
	if lu.Limit == nil {
		pl.Off, pl.Level, pl.DataLimit, pl.LimitText, pl.RemainingText = true, "off", "unlimited", "unlimited", "no limit"
	} else {
		l := *lu.Limit
		pl.DataLimit, pl.LimitText, pl.ValueMax = fmtNum(l), fmtAmount(l, lu.Unit), fmtNum(l)
		switch {
		case l > 0:
			pl.Pct = math.Min(100, lu.Used/l*100)
		case l == 0:
			pl.Pct = 100
		}
		pl.Level = levelOf(lu.Used, l)
		if lu.Remaining != nil {
			pl.RemainingText = fmtAmount(*lu.Remaining, lu.Unit) + " remaining"
		}
	}
	if lu.Unknown() { // Redis, which counts it, did not answer in time
		pl.UsedText = "unknown right now"
	}
	pl.PctText = strconv.FormatFloat(math.Round(pl.Pct*10)/10, 'f', -1, 64)
	if lu.ResetAt != nil && lu.ResetAt.After(now.Add(time.Second)) && lu.Used > 0 {
		pl.ResetAt = lu.ResetAt.UTC().Format(time.RFC3339)
		pl.ResetText = "resets in " + fmtCountdown(lu.ResetAt.Sub(now))
	}
	return pl
}

func levelOf(used, limit float64) string {
	switch {
	case limit <= 0 || used >= limit:
		return "full"
	case used >= limit*0.9:
		return "high"
	case used >= limit*0.8:
		return "warn"
	}
	return "ok"
}

func fmtNum(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// fmtAmount writes an amount for people: dollars with cents, counts with separators.
func fmtAmount(f float64, unit string) string {
	if unit == "usd" { // cents, and up to four decimals when there are more
		s := strconv.FormatFloat(f, 'f', 4, 64)
		for strings.HasSuffix(s, "0") && len(s)-strings.IndexByte(s, '.') > 3 {
			s = s[:len(s)-1]
		}
		return "$" + numfmt.GroupDigits(s)
	}
	if f == math.Trunc(f) {
		return numfmt.GroupDigits(strconv.FormatFloat(f, 'f', 0, 64))
	}
	return strconv.FormatFloat(math.Round(f*100)/100, 'f', -1, 64)
}

func fmtCountdown(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d >= 48*time.Hour:
		return fmt.Sprintf("%dd %dh", int(d.Hours())/24, int(d.Hours())%24)
	case d >= time.Hour:
		return fmt.Sprintf("%dh %dm", int(d.Hours()), int(d.Minutes())%60)
	case d >= time.Minute:
		return fmt.Sprintf("%dm %ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%ds", int(d.Seconds()))
}

// The charts: one bar chart per meter, 600 x 120 user units.
const chartW, chartH = 600.0, 120.0

func newPanelCharts(days []usage.DayUsage) []panelChart {
	series := []struct {
		id, title, unit string
		val             func(usage.DayUsage) float64
	}{
		{"steps", "Agent steps per day", "steps", func(d usage.DayUsage) float64 { return float64(d.Steps) }},
		{"tokens", "AI tokens per day", "tokens", func(d usage.DayUsage) float64 { return float64(d.Tokens) }},
		{"usd", "Spend per day", "usd", func(d usage.DayUsage) float64 { return float64(d.CostMicroUSD) / 1e6 }},
	}
	out := make([]panelChart, 0, len(series))
	for _, sr := range series {
		ch := panelChart{ID: sr.id, Title: sr.title, Unit: sr.unit}
		var maxV, total float64
		for _, d := range days {
			maxV = math.Max(maxV, sr.val(d))
			total += sr.val(d)
		}
		ch.Max, ch.Total = fmtAmount(maxV, sr.unit), fmtAmount(total, sr.unit)
		if len(days) > 0 {
			ch.FirstDay, ch.LastDay = days[0].Day, days[len(days)-1].Day
			w := chartW / float64(len(days))
			for i, d := range days {
				h := 0.0
				if maxV > 0 {
					h = sr.val(d) / maxV * chartH
				}
				if sr.val(d) > 0 && h < 1 {
					h = 1
				}
				ch.Bars = append(ch.Bars, panelBar{X: float64(i)*w + w*0.1, Y: chartH - h, W: w * 0.8, H: h,
					Label: d.Day + ": " + fmtAmount(sr.val(d), sr.unit)})
			}
		}
		out = append(out, ch)
	}
	return out
}

// treeLabel is a root's tree as the panel shows it beside its agent; panel.js writes
// the same.
func treeLabel(tasks, live int, cost float64) string {
	return fmt.Sprintf("tree: %d tasks, %d live, $%s", tasks, live, strconv.FormatFloat(cost, 'f', -1, 64))
}
