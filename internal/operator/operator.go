// Package operator is the operator view's domain service: one read of the whole
// deployment — every tenant with its fair share of worker time against its
// entitlement, its queue, its waits and its limit hits; the worker slots; what the
// janitor corrected; the webhook endpoints and their failing deliveries; the model
// pools with their configured and effective rates, their use in the last minute and
// the tenants waiting on them. It reads Postgres (tasks, events, refusal counts,
// janitor runs, deliveries, pools, the newest rows of the audit log) and Redis (the
// scheduler's state, the pools' buckets), and changes nothing.
//
// Definitions (docs/operations.md shows them to operators):
//
//   - Worker-seconds of a tenant over the window [now − Window, now]: for each of its
//     tasks that started, (its end, or now while it runs) − its first start, clipped
//     to the window. Share = its worker-seconds ÷ every tenant's.
//   - A tenant is active in the window when it had worker time in it or a task
//     waiting in it (queued now, or ended in the window without starting), or Redis
//     holds a queued or running task of it. Entitlement = its effective weight ÷ the
//     sum of the active tenants' weights; an inactive tenant is entitled to nothing.
//     Stride scheduling gives each backlogged tenant its entitlement; a tenant that
//     keeps less work queued than its share (or hits its running cap) uses less, and
//     the others take the rest.
//   - p99 wait: the 99th percentile of created → first start over the tasks that
//     started in the window.
//   - Limit hits: usage.limit_hit events written in the last 24 h; refusals:
//     admissions refused in the last 24 h (as flushed by the janitor, about a minute
//     behind).
//   - SLA breaches: per commitment, the eligible_breach events of missed commitments
//     (a late first start, a long pool wait) of the last 30 days, and the last one.
package operator

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/agentq/agentq/billing/outbox"
	"github.com/agentq/agentq/billing/webhooks"
	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/pools"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/scheduler"
)

// Defaults.
const (
	DefaultWindow = 5 * time.Minute
	LimitHitsOver = 24 * time.Hour // how far back limit hits and janitor corrections go
	// BreachesOver is how far back the missed commitments go: a month of credits.
	BreachesOver = 30 * 24 * time.Hour
	janitorRuns  = 20 // janitor runs listed
)

// JanitorRun is one janitor pass run that corrected something.
type JanitorRun = store.JanitorRun

// Store is what the view reads of Postgres (*store.Store).
type Store interface {
	UnscopedTenantActivity(ctx context.Context, p store.ActivityParams) ([]store.TenantActivity, error)
	UnscopedLimitHits(ctx context.Context, ids []string, eventType string, since time.Time) (map[string]store.LimitHits, error)
	UnscopedJanitorRuns(ctx context.Context, since time.Time, limit int) ([]store.JanitorRun, map[string]int64, error)
	UnscopedSLABreaches(ctx context.Context, ids []string, since time.Time) ([]store.SLABreaches, error)
	UnscopedLiveTrees(ctx context.Context, limit int) ([]store.LiveTree, error)
}

// Scheduler is what the view reads of the scheduler (*scheduler.Scheduler).
type Scheduler interface {
	Depths(ctx context.Context, tenants []string) ([]scheduler.Depth, error)
	SlotUsage(ctx context.Context) (scheduler.WorkerSlots, error)
}

// Tenants lists the tenants and resolves their policy (*tenants.Service).
type Tenants interface {
	List(ctx context.Context) ([]tenants.Tenant, error)
	Policy(t tenants.Tenant) (tenants.Policy, error)
}

// Webhooks lists the endpoints with their deliveries' state (*webhooks.Webhooks).
type Webhooks interface {
	Health(ctx context.Context) ([]webhooks.WebhookHealth, error)
}

// Pools lists the model pools with their live state (*pools.Service).
type Pools interface {
	List(ctx context.Context) ([]pools.Pool, error)
}

// Audit lists the audit log (*audit.Log).
type Audit interface {
	List(ctx context.Context, p audit.ListParams) (audit.Page, error)
}

var (
	_ Pools     = (*pools.Service)(nil)
	_ Audit     = (*audit.Log)(nil)
	_ Store     = (*store.Store)(nil)
	_ Scheduler = (*scheduler.Scheduler)(nil)
	_ Tenants   = (*tenants.Service)(nil)
	_ Webhooks  = (*webhooks.Webhooks)(nil)
)

// Deps are the view's sources. Archetype gives the clock (nil: defaults); Window the
// share window (0: DefaultWindow).
type Deps struct {
	Store     Store
	Scheduler Scheduler
	Tenants   Tenants
	Webhooks  Webhooks
	Pools     Pools // nil: the view shows no pools
	Audit     Audit // nil: the view shows no changes
	Archetype *baseservice.Archetype
	Window    time.Duration
}

// Service builds the operator view.
type Service struct{ d Deps }

// New returns the service.
func New(d Deps) *Service {
	if d.Window <= 0 {
		d.Window = DefaultWindow
	}
	return &Service{d: d}
}

// Tenant is one tenant's row of the view.
type Tenant struct {
	ID, Name, Plan, Status string
	Weight                 int // effective: its own, else its plan's
	Active                 bool
	WorkerSeconds          float64
	Share                  float64 // of every tenant's worker-seconds in the window, 0..1
	Entitlement            float64 // weight ÷ the active tenants' weights, 0..1
	Queued, Running        int64
	Started                int
	P99Wait                time.Duration
	// CapacityWaits: queued tasks waiting for token capacity (tokens per minute, a
	// model pool, a throttled agent's retry), without a worker.
	CapacityWaits       int
	LimitHits, Refusals int64
	// Breaches are its missed commitments over BreachesOver, one entry per
	// commitment (limit_type): how many eligible_breach events, and the last one.
	Breaches []store.SLABreaches
}

// Endpoint is a webhook endpoint with its deliveries' state. URL shows scheme, host
// and path only: credentials in its user part or query are not shown.
type Endpoint struct {
	webhooks.WebhookHealth
	DisplayURL string
}

// Correction is the total of one kind of drift the janitor corrected.
type Correction struct {
	Kind  string
	Count int64
}

// Overview is the whole view.
type Overview struct {
	At                 time.Time
	Window             time.Duration
	Tenants            []Tenant // filtered and sorted as the Query asked
	TenantsTotal       int      // before the filter
	TotalWorkerSeconds float64
	TotalWeightActive  int
	Slots              scheduler.WorkerSlots
	Utilisation        float64 // Busy ÷ Capacity, at most 1; 0 without capacity
	JanitorRuns        []JanitorRun
	JanitorTotals      []Correction // over LimitHitsOver, by kind
	Endpoints          []Endpoint
	Pools              []pools.Pool     // by name, each with its live state
	Changes            []Change         // the newest rows of the audit log
	Trees              []store.LiveTree // trees with a live spawned task, at most LiveTreesShown
	Query              Query
}

// LiveTreesShown bounds the live task trees the view lists.
const LiveTreesShown = 20

// Change is a row of the audit log with the fields it moved.
type Change struct {
	audit.Row
	Diff []audit.FieldChange
}

// RecentChanges is how many rows of the audit log the view shows.
const RecentChanges = 20

// Sort keys of Query.Sort.
const (
	SortTenant      = "tenant"
	SortPlan        = "plan"
	SortWeight      = "weight"
	SortShare       = "share"
	SortEntitlement = "entitlement"
	SortQueued      = "queued"
	SortRunning     = "running"
	SortP99         = "p99"
	SortLimitHits   = "limit_hits"
)

// SortKeys lists the sort keys in the view's column order.
var SortKeys = []string{SortTenant, SortPlan, SortWeight, SortShare, SortEntitlement, SortQueued, SortRunning, SortP99, SortLimitHits}

// Query says how to sort and filter the tenants. No Sort is share, descending; no
// Tenant is every tenant.
type Query struct {
	Sort   string
	Desc   bool
	Tenant string // case-insensitive substring of the tenant's id or name
}

// ErrBadQuery is the error of a Query the view cannot apply (errors.Is).
var ErrBadQuery = errors.New("operator: bad query")

// ParseQuery reads the view's query parameters: sort (a SortKeys key), dir (asc or
// desc; by default asc for text columns, desc for numbers) and tenant.
func ParseQuery(sortKey, dir, tenant string) (Query, error) {
	q := Query{Sort: sortKey, Tenant: strings.TrimSpace(tenant)}
	if q.Sort == "" {
		q.Sort = SortShare
	}
	if !slices.Contains(SortKeys, q.Sort) {
		return Query{}, fmt.Errorf("%w: sort must be one of %s", ErrBadQuery, strings.Join(SortKeys, ", "))
	}
	switch dir {
	case "":
		q.Desc = q.Sort != SortTenant && q.Sort != SortPlan
	case "asc":
	case "desc":
		q.Desc = true
	default:
		return Query{}, fmt.Errorf("%w: dir must be asc or desc", ErrBadQuery)
	}
	return q, nil
}

// Overview reads the view.
func (s *Service) Overview(ctx context.Context, q Query) (Overview, error) {
	if q.Sort == "" {
		q.Sort, q.Desc = SortShare, true
	}
	if !slices.Contains(SortKeys, q.Sort) {
		return Overview{}, fmt.Errorf("%w: unknown sort %q", ErrBadQuery, q.Sort)
	}
	now := s.d.Archetype.Now()
	ov := Overview{At: now, Window: s.d.Window, Query: q}
	ts, err := s.d.Tenants.List(ctx)
	if err != nil {
		return Overview{}, err
	}
	if ov.Trees, err = s.d.Store.UnscopedLiveTrees(ctx, LiveTreesShown); err != nil {
		return Overview{}, err
	}
	ids := make([]string, len(ts))
	for i, t := range ts {
		ids[i] = t.ID
	}
	acts, err := s.d.Store.UnscopedTenantActivity(ctx, store.ActivityParams{At: &now, Window: s.d.Window})
	if err != nil {
		return Overview{}, err
	}
	act := make(map[string]store.TenantActivity, len(acts))
	for _, a := range acts {
		act[a.TenantID] = a
	}
	depths, err := s.d.Scheduler.Depths(ctx, ids)
	if err != nil {
		return Overview{}, err
	}
	hits, err := s.d.Store.UnscopedLimitHits(ctx, ids, outbox.TypeLimitHit, now.Add(-LimitHitsOver))
	if err != nil {
		return Overview{}, err
	}
	breaches, err := s.d.Store.UnscopedSLABreaches(ctx, ids, now.Add(-BreachesOver))
	if err != nil {
		return Overview{}, err
	}
	byTenant := map[string][]store.SLABreaches{}
	for _, b := range breaches {
		byTenant[b.TenantID] = append(byTenant[b.TenantID], b)
	}
	rows := make([]Tenant, len(ts))
	for i, t := range ts {
		pol, _ := s.d.Tenants.Policy(t) // a removed plan still has a weight to show
		a := act[t.ID]
		r := Tenant{
			ID: t.ID, Name: t.Name, Plan: t.Plan, Status: t.Status, Weight: pol.Weight,
			WorkerSeconds: a.WorkerSeconds, Started: a.Started, P99Wait: a.P99Wait, CapacityWaits: a.CapacityWaits,
			LimitHits: hits[t.ID].Events, Refusals: hits[t.ID].Refusals, Breaches: byTenant[t.ID],
		}
		if i < len(depths) {
			r.Queued, r.Running = depths[i].Queued, depths[i].Running
		}
		r.Active = a.WorkerSeconds > 0 || a.Waited || r.Queued > 0 || r.Running > 0
		ov.TotalWorkerSeconds += r.WorkerSeconds
		if r.Active {
			ov.TotalWeightActive += r.Weight
		}
		rows[i] = r
	}
	for i := range rows {
		if ov.TotalWorkerSeconds > 0 {
			rows[i].Share = rows[i].WorkerSeconds / ov.TotalWorkerSeconds
		}
		if rows[i].Active && ov.TotalWeightActive > 0 {
			rows[i].Entitlement = float64(rows[i].Weight) / float64(ov.TotalWeightActive)
		}
	}
	ov.TenantsTotal = len(rows)
	ov.Tenants = sortTenants(filterTenants(rows, q.Tenant), q)

	if ov.Slots, err = s.d.Scheduler.SlotUsage(ctx); err != nil {
		return Overview{}, err
	}
	if ov.Slots.Capacity > 0 {
		ov.Utilisation = min(1, float64(ov.Slots.Busy)/float64(ov.Slots.Capacity))
	}
	runs, totals, err := s.d.Store.UnscopedJanitorRuns(ctx, now.Add(-LimitHitsOver), janitorRuns)
	if err != nil {
		return Overview{}, err
	}
	ov.JanitorRuns = runs
	for k, n := range totals {
		ov.JanitorTotals = append(ov.JanitorTotals, Correction{Kind: k, Count: n})
	}
	sort.Slice(ov.JanitorTotals, func(i, j int) bool { return ov.JanitorTotals[i].Kind < ov.JanitorTotals[j].Kind })
	eps, err := s.d.Webhooks.Health(ctx)
	if err != nil {
		return Overview{}, err
	}
	for _, e := range eps {
		ov.Endpoints = append(ov.Endpoints, Endpoint{WebhookHealth: e, DisplayURL: DisplayURL(e.URL)})
	}
	if s.d.Pools != nil {
		if ov.Pools, err = s.d.Pools.List(ctx); err != nil {
			return Overview{}, err
		}
	}
	if ov.Changes, err = s.recentChanges(ctx); err != nil {
		return Overview{}, err
	}
	return ov, nil
}

// recentChanges are the newest rows of the audit log, each with its diff.
func (s *Service) recentChanges(ctx context.Context) ([]Change, error) {
	if s.d.Audit == nil {
		return nil, nil
	}
	page, err := s.d.Audit.List(ctx, audit.ListParams{Limit: RecentChanges})
	if err != nil {
		return nil, err
	}
	out := make([]Change, 0, len(page.Rows))
	for _, r := range page.Rows {
		d, err := audit.Diff(r.Before, r.After)
		if err != nil {
			return nil, err
		}
		out = append(out, Change{Row: r, Diff: displayDiff(d)})
	}
	return out, nil
}

func filterTenants(rows []Tenant, f string) []Tenant {
	if f == "" {
		return rows
	}
	f = strings.ToLower(f)
	out := rows[:0:0]
	for _, r := range rows {
		if strings.Contains(strings.ToLower(r.ID), f) || strings.Contains(strings.ToLower(r.Name), f) {
			out = append(out, r)
		}
	}
	return out
}

// sortTenants orders rows by the query's key, ties by tenant id (always ascending),
// so the order is stable between loads.
func sortTenants(rows []Tenant, q Query) []Tenant {
	key := func(a, b Tenant) int {
		switch q.Sort {
		case SortPlan:
			return cmp.Compare(a.Plan, b.Plan)
		case SortWeight:
			return cmp.Compare(a.Weight, b.Weight)
		case SortShare:
			return cmp.Compare(a.Share, b.Share)
		case SortEntitlement:
			return cmp.Compare(a.Entitlement, b.Entitlement)
		case SortQueued:
			return cmp.Compare(a.Queued, b.Queued)
		case SortRunning:
			return cmp.Compare(a.Running, b.Running)
		case SortP99:
			return cmp.Compare(a.P99Wait, b.P99Wait)
		case SortLimitHits:
			return cmp.Compare(a.LimitHits+a.Refusals, b.LimitHits+b.Refusals)
		}
		return 0
	}
	slices.SortStableFunc(rows, func(a, b Tenant) int {
		c := key(a, b)
		if q.Desc {
			c = -c
		}
		if c == 0 {
			c = cmp.Compare(a.ID, b.ID)
			if q.Sort == SortTenant && q.Desc {
				c = -c
			}
		}
		return c
	})
	return rows
}

// displayDiff is d as the view shows it: a URL field (an endpoint's, an agent's) as
// DisplayURL shows it, since a change's URL can carry credentials as the endpoint's
// own can.
func displayDiff(d []audit.FieldChange) []audit.FieldChange {
	for i, c := range d {
		if c.Field != "url" {
			continue
		}
		d[i].Before, d[i].After = displayURLJSON(c.Before), displayURLJSON(c.After)
	}
	return d
}

// displayURLJSON is a JSON string holding a URL, as DisplayURL shows it; anything
// else (null, another type) as it is.
func displayURLJSON(v json.RawMessage) json.RawMessage {
	var u string
	if len(v) == 0 || v[0] != '"' || json.Unmarshal(v, &u) != nil {
		return v
	}
	b, err := json.Marshal(DisplayURL(u))
	if err != nil {
		return v
	}
	return b
}

// DisplayURL is u without its user part and query: what the view may show of an
// endpoint's URL, which can carry credentials there.
func DisplayURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	p.User, p.RawQuery, p.Fragment = nil, "", ""
	return p.String()
}
