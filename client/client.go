package client

//go:generate go run ../agentqtype/internal/vocabgen -o vocab_gen.go

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Version is this client's version, sent in the User-Agent header.
const Version = "0.1.0"

// Task is a task as the API shows it: the wire format (the server writes it as
// api.TaskJSON of web/api; this package stands on the standard library, so it has its own).
type Task struct {
	ID       string  `json:"id"`
	TenantID string  `json:"tenant_id"`
	Agent    string  `json:"agent"`
	User     *string `json:"user"`
	State    string  `json:"state"`
	Priority int     `json:"priority"`
	// Input is the agent's input; Output is the agent's output, JSON null until the
	// task produces one.
	Input  json.RawMessage `json:"input"`
	Output json.RawMessage `json:"output"`
	Error  *string         `json:"error"`
	Budget *Budget         `json:"budget"`
	Usage  Usage           `json:"usage"`
	// WaitReason says why a queued task waits and where it stands; nil otherwise.
	WaitReason *WaitReason `json:"wait_reason"`
	// WaitUntil is when the capacity a task waiting for tokens_per_minute or a
	// pool:<name> is expected; WaitedS the time it spent waiting for capacity so far
	// (not charged to its wall-clock budget).
	WaitUntil *time.Time `json:"wait_until"`
	WaitedS   float64    `json:"waited_s"`
	// PausedReason is the limit_type that paused a paused task: a field of its budget
	// (task_max_steps, task_max_cost_usd, task_max_wallclock_s) or one of its
	// tenant's period quotas; nil when it is not paused.
	PausedReason *string `json:"paused_reason"`
	// StartDeadline is when the task expires if it has not started by then; nil
	// when it was submitted without StartWithinS.
	StartDeadline *time.Time `json:"start_deadline"`
	Attempt       int        `json:"attempt"`
	CreatedAt     time.Time  `json:"created_at"`
	StartedAt     *time.Time `json:"started_at"`
	FinishedAt    *time.Time `json:"finished_at"`
	// Degraded: the task is queued but the server's Redis did not tell where it
	// stands in time, so WaitReason is nil.
	Degraded bool `json:"degraded"`
	// ParentID is the task whose step spawned this one (nil for a root); RootID the
	// root of its tree (its own id for a root); Depth its distance from the root.
	ParentID *string `json:"parent_id"`
	RootID   string  `json:"root_id"`
	Depth    int     `json:"depth"`
}

// WaitReason is why a queued task waits and where it stands.
type WaitReason struct {
	// Reason is behind_fair_share, tenant_running_cap or no_worker_capacity while
	// the task stands in its tenant's queue; tokens_per_minute, pool:<name> or
	// throttled while it is parked for token capacity.
	Reason string `json:"reason"`
	// Position is the task's 1-based place among its tenant's queued tasks, in the
	// order they are dispatched; 0 for a parked task, which is out of the queue.
	Position int `json:"position"`
	// ExpectedStart is when the task is expected to start at its tenant's measured
	// start rate (for a parked task, Until); nil while no rate is measured.
	ExpectedStart *time.Time `json:"expected_start"`
	// Until is when the capacity a parked task waits for is expected; nil otherwise.
	Until *time.Time `json:"until"`
}

// Terminal reports whether the task has ended for good.
func (t *Task) Terminal() bool { return IsTerminal(t.State) }

// Budget is a task's budget: every field is a cap above 0.
type Budget struct {
	MaxSteps      int     `json:"max_steps"`
	MaxWallclockS float64 `json:"max_wallclock_s"`
	MaxCostUSD    float64 `json:"max_cost_usd"`
	// Tree is a root's tree budget, when it was submitted with one.
	Tree *TreeBudget `json:"tree,omitempty"`
}

// PlanBudget is a plan's per-task budget: what a task gets for the fields it does not
// ask for (Default) and the most it may ask for (Ceiling).
type PlanBudget struct {
	Default Budget `json:"default"`
	Ceiling Budget `json:"ceiling"`
}

// Usage is what a task has used so far.
type Usage struct {
	Steps   int     `json:"steps"`
	Tokens  int64   `json:"tokens"`
	CostUSD float64 `json:"cost_usd"`
}

// TaskList is a page of tasks. NextCursor is nil on the last page.
type TaskList struct {
	Tasks      []Task  `json:"tasks"`
	NextCursor *string `json:"next_cursor"`
}

// SubmitTaskRequest is a task submission.
type SubmitTaskRequest struct {
	Agent string `json:"agent"`
	// Input is any value that marshals to the JSON the agent accepts (a
	// json.RawMessage is sent as is). nil sends no input; the server uses {}.
	Input any `json:"input,omitempty"`
	// User is the on-behalf-of user (principal), optional.
	User string `json:"user,omitempty"`
	// Budget asks for a smaller budget than the plan's default; nil takes the default.
	Budget *BudgetRequest `json:"budget,omitempty"`
	// Priority is 0 (lowest) to 9 (highest); nil takes the default, 5.
	Priority *int `json:"priority,omitempty"`
	// IdempotencyKey, when set, is sent as the Idempotency-Key header: submitting the
	// same request with the same key returns the same task; the same key with a
	// different request answers 409 IDEMPOTENCY_CONFLICT.
	IdempotencyKey string `json:"-"`
	// StartWithinS, when set, is how many seconds the task may wait to start (above
	// 0, at most 7 days): one no worker started by then ends expired
	// (StateExpired), charged nothing.
	StartWithinS *float64 `json:"start_within_s,omitempty"`
	// TreeBudget is the budget of the tree the task roots, should its steps spawn
	// sub-agents; nil takes the plan's tree default.
	TreeBudget *TreeBudget `json:"tree_budget,omitempty"`
}

// BudgetRequest is a requested task budget; nil fields take the plan's default.
type BudgetRequest struct {
	MaxSteps      *int     `json:"max_steps,omitempty"`
	MaxWallclockS *float64 `json:"max_wallclock_s,omitempty"`
	MaxCostUSD    *float64 `json:"max_cost_usd,omitempty"`
}

// ListTasksParams filter and page a task listing. Zero fields are not sent.
type ListTasksParams struct {
	State  string // one of the task states
	Limit  int    // page size, 1 to 500; the server's default is 50
	Cursor string // NextCursor of the previous page
	RootID string // only the tasks of the tree rooted at this task, the root included
}

// Limit is a limit's value in a plan or a tenant's overrides: the limit itself (0
// allows nothing), or Unlimited. On the wire it is a number or "unlimited".
type Limit float64

// Unlimited turns a limit off.
const Unlimited Limit = -1

// MarshalJSON writes the number, or "unlimited".
func (l Limit) MarshalJSON() ([]byte, error) {
	if l < 0 {
		return []byte(`"unlimited"`), nil
	}
	return json.Marshal(float64(l))
}

// UnmarshalJSON reads a number or "unlimited".
func (l *Limit) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		if s != "unlimited" {
			return fmt.Errorf("agentq: limit %q: want a number or \"unlimited\"", s)
		}
		*l = Unlimited
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("agentq: limit %s: %w", b, err)
	}
	*l = Limit(f)
	return nil
}

// Tenant is a tenant as the admin API shows it.
type Tenant struct {
	ID        string           `json:"id"`
	Name      string           `json:"name"`
	Plan      string           `json:"plan"`
	Weight    *int             `json:"weight"` // nil: the plan's weight
	Overrides map[string]Limit `json:"overrides"`
	Status    string           `json:"status"` // active or suspended
	// BillingDay and TimeZone are the billing anchor in force: periods start at 00:00
	// in TimeZone (IANA) on BillingDay, clamped to the month's last day.
	BillingDay      int           `json:"billing_day"`
	TimeZone        string        `json:"time_zone"`
	BillingPeriod   BillingPeriod `json:"billing_period"` // the current one
	CreatedAt       time.Time     `json:"created_at"`
	UpdatedAt       time.Time     `json:"updated_at"`
	EffectiveWeight int           `json:"effective_weight"`
}

// BillingPeriod is a tenant's billing period, [Start, End); ID is its start date in
// the tenant's zone, yyyymmdd.
type BillingPeriod struct {
	ID    string    `json:"id"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
}

// CreateTenantRequest creates a tenant. ID and Plan are required; Name defaults to ID.
type CreateTenantRequest struct {
	ID        string           `json:"id"`
	Name      string           `json:"name,omitempty"`
	Plan      string           `json:"plan"`
	Weight    *int             `json:"weight,omitempty"`
	Overrides map[string]Limit `json:"overrides,omitempty"`
	// BillingDay (1 to 31) and TimeZone (IANA, such as "Europe/Paris"): the billing
	// anchor; nil for the defaults (the UTC day of creation, UTC).
	BillingDay *int    `json:"billing_day,omitempty"`
	TimeZone   *string `json:"time_zone,omitempty"`
}

// UpdateTenantRequest changes the non-nil fields of a tenant. A non-nil Overrides
// replaces the whole override map; an empty non-nil map clears it.
type UpdateTenantRequest struct {
	Name      *string          `json:"name,omitempty"`
	Plan      *string          `json:"plan,omitempty"`
	Weight    *int             `json:"weight,omitempty"`
	Overrides map[string]Limit `json:"overrides,omitzero"`
	Status    *string          `json:"status,omitempty"` // "active" or "suspended"
	// BillingDay and TimeZone change the billing anchor.
	BillingDay *int    `json:"billing_day,omitempty"`
	TimeZone   *string `json:"time_zone,omitempty"`
}

// Scopes restrict what a key may do; an empty list allows all.
type Scopes struct {
	Agents     []string `json:"agents,omitempty"`
	Principals []string `json:"principals,omitempty"`
}

// KeyCreated answers key creation and rotation. Key is the plaintext key,
// aq_<kid>_<secret>; the server shows it once and never again.
type KeyCreated struct {
	Kid       string     `json:"kid"`
	Key       string     `json:"key"`
	TenantID  string     `json:"tenant_id"`
	Scopes    Scopes     `json:"scopes"`
	CreatedAt time.Time  `json:"created_at"`
	RotatedAt *time.Time `json:"rotated_at,omitempty"`
}

// APIKey is a key's record as the admin API lists it; it never holds the secret.
type APIKey struct {
	Kid       string     `json:"kid"`
	TenantID  string     `json:"tenant_id"`
	Scopes    Scopes     `json:"scopes"`
	CreatedAt time.Time  `json:"created_at"`
	RotatedAt *time.Time `json:"rotated_at"`
	RevokedAt *time.Time `json:"revoked_at"`
}

// Plan is an entry of the plan catalogue.
type Plan struct {
	Name   string           `json:"name"`
	Weight int              `json:"weight"`
	Limits map[string]Limit `json:"limits"`
	Budget PlanBudget       `json:"budget"`
	SLA    SLA              `json:"sla"`
}

// Error is a non-2xx answer. Use errors.As to get it.
type Error struct {
	StatusCode int
	// Code and Message come from the error body {"error":{"code","message",...}};
	// Code is empty when the answer did not have that shape (a proxy's 502 page).
	Code    string
	Message string
	// LimitType is the error body's limit_type, set on 429 and 402 answers, and on a
	// 409 RESUME_NEEDS_ROOM (the limit with no room for a paused task's next step).
	LimitType string
	// Body is the raw JSON of the error object (the value of "error", with every
	// field the code adds), or the raw response body when it is not the documented
	// shape. At most 1 MiB is kept.
	Body []byte
	// RetryAfter is the Retry-After header (seconds or HTTP date), or the body's
	// retry_after_seconds when the header is missing; 0 when neither is given.
	RetryAfter time.Duration
	// Header holds the response headers, among them X-RateLimit-Limit,
	// X-RateLimit-Remaining, X-RateLimit-Reset, RateLimit-Policy and RateLimit.
	Header http.Header
	// Method and Path name the request that failed (never its credentials).
	Method, Path string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("agentq: ")
	if e.Method != "" {
		b.WriteString(e.Method + " " + e.Path + ": ")
	}
	b.WriteString(strconv.Itoa(e.StatusCode))
	if e.Code != "" {
		b.WriteString(" " + e.Code)
	} else if t := http.StatusText(e.StatusCode); t != "" {
		b.WriteString(" " + t)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	return b.String()
}

// Option configures a Client or an Admin.
type Option func(*transport)

// WithHTTPClient sends requests through hc instead of http.DefaultClient (timeouts,
// proxies, TLS, tracing transports).
func WithHTTPClient(hc *http.Client) Option {
	return func(t *transport) {
		if hc != nil {
			t.hc = hc
		}
	}
}

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option {
	return func(t *transport) { t.userAgent = ua }
}

// Client calls the tenant API (/v1) with an API key.
type Client struct{ t transport }

// New returns a client of the agentq server at baseURL (e.g. "http://127.0.0.1:8080")
// that authenticates with apiKey, aq_<kid>_<secret>.
func New(baseURL, apiKey string, opts ...Option) *Client {
	return &Client{t: newTransport(baseURL, apiKey, opts)}
}

// String describes the client without its key.
func (c *Client) String() string { return "agentq.Client(" + c.t.base + ")" }

// GoString describes the client without its key.
func (c *Client) GoString() string { return c.String() }

// SubmitTask submits a task. The answer is 202 with the queued task, or the earlier
// task when the idempotency key was used before with the same request.
func (c *Client) SubmitTask(ctx context.Context, req SubmitTaskRequest) (*Task, error) {
	if raw, ok := req.Input.(json.RawMessage); ok && len(raw) == 0 {
		req.Input = nil // else it would marshal as null, or fail when empty but not nil
	}
	var h http.Header
	if req.IdempotencyKey != "" {
		h = http.Header{"Idempotency-Key": {req.IdempotencyKey}}
	}
	var t Task
	if err := c.t.do(ctx, http.MethodPost, "/v1/tasks", nil, h, req, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// GetTask returns one of the tenant's tasks.
func (c *Client) GetTask(ctx context.Context, id string) (*Task, error) {
	var t Task
	if err := c.t.do(ctx, http.MethodGet, "/v1/tasks/"+url.PathEscape(id), nil, nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// ListTasks returns a page of the tenant's tasks, newest first.
func (c *Client) ListTasks(ctx context.Context, p ListTasksParams) (*TaskList, error) {
	q := url.Values{}
	if p.State != "" {
		q.Set("state", p.State)
	}
	if p.Limit > 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	if p.Cursor != "" {
		q.Set("cursor", p.Cursor)
	}
	if p.RootID != "" {
		q.Set("root_id", p.RootID)
	}
	var l TaskList
	if err := c.t.do(ctx, http.MethodGet, "/v1/tasks", q, nil, nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// CancelTask kills a queued or running task and returns it. A task that already
// ended answers 409 TASK_ALREADY_FINISHED.
func (c *Client) CancelTask(ctx context.Context, id string) (*Task, error) {
	var t Task
	if err := c.t.do(ctx, http.MethodPost, "/v1/tasks/"+url.PathEscape(id)+"/cancel", nil, nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// ResumeTask resumes a paused task: it goes back to its tenant's queue to run its
// next step, with its state and usage as they were. raise, when not nil, raises
// fields of its budget, each at most the plan's ceiling (more is a 400). The budget
// as raised and the tenant's quotas must have room for the task's next step: a 409
// RESUME_NEEDS_ROOM otherwise, whose Error.Body holds room_needed and limit_needed
// (raise that field to at least limit_needed). The task is admitted again against its
// tenant's concurrent sessions: a 429 when they are full. A task that is not paused
// is a 409 (TASK_NOT_PAUSED); a suspended tenant's a 403 (TENANT_SUSPENDED); one
// outside the key's scopes a 404. Refused, the task stays paused.
func (c *Client) ResumeTask(ctx context.Context, id string, raise *BudgetRequest) (*Task, error) {
	body := struct {
		Budget *BudgetRequest `json:"budget,omitempty"`
	}{raise}
	var t Task
	if err := c.t.do(ctx, http.MethodPost, "/v1/tasks/"+url.PathEscape(id)+"/resume", nil, nil, body, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// DefaultPollInterval is WaitTask's interval when it is given none.
const DefaultPollInterval = 500 * time.Millisecond

// WaitTask polls the task every pollEvery until it reaches a terminal state
// (completed, failed, killed, budget_exceeded, abandoned, expired) or is paused at a
// limit (StatePaused: it waits for a resume, which the caller may give with
// ResumeTask), and returns it.
//
// Answers that say "try again later" (429, 502, 503, 504) do not end the wait: the
// next poll comes after Retry-After, or pollEvery if that is longer. Any other error
// ends it. When ctx ends first, WaitTask returns the last task it saw (nil if none)
// with ctx's error.
func (c *Client) WaitTask(ctx context.Context, id string, pollEvery time.Duration) (*Task, error) {
	if pollEvery <= 0 {
		pollEvery = DefaultPollInterval
	}
	var last *Task
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return last, ctx.Err()
		case <-timer.C:
		}
		wait := pollEvery
		t, err := c.GetTask(ctx, id)
		switch {
		case err == nil:
			if t.Terminal() || t.State == StatePaused {
				return t, nil
			}
			last = t
		case ctx.Err() != nil:
			return last, ctx.Err()
		default:
			var ae *Error
			if !errors.As(err, &ae) || !retryable(ae.StatusCode) {
				return last, err
			}
			wait = max(wait, ae.RetryAfter)
		}
		timer.Reset(wait)
	}
}

func retryable(status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// Admin calls the admin API (/v1/admin) with an admin credential's token; what it may
// do is the credential's role's (a call outside it answers 403 ROLE_FORBIDDEN).
type Admin struct{ t transport }

// NewAdmin returns an admin client of the agentq server at baseURL that
// authenticates with adminToken: AGENTQ_ADMIN_TOKEN, a token of AGENTQ_ADMIN_TOKENS or
// a stored credential's.
func NewAdmin(baseURL, adminToken string, opts ...Option) *Admin {
	return &Admin{t: newTransport(baseURL, adminToken, opts)}
}

// String describes the admin client without its token.
func (a *Admin) String() string { return "agentq.Admin(" + a.t.base + ")" }

// GoString describes the admin client without its token.
func (a *Admin) GoString() string { return a.String() }

// CreateTenant creates a tenant (201). An id in use answers 409 CONFLICT.
func (a *Admin) CreateTenant(ctx context.Context, req CreateTenantRequest) (*Tenant, error) {
	var t Tenant
	if err := a.t.do(ctx, http.MethodPost, "/v1/admin/tenants", nil, nil, req, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// GetTenant returns a tenant.
func (a *Admin) GetTenant(ctx context.Context, id string) (*Tenant, error) {
	var t Tenant
	if err := a.t.do(ctx, http.MethodGet, "/v1/admin/tenants/"+url.PathEscape(id), nil, nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// ListTenants returns every tenant.
func (a *Admin) ListTenants(ctx context.Context) ([]Tenant, error) {
	var out struct {
		Tenants []Tenant `json:"tenants"`
	}
	if err := a.t.do(ctx, http.MethodGet, "/v1/admin/tenants", nil, nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Tenants, nil
}

// UpdateTenant changes a tenant's plan, weight, overrides, name or status.
func (a *Admin) UpdateTenant(ctx context.Context, id string, req UpdateTenantRequest) (*Tenant, error) {
	var t Tenant
	if err := a.t.do(ctx, http.MethodPatch, "/v1/admin/tenants/"+url.PathEscape(id), nil, nil, req, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// CreateKey creates an API key for a tenant (201). nil scopes allow every agent and
// user. The plaintext key is in the answer's Key, and nowhere else, ever.
func (a *Admin) CreateKey(ctx context.Context, tenantID string, scopes *Scopes) (*KeyCreated, error) {
	body := struct {
		Scopes *Scopes `json:"scopes,omitempty"`
	}{scopes}
	var k KeyCreated
	if err := a.t.do(ctx, http.MethodPost, "/v1/admin/tenants/"+url.PathEscape(tenantID)+"/keys", nil, nil, body, &k); err != nil {
		return nil, err
	}
	return &k, nil
}

// ListKeys returns a tenant's keys, revoked ones included; never a secret.
func (a *Admin) ListKeys(ctx context.Context, tenantID string) ([]APIKey, error) {
	var out struct {
		Keys []APIKey `json:"keys"`
	}
	if err := a.t.do(ctx, http.MethodGet, "/v1/admin/tenants/"+url.PathEscape(tenantID)+"/keys", nil, nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Keys, nil
}

// RotateKey gives a key a new secret, keeping its kid; the old secret stops working.
func (a *Admin) RotateKey(ctx context.Context, kid string) (*KeyCreated, error) {
	var k KeyCreated
	if err := a.t.do(ctx, http.MethodPost, "/v1/admin/keys/"+url.PathEscape(kid)+"/rotate", nil, nil, nil, &k); err != nil {
		return nil, err
	}
	return &k, nil
}

// RevokeKey revokes a key (204).
func (a *Admin) RevokeKey(ctx context.Context, kid string) error {
	return a.t.do(ctx, http.MethodDelete, "/v1/admin/keys/"+url.PathEscape(kid), nil, nil, nil, nil)
}

// ListPlans returns the plan catalogue.
func (a *Admin) ListPlans(ctx context.Context) ([]Plan, error) {
	var out struct {
		Plans []Plan `json:"plans"`
	}
	if err := a.t.do(ctx, http.MethodGet, "/v1/admin/plans", nil, nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Plans, nil
}

// MeterUsage is one meter's total in a usage export: steps, tokens or
// cost_micro_usd (integer micro-dollars; USD is the same in dollars, six decimals).
type MeterUsage struct {
	Meter    string `json:"meter"`
	Quantity int64  `json:"quantity"`
	USD      string `json:"usd,omitempty"`
}

// TenantUsage is one tenant's use in its billing period.
type TenantUsage struct {
	TenantID string `json:"tenant_id"`
	Plan     string `json:"plan"`
	PeriodID string `json:"period_id"`
	Period   struct {
		Start time.Time `json:"start"`
		End   time.Time `json:"end"`
	} `json:"period"`
	Meters     []MeterUsage     `json:"meters"`
	Rejections map[string]int64 `json:"rejections"`
}

// UsageExport is every tenant's use in its billing period starting in Period.
type UsageExport struct {
	Period  string        `json:"period"`
	Tenants []TenantUsage `json:"tenants"`
	Totals  []MeterUsage  `json:"totals"`
}

// UsageExport returns the usage export of period, a month "YYYY-MM": for each tenant,
// its billing period that starts in that month (in its zone, on its billing day), per
// meter. A malformed period answers 400.
func (a *Admin) UsageExport(ctx context.Context, period string) (*UsageExport, error) {
	var out UsageExport
	if err := a.t.do(ctx, http.MethodGet, "/v1/admin/usage", url.Values{"period": {period}}, nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// UsageExportCSV is UsageExport as the server's CSV (a header row, then a row per
// tenant and meter), byte for byte.
func (a *Admin) UsageExportCSV(ctx context.Context, period string) ([]byte, error) {
	var out []byte
	if err := a.t.do(ctx, http.MethodGet, "/v1/admin/usage", url.Values{"period": {period}, "format": {"csv"}}, nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// transport is what Client and Admin share: base URL, bearer token, HTTP client.
type transport struct {
	base         string
	token        string
	hc           *http.Client
	userAgent    string
	claimedActor string // X-Agentq-Actor
}

func newTransport(baseURL, token string, opts []Option) transport {
	t := transport{
		base:      strings.TrimRight(baseURL, "/"),
		token:     token,
		hc:        http.DefaultClient,
		userAgent: "agentq-go-client/" + Version,
	}
	for _, o := range opts {
		o(&t)
	}
	return t
}

// maxErrorBody bounds how much of an error answer is read.
const maxErrorBody = 1 << 20

// do sends one request. in, when not nil, is sent as JSON; out, when not nil,
// receives the 2xx answer's JSON.
func (t *transport) do(ctx context.Context, method, path string, query url.Values, h http.Header, in, out any) error {
	u := t.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("agentq: %s %s: encoding the request: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return t.wrap(method, path, err)
	}
	for k, vs := range h {
		req.Header[k] = vs
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if t.userAgent != "" {
		req.Header.Set("User-Agent", t.userAgent)
	}
	if t.token != "" {
		req.Header.Set("Authorization", "Bearer "+t.token)
	}
	setChangeHeaders(ctx, req, t.claimedActor)
	res, err := t.hc.Do(req)
	if err != nil {
		return t.wrap(method, path, err)
	}
	defer res.Body.Close()
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return t.apiError(method, path, res)
	}
	if out == nil || res.StatusCode == http.StatusNoContent {
		_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, maxErrorBody))
		return nil
	}
	if raw, ok := out.(*[]byte); ok {
		b, err := io.ReadAll(res.Body)
		if err != nil {
			return t.wrap(method, path, fmt.Errorf("reading the %d answer: %w", res.StatusCode, err))
		}
		*raw = b
		return nil
	}
	if err := json.NewDecoder(res.Body).Decode(out); err != nil {
		return t.wrap(method, path, fmt.Errorf("decoding the %d answer: %w", res.StatusCode, err))
	}
	return nil
}

// apiError builds the *Error of a non-2xx answer.
func (t *transport) apiError(method, path string, res *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(res.Body, maxErrorBody))
	e := &Error{StatusCode: res.StatusCode, Header: res.Header.Clone(), Method: method, Path: path, Body: raw}
	var env struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(raw, &env) == nil && len(env.Error) > 0 && env.Error[0] == '{' {
		var inner struct {
			Code              string   `json:"code"`
			Message           string   `json:"message"`
			LimitType         string   `json:"limit_type"`
			RetryAfterSeconds *float64 `json:"retry_after_seconds"`
		}
		if json.Unmarshal(env.Error, &inner) == nil {
			e.Body, e.Code, e.Message, e.LimitType = env.Error, inner.Code, inner.Message, inner.LimitType
			if inner.RetryAfterSeconds != nil && *inner.RetryAfterSeconds > 0 {
				e.RetryAfter = seconds(*inner.RetryAfterSeconds)
			}
		}
	}
	if d, ok := parseRetryAfter(res.Header.Get("Retry-After")); ok {
		e.RetryAfter = d
	}
	// A server never sends the credential back; if one (or something in between)
	// did, it still does not reach an error message.
	if t.token != "" {
		e.Message = strings.ReplaceAll(e.Message, t.token, "[REDACTED]")
		e.Body = bytes.ReplaceAll(e.Body, []byte(t.token), []byte("[REDACTED]"))
	}
	return e
}

func seconds(s float64) time.Duration {
	if s >= math.MaxInt64/float64(time.Second) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(math.Ceil(s * float64(time.Second)))
}

// parseRetryAfter reads Retry-After: delay-seconds or an HTTP date.
func parseRetryAfter(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		return seconds(float64(n)), true
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(time.Until(at), 0), true
	}
	return 0, false
}

// wrap annotates a transport error with the request, keeping the credential out of
// the message even if a lower layer put it there.
func (t *transport) wrap(method, path string, err error) error {
	if t.token != "" && strings.Contains(err.Error(), t.token) {
		err = &redactedError{msg: strings.ReplaceAll(err.Error(), t.token, "[REDACTED]"), err: err}
	}
	return fmt.Errorf("agentq: %s %s: %w", method, path, err)
}

// redactedError hides its cause's message but still answers errors.Is (e.g.
// context.DeadlineExceeded). It has no Unwrap, so the cause's text cannot leak.
type redactedError struct {
	msg string
	err error
}

func (r *redactedError) Error() string        { return r.msg }
func (r *redactedError) Is(target error) bool { return errors.Is(r.err, target) }

// Usage event types.
const (
	EventLimitHit         = "usage.limit_hit"
	EventApproachingLimit = "usage.approaching_limit"
	// EventLimitsChanged is a change to a tenant's limits; its data is
	// Event.LimitsChanged's, not Data.
	EventLimitsChanged = "tenant.limits_changed"
)

// Event is one usage event: a CloudEvent 1.0 in structured JSON, as the server
// stored it. Raw holds its exact bytes (to verify, store or forward them); ID is the
// idempotency key.
type Event struct {
	SpecVersion     string    `json:"specversion"`
	ID              string    `json:"id"`
	Source          string    `json:"source"`
	Type            string    `json:"type"`
	Subject         string    `json:"subject"` // the tenant id
	Time            time.Time `json:"time"`
	DataContentType string    `json:"datacontenttype"`
	Data            EventData `json:"data"`

	Raw json.RawMessage `json:"-"`
}

// UnmarshalJSON decodes the event and keeps its bytes in Raw.
func (e *Event) UnmarshalJSON(b []byte) error {
	type plain Event
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*e = Event(p)
	e.Raw = append(json.RawMessage(nil), b...)
	return nil
}

// EventData is the data of a usage event.
type EventData struct {
	TenantID     string `json:"tenant_id"`
	Plan         string `json:"plan"`
	LimitType    string `json:"limit_type"`
	LimitValue   Amount `json:"limit_value"`
	CurrentUsage Amount `json:"current_usage"`
	// Threshold is the percentage of a period quota reached (80, 90, 100); 0 for the
	// other limits.
	Threshold         int        `json:"threshold"`
	Period            *EventSpan `json:"period"` // period quotas
	Window            *EventSpan `json:"window"` // the other limits: the minute of the refusal
	Enforcement       string     `json:"enforcement"`
	RefusedBy         string     `json:"refused_by"` // "platform": the platform refused (degraded mode), not the plan
	UpgradeURL        string     `json:"upgrade_url"`
	SLAClassification string     `json:"sla_classification"`
}

// EventSpan is a period or window: [Start, End).
type EventSpan struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
}

// Amount is a limit or usage as the event carries it, as text: a count ("500"), or
// for USD a decimal string of dollars ("12.500000"), which no float has rounded.
type Amount string

// UnmarshalJSON reads a JSON number or string.
func (a *Amount) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*a = Amount(s)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return err
	}
	*a = Amount(n)
	return nil
}

// EventsQuery selects a page of a usage events feed.
type EventsQuery struct {
	Type  string // EventLimitHit, EventApproachingLimit; "" for both
	After string // a NextCursor of an earlier page; "" from the start
	Limit int    // 1..1000; 0 for the server's default (100)
}

func (q EventsQuery) values() url.Values {
	v := url.Values{}
	if q.Type != "" {
		v.Set("type", q.Type)
	}
	if q.After != "" {
		v.Set("after", q.After)
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	return v
}

// EventPage is a page of a usage events feed, oldest first. Pass NextCursor as After
// for the next page: reading from each page's NextCursor sees every event once, in
// order, while new ones arrive. On an empty page NextCursor is the After given.
type EventPage struct {
	Events     []Event `json:"events"`
	NextCursor string  `json:"next_cursor"`
}

// Events returns a page of the caller tenant's usage events (GET /v1/events).
func (c *Client) Events(ctx context.Context, q EventsQuery) (*EventPage, error) {
	var p EventPage
	if err := c.t.do(ctx, http.MethodGet, "/v1/events", q.values(), nil, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// AdminEventsQuery selects a page of the cross-tenant feed.
type AdminEventsQuery struct {
	EventsQuery
	Tenant string // only this tenant's events; "" for every tenant
}

// Events returns a page of every tenant's usage events, or one tenant's
// (GET /v1/admin/events).
func (a *Admin) Events(ctx context.Context, q AdminEventsQuery) (*EventPage, error) {
	v := q.values()
	if q.Tenant != "" {
		v.Set("tenant", q.Tenant)
	}
	var p EventPage
	if err := a.t.do(ctx, http.MethodGet, "/v1/admin/events", v, nil, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// CreateWebhookRequest is a new webhook endpoint.
type CreateWebhookRequest struct {
	URL   string   `json:"url"`   // absolute http or https
	Types []string `json:"types"` // EventLimitHit, EventApproachingLimit
	// Tenant limits the endpoint to one tenant's events; "" takes every tenant's.
	Tenant string `json:"tenant,omitempty"`
}

// Webhook is a webhook endpoint; its secret is shown only by CreateWebhook and
// RotateWebhookSecret.
type Webhook struct {
	ID     string   `json:"id"`
	URL    string   `json:"url"`
	Types  []string `json:"types"`
	Tenant *string  `json:"tenant"` // nil: every tenant
	// Owner is who registered it: "operator" (the admin API) or "tenant" (the
	// tenant's own, for its own events).
	Owner string `json:"owner"`
	// DisabledAt is set once the endpoint answered 410 Gone: it receives nothing more.
	DisabledAt     *time.Time `json:"disabled_at"`
	DisabledReason *string    `json:"disabled_reason"`
	// PreviousSecretExpiresAt is, after a rotation, until when the replaced secret
	// signs too.
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
	CreatedAt               time.Time  `json:"created_at"`
	UpdatedAt               time.Time  `json:"updated_at"`
}

// WebhookWithSecret is an endpoint with its new secret ("whsec_..."), which no other
// answer shows.
type WebhookWithSecret struct {
	Webhook
	Secret string `json:"secret"`
}

// WebhookAttempt is one request the relays sent to an endpoint.
type WebhookAttempt struct {
	ID          string    `json:"id"`
	EventID     string    `json:"event_id"`
	Attempt     int       `json:"attempt"`
	AttemptedAt time.Time `json:"attempted_at"`
	StatusCode  *int      `json:"status_code"` // nil: no answer
	Error       *string   `json:"error"`       // why there was no answer
	DurationMS  int64     `json:"duration_ms"`
	Result      string    `json:"result"` // succeeded, retrying, failed, gone
}

// WebhookAttemptsQuery selects a page of an endpoint's attempts, newest first.
type WebhookAttemptsQuery struct {
	After string // a NextCursor of an earlier page; "" from the newest
	Limit int    // 1..1000; 0 for the server's default (100)
}

// WebhookAttemptPage is a page of attempts; NextCursor is nil on the last page.
type WebhookAttemptPage struct {
	Attempts   []WebhookAttempt `json:"attempts"`
	NextCursor *string          `json:"next_cursor"`
}

// CreateWebhook creates a webhook endpoint (201) and returns it with its secret.
func (a *Admin) CreateWebhook(ctx context.Context, req CreateWebhookRequest) (*WebhookWithSecret, error) {
	var w WebhookWithSecret
	if err := a.t.do(ctx, http.MethodPost, "/v1/admin/webhooks", nil, nil, req, &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// ListWebhooks returns every webhook endpoint, disabled ones included.
func (a *Admin) ListWebhooks(ctx context.Context) ([]Webhook, error) {
	var out struct {
		Webhooks []Webhook `json:"webhooks"`
	}
	if err := a.t.do(ctx, http.MethodGet, "/v1/admin/webhooks", nil, nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Webhooks, nil
}

// GetWebhook returns a webhook endpoint.
func (a *Admin) GetWebhook(ctx context.Context, id string) (*Webhook, error) {
	var w Webhook
	if err := a.t.do(ctx, http.MethodGet, "/v1/admin/webhooks/"+url.PathEscape(id), nil, nil, nil, &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// DeleteWebhook deletes a webhook endpoint (204) with its pending deliveries.
func (a *Admin) DeleteWebhook(ctx context.Context, id string) error {
	return a.t.do(ctx, http.MethodDelete, "/v1/admin/webhooks/"+url.PathEscape(id), nil, nil, nil, nil)
}

// RotateWebhookSecret gives an endpoint a new secret and returns it; the replaced
// one signs too until PreviousSecretExpiresAt.
func (a *Admin) RotateWebhookSecret(ctx context.Context, id string) (*WebhookWithSecret, error) {
	var w WebhookWithSecret
	if err := a.t.do(ctx, http.MethodPost, "/v1/admin/webhooks/"+url.PathEscape(id)+"/rotate", nil, nil, nil, &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// CreateTenantWebhookRequest is an endpoint of the caller tenant's own, for its own
// events.
type CreateTenantWebhookRequest struct {
	URL   string   `json:"url"`   // absolute http or https
	Types []string `json:"types"` // EventLimitHit, EventApproachingLimit
}

// CreateWebhook registers an endpoint of the caller tenant's own (POST /v1/webhooks):
// it receives that tenant's events of its types, and its secret is shown only here.
// Past the plan's webhook_endpoints limit it is an *Error with StatusCode 402 and
// Code "QUOTA_EXCEEDED".
func (c *Client) CreateWebhook(ctx context.Context, req CreateTenantWebhookRequest) (*WebhookWithSecret, error) {
	var w WebhookWithSecret
	if err := c.t.do(ctx, http.MethodPost, "/v1/webhooks", nil, nil, req, &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// ListWebhooks returns the caller tenant's own endpoints, disabled ones included.
func (c *Client) ListWebhooks(ctx context.Context) ([]Webhook, error) {
	var out struct {
		Webhooks []Webhook `json:"webhooks"`
	}
	if err := c.t.do(ctx, http.MethodGet, "/v1/webhooks", nil, nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Webhooks, nil
}

// GetWebhook returns one of the caller tenant's own endpoints (404 for any other).
func (c *Client) GetWebhook(ctx context.Context, id string) (*Webhook, error) {
	var w Webhook
	if err := c.t.do(ctx, http.MethodGet, "/v1/webhooks/"+url.PathEscape(id), nil, nil, nil, &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// DeleteWebhook deletes one of the caller tenant's own endpoints (204).
func (c *Client) DeleteWebhook(ctx context.Context, id string) error {
	return c.t.do(ctx, http.MethodDelete, "/v1/webhooks/"+url.PathEscape(id), nil, nil, nil, nil)
}

// RotateWebhookSecret gives one of the caller tenant's own endpoints a new secret
// and returns it; the replaced one signs too until PreviousSecretExpiresAt.
func (c *Client) RotateWebhookSecret(ctx context.Context, id string) (*WebhookWithSecret, error) {
	var w WebhookWithSecret
	if err := c.t.do(ctx, http.MethodPost, "/v1/webhooks/"+url.PathEscape(id)+"/rotate", nil, nil, nil, &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// ListWebhookAttempts returns a page of the delivery attempts of one of the caller
// tenant's own endpoints, newest first (404 for any other endpoint).
func (c *Client) ListWebhookAttempts(ctx context.Context, id string, q WebhookAttemptsQuery) (*WebhookAttemptPage, error) {
	var p WebhookAttemptPage
	if err := c.t.do(ctx, http.MethodGet, "/v1/webhooks/"+url.PathEscape(id)+"/attempts", q.values(), nil, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

func (q WebhookAttemptsQuery) values() url.Values {
	v := url.Values{}
	if q.After != "" {
		v.Set("after", q.After)
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	return v
}

// ListWebhookAttempts returns a page of an endpoint's delivery attempts, newest first.
func (a *Admin) ListWebhookAttempts(ctx context.Context, id string, q WebhookAttemptsQuery) (*WebhookAttemptPage, error) {
	var p WebhookAttemptPage
	if err := a.t.do(ctx, http.MethodGet, "/v1/admin/webhooks/"+url.PathEscape(id)+"/attempts", q.values(), nil, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}
