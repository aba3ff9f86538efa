package panel

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/approval"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/web/api"
)

// The approval page of a paused task: GET /approve?token= shows whoever holds the
// link (sent in the pause's usage.limit_hit event) what the task is, why it paused in
// words, its budget and the plan's ceiling, the raise its next step needs with a
// suggested one, when the link expires and what approving does; POST /approve?token=
// with the budget fields to raise (each at least its current value, at most the
// ceiling) resumes it as the API's resume does. The token is the credential and
// names the tenant, the task and the pause (approval package): a forged one is 401,
// an expired one 403, one whose pause is over (the task resumed, ended or was paused
// again) 409.

// approvalView is what the approval page shows: the task, why it paused in words,
// its budget beside the plan's ceiling, the raise that lets it run its next step (and
// a suggested one), when the link expires and what approving does.
type approvalView struct {
	Status  int
	Message string
	Done    bool // the task was resumed by this request
	Token   string
	Task    tasks.Task
	CostUSD string
	Budget  quotas.TaskBudget
	Ceiling quotas.TaskBudget
	// Why is the pause in words ("its cost budget: $0.04 of $0.05 spent; ..."),
	// Quota set when it is a tenant's quota, which no raise here lifts.
	Why   string
	Quota bool
	// Field is the budget field the raise is for, AtLeast the least value that lets
	// the next step run and Suggest the value the form offers (both in the field's
	// unit, as the form takes them); Room says whether the ceiling allows AtLeast.
	Field            string
	AtLeast, Suggest string
	Room             bool
	// Label, AtLeastText and SuggestText say the same in words ("cost budget",
	// "$0.06", "$0.10").
	Label, AtLeastText, SuggestText string
	// BudgetCost and CeilingCost are the cost cap and its ceiling in dollars.
	BudgetCost, CeilingCost string
	Expires                 string // when the link expires, in words
	ExpiresAt               string // the same, RFC 3339
}

// approvalClaims checks the request's token; on failure it has answered.
func (s *Panel) approvalClaims(c echo.Context) (approval.Claims, bool, error) {
	tok := c.QueryParam("token")
	if s.Approvals == nil {
		return approval.Claims{}, false, s.approvalError(c, http.StatusNotFound, "Approval links are not served here.")
	}
	claims, err := s.Approvals.Verify(tok)
	switch {
	case errors.Is(err, approval.ErrExpired):
		return claims, false, s.approvalError(c, http.StatusForbidden, "This approval link has expired: the task's pause timed out.")
	case err != nil:
		return claims, false, s.approvalError(c, http.StatusUnauthorized, "This approval link is not valid.")
	}
	return claims, true, nil
}

// approvalTask reads the task a link is for, with its budget and the plan's ceiling.
func (s *Panel) approvalTask(c echo.Context, cl approval.Claims) (approvalView, error) {
	ctx := c.Request().Context()
	v := approvalView{Status: http.StatusOK, Token: c.QueryParam("token")}
	t, err := s.Tasks.Get(ctx, cl.TenantID, cl.TaskID)
	if err != nil {
		return v, err
	}
	tenant, err := s.Tenants.Get(ctx, cl.TenantID)
	if err != nil {
		return v, err
	}
	pol, err := s.Tenants.Policy(tenant)
	if err != nil {
		return v, err
	}
	v.Task, v.Ceiling, v.CostUSD = t, pol.Budget.Ceiling, quotas.FormatUSD(float64(t.Usage.CostMicroUSD)/1e6)
	v.Budget = tasks.StoredBudget(pol.Budget, t.Budget)
	v.BudgetCost, v.CeilingCost = quotas.FormatUSD(v.Budget.MaxCostUSD), quotas.FormatUSD(v.Ceiling.MaxCostUSD)
	v.Expires, v.ExpiresAt = expiresIn(cl.Expires, time.Now()), cl.Expires.UTC().Format(time.RFC3339)
	if t.Pause.Reason != nil && t.Pause.Limit != nil && t.Pause.Used != nil {
		v.explainPause(t)
	}
	return v, nil
}

// explainPause fills what the page says of the pause of t: why, in words, and the
// raise that lets its next step run.
func (v *approvalView) explainPause(t tasks.Task) {
	stop := quotas.Stop{LimitType: *t.Pause.Reason, Limit: *t.Pause.Limit, Used: *t.Pause.Used}
	sf := quotas.ShortfallAt(stop, tasks.PausedNext(t.Task))
	v.Why = sf.Explain()
	v.Field = quotas.Field(sf.LimitType)
	if v.Field == "" {
		v.Quota = true
		return
	}
	ceil := ceilingOf(v.Ceiling, sf.LimitType)
	at := quotas.AmountValue(sf.LimitType, sf.AtLeast)
	v.Room = at <= ceil
	// Twice the limit, within the ceiling, leaves room for more than one step.
	suggest := min(ceil, max(at, 2*quotas.AmountValue(sf.LimitType, sf.Limit)))
	v.AtLeast, v.Suggest = formValue(at), formValue(suggest)
	v.AtLeastText, v.SuggestText = fieldWords(sf.LimitType, at), fieldWords(sf.LimitType, suggest)
	v.Label = map[string]string{quotas.TaskMaxCostUSD: "cost budget", quotas.TaskMaxSteps: "step budget",
		quotas.TaskMaxWallclock: "wall-clock budget"}[sf.LimitType]
}

// fieldWords is a value of a budget field in words: "$0.06", "21 steps", "90 s".
func fieldWords(limitType string, v float64) string {
	switch limitType {
	case quotas.TaskMaxCostUSD:
		return quotas.FormatUSD(v)
	case quotas.TaskMaxSteps:
		return quotas.FormatAmount(limitType, int64(v))
	}
	return formValue(v) + " s"
}

// ceilingOf is the plan's ceiling of a budget limit, in the form's unit.
func ceilingOf(c quotas.TaskBudget, limitType string) float64 {
	switch limitType {
	case quotas.TaskMaxSteps:
		return float64(c.MaxSteps)
	case quotas.TaskMaxCostUSD:
		return c.MaxCostUSD
	}
	return c.MaxWallclockS
}

// formValue is a number as the form takes it.
func formValue(f float64) string { return strconv.FormatFloat(math.Round(f*1e6)/1e6, 'f', -1, 64) }

// expiresIn is when a link expires, in words: "2026-12-08 05:00 UTC, in 23 h 59 min".
func expiresIn(at, now time.Time) string {
	d := at.Sub(now).Round(time.Minute)
	left := "now"
	switch {
	case d >= time.Hour:
		left = fmt.Sprintf("in %d h %d min", int(d.Hours()), int(d.Minutes())%60)
	case d > 0:
		left = fmt.Sprintf("in %d min", int(d.Minutes()))
	}
	return at.UTC().Format("2006-01-02 15:04 UTC") + ", " + left
}

func (s *Panel) approvalPage(c echo.Context) error {
	cl, ok, err := s.approvalClaims(c)
	if !ok {
		return err
	}
	v, err := s.approvalTask(c, cl)
	if err != nil {
		return s.approvalFailed(c, err)
	}
	if v.Task.State != agentqtype.TaskStatePaused || v.Task.Pause.Count != cl.Pause {
		v.Status, v.Message = http.StatusConflict, "This pause is over: the task is "+string(v.Task.State)+" now."
	}
	return s.renderApproval(c, v)
}

func (s *Panel) approve(c echo.Context) error {
	cl, ok, err := s.approvalClaims(c)
	if !ok {
		return err
	}
	req, err := approvalBudget(c)
	if err != nil {
		return s.approvalError(c, http.StatusBadRequest, err.Error()+".")
	}
	// The link is the authority: the raise is recorded as its.
	ctx := agentqtype.WithActor(c.Request().Context(), agentqtype.Actor{Kind: agentqtype.ActorLink,
		Name: "approval:" + cl.TaskID.String(), RequestID: c.Response().Header().Get(echo.HeaderXRequestID)})
	_, err = s.Tasks.Resume(ctx, tasks.ResumeParams{
		TenantID: cl.TenantID, ID: cl.TaskID, Budget: req, Pause: cl.Pause, RaiseOnly: true})
	if err != nil {
		return s.approvalRefused(c, cl, err)
	}
	v, err := s.approvalTask(c, cl)
	if err != nil {
		return s.approvalFailed(c, err)
	}
	v.Done, v.Message = true, "Approved: the task's budget is raised and it is queued to run its next step."
	return s.renderApproval(c, v)
}

// approvalBudget reads the form's budget fields: empty ones keep the task's value.
func approvalBudget(c echo.Context) (*tasks.BudgetRequest, error) {
	var req tasks.BudgetRequest
	given := false
	num := func(name string) (*float64, error) {
		v := strings.TrimSpace(c.FormValue(name))
		if v == "" {
			return nil, nil
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, errors.New(name + " must be a number")
		}
		given = true
		return &f, nil
	}
	var err error
	if req.MaxWallclockS, err = num("max_wallclock_s"); err != nil {
		return nil, err
	}
	if req.MaxCostUSD, err = num("max_cost_usd"); err != nil {
		return nil, err
	}
	steps, err := num("max_steps")
	if err != nil {
		return nil, err
	}
	if steps != nil {
		if *steps != float64(int(*steps)) {
			return nil, errors.New("max_steps must be a whole number")
		}
		n := int(*steps)
		req.MaxSteps = &n
	}
	if !given {
		return nil, nil
	}
	return &req, nil
}

// approvalRefused answers an approval the task service refused (a lower value, a
// raise short of the room the next step needs, a suspended tenant, a pause that is
// over) as the API would, on the page with the task and the form again.
func (s *Panel) approvalRefused(c echo.Context, cl approval.Claims, err error) error {
	var ae *api.APIError
	if !errors.As(s.API.TaskError(err), &ae) {
		return s.approvalFailed(c, err)
	}
	v, rerr := s.approvalTask(c, cl)
	if rerr != nil {
		return s.approvalFailed(c, err)
	}
	v.Status, v.Message = ae.Status, ae.Message
	return s.renderApproval(c, v)
}

// approvalFailed answers a resume or a read that failed, as the API would, on a page.
func (s *Panel) approvalFailed(c echo.Context, err error) error {
	var ae *api.APIError
	if !errors.As(s.API.TaskError(err), &ae) {
		if errors.Is(err, agentqtype.ErrNotFound) {
			return s.approvalError(c, http.StatusNotFound, "The task is gone.")
		}
		s.log.Error("approval: failed", "err", err)
		return s.approvalError(c, http.StatusServiceUnavailable, "The approval cannot be made right now. Retry in a moment.")
	}
	return s.approvalError(c, ae.Status, ae.Message)
}

func (s *Panel) approvalError(c echo.Context, status int, msg string) error {
	return s.renderApproval(c, approvalView{Status: status, Message: msg})
}

func (s *Panel) renderApproval(c echo.Context, v approvalView) error {
	h := c.Response().Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	h.Set(echo.HeaderCacheControl, "no-store")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set(echo.HeaderXContentTypeOptions, "nosniff")
	var b strings.Builder
	if err := panelTmpl.ExecuteTemplate(&b, "approve.html", v); err != nil {
		return err
	}
	return c.HTML(v.Status, b.String())
}
