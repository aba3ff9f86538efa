// Package operator is the operator view: server-rendered HTML under /panel/admin,
// behind a sign-in with any admin credential's token.
package operator

// The operator view reads its data from the operator service (internal/operator), and
// changes a tenant's status through the tenants service, for credentials whose role
// may (the admin API's role table, package api).
//
// Session: a signed, expiring cookie naming its credential, no server-side state
// (session.go). It is keyed by a key derived from the credential's token, so rotating
// or revoking the credential, or changing its token in the environment, ends its
// sessions. Logout clears the cookie; a copied cookie stays valid until its expiry
// (8 h) unless the credential changes. The cookie is HttpOnly, SameSite=Strict,
// Path=/panel/admin and always Secure: browsers keep Secure cookies from
// http://localhost and http://127.0.0.1 (secure contexts), anywhere else the view must
// be served over TLS.
//
// CSRF: every POST (login, logout, the writes) checks that Origin names this host
// (or, without Origin, that Sec-Fetch-Site says same-origin) and carries a token:
// before login a double-submit token (a random cookie the form repeats), after it a
// token derived from the session (HMAC of its id). Wrong tokens are limited per client
// address, in one bucket with the admin API's (package adminauth).

import (
	"bytes"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/internal/credentials"
	"github.com/agentq/agentq/internal/operator"
	"github.com/agentq/agentq/internal/sealed"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/web/internal/adminauth"
	"github.com/agentq/agentq/web/internal/numfmt"
)

//go:embed templates/operator*.html
var operatorTemplates embed.FS

//go:embed assets/operator.css assets/operator.js
var operatorAssets embed.FS

const (
	operatorPath        = "/panel/admin"
	operatorSessionName = "aq_op_session"
	operatorLoginName   = "aq_op_login" // the login form's double-submit CSRF token
	operatorSessionTTL  = 8 * time.Hour
	operatorLoginTTL    = time.Hour
	operatorFormBytes   = 8 << 10
)

var operatorTmpl = template.Must(template.New("operator").Funcs(template.FuncMap{
	"pct": func(f float64) string { return strconv.FormatFloat(f*100, 'f', 1, 64) + " %" },
	"frac": func(f float64) string {
		return strconv.FormatFloat(f, 'f', 4, 64)
	},
	"width": func(f float64) string { // a bar's width, 0..100
		return strconv.FormatFloat(math.Max(0, math.Min(100, f*100)), 'f', 1, 64)
	},
	"mark": func(f float64) string { // the entitlement mark's x, kept inside the bar
		return strconv.FormatFloat(math.Max(0, math.Min(98.5, f*100-0.75)), 'f', 1, 64)
	},
	"secs": func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) + " s" },
	"dur":  fmtWait,
	"mins": func(d time.Duration) string {
		if d%time.Minute == 0 {
			return strconv.FormatInt(int64(d/time.Minute), 10) + " min"
		}
		return d.String()
	},
	"when":  func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
	"count": func(n int64) string { return numfmt.GroupDigits(strconv.FormatInt(n, 10)) },
	"usd":   func(micro int64) string { return strconv.FormatFloat(float64(micro)/1e6, 'f', -1, 64) },
}).ParseFS(operatorTemplates, "templates/operator*.html"))

func fmtWait(d time.Duration) string {
	switch {
	case d == 0:
		return "0 s"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + " ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + " s"
	}
	return d.Round(time.Second).String()
}

// Deps are the operator view's collaborators.
type Deps struct {
	// AdminAuth resolves the sign-in's token to its credential, and the credential a
	// session names.
	AdminAuth *adminauth.Guard
	// Operator reads the view; nil: the view answers 503.
	Operator *operator.Service
	// Tenants makes the view's writes (a tenant's status); nil: they answer 503.
	Tenants *tenants.Service
	// Now is the sessions' clock (tests expire them); nil: time.Now.
	Now func() time.Time
}

// View is the operator view's handlers.
type View struct {
	Deps
	opAuth *operatorAuth
}

// New builds the operator view; Mount serves it.
func New(d Deps) *View {
	now := d.Now
	if now == nil {
		now = time.Now
	}
	return &View{Deps: d, opAuth: &operatorAuth{now: now}}
}

// Mount registers the view's routes on e.
func (s *View) Mount(e *echo.Echo) {
	e.GET(operatorPath, s.whenOn(s.operatorView))
	e.GET(operatorPath+"/login", s.whenOn(s.operatorLoginForm))
	e.POST(operatorPath+"/login", s.whenOn(s.operatorLogin))
	e.POST(operatorPath+"/logout", s.whenOn(s.operatorLogout))
	e.POST(operatorPath+"/tenants/:id/status", s.whenOn(s.tenantStatus))
	e.GET(operatorPath+"/assets/operator.css", s.operatorAsset("operator.css", "text/css; charset=utf-8"))
	e.GET(operatorPath+"/assets/operator.js", s.operatorAsset("operator.js", "text/javascript; charset=utf-8"))
}

func (s *View) operatorAsset(name, ctype string) echo.HandlerFunc {
	body, err := operatorAssets.ReadFile("assets/" + name)
	if err != nil {
		panic(err) // embedded at build time
	}
	return func(c echo.Context) error {
		h := c.Response().Header()
		h.Set("Cache-Control", "public, max-age=300")
		h.Set("X-Content-Type-Options", "nosniff")
		return c.Blob(http.StatusOK, ctype, body)
	}
}

// page renders an operator template with the view's security headers.
func (s *View) page(c echo.Context, status int, name string, data any) error {
	var buf bytes.Buffer
	if err := operatorTmpl.ExecuteTemplate(&buf, name, data); err != nil {
		return fmt.Errorf("operator view: render %s: %w", name, err)
	}
	h := c.Response().Header()
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; "+
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	return c.HTMLBlob(status, buf.Bytes())
}

// messagePage is a page that only says something (refusals, errors).
type messagePage struct {
	Title, Message string
	LoginLink      bool
}

func (s *View) operatorMessage(c echo.Context, status int, title, msg string, login bool) error {
	return s.page(c, status, "operator_message.html", messagePage{Title: title, Message: msg, LoginLink: login})
}

// whenOn serves h while admin access is on (some credential exists), else says the
// view is off, as the admin API refuses every request then.
func (s *View) whenOn(h echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		on, err := s.AdminAuth.On(c.Request().Context())
		if err != nil {
			return err
		}
		if !on {
			return s.operatorMessage(c, http.StatusUnauthorized, "Operator view off",
				"The operator view is off: no admin credential exists on this server (set AGENTQ_ADMIN_TOKEN or "+
					"AGENTQ_ADMIN_TOKENS, or create one with agentq admin credentials create).", false)
		}
		return h(c)
	}
}

func (s *View) setCookie(c echo.Context, name, value string, maxAge time.Duration) {
	ck := &http.Cookie{
		Name: name, Value: value, Path: operatorPath, HttpOnly: true, Secure: true,
		SameSite: http.SameSiteStrictMode, MaxAge: int(maxAge / time.Second),
	}
	if maxAge < 0 {
		ck.MaxAge = -1
	}
	c.SetCookie(ck)
}

func cookieValue(c echo.Context, name string) string {
	ck, err := c.Cookie(name)
	if err != nil {
		return ""
	}
	return ck.Value
}

// sameOrigin checks a POST comes from a page of this host: Origin names it, or,
// without Origin, Sec-Fetch-Site says same-origin. A request with neither is refused.
func sameOrigin(r *http.Request) bool {
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && strings.EqualFold(u.Host, r.Host)
	}
	return r.Header.Get("Sec-Fetch-Site") == "same-origin"
}

// operatorForm parses a small urlencoded form body.
func operatorForm(c echo.Context) (url.Values, error) {
	r := c.Request()
	r.Body = http.MaxBytesReader(c.Response(), r.Body, operatorFormBytes)
	if err := r.ParseForm(); err != nil {
		return nil, err
	}
	return r.PostForm, nil
}

type loginPage struct {
	CSRF  string
	Error string
}

func (s *View) loginForm(c echo.Context, status int, errMsg string) error {
	tok := make([]byte, 32)
	if _, err := rand.Read(tok); err != nil {
		return err
	}
	v := sealed.B64.EncodeToString(tok)
	s.setCookie(c, operatorLoginName, v, operatorLoginTTL)
	return s.page(c, status, "operator_login.html", loginPage{CSRF: v, Error: errMsg})
}

func (s *View) operatorLoginForm(c echo.Context) error {
	ss, err := s.session(c)
	if err != nil {
		return err
	}
	if ss != nil {
		return c.Redirect(http.StatusSeeOther, operatorPath)
	}
	return s.loginForm(c, http.StatusOK, "")
}

func (s *View) operatorLogin(c echo.Context) error {
	r := c.Request()
	if !sameOrigin(r) {
		return s.operatorMessage(c, http.StatusForbidden, "Refused", "This form must be sent from the operator view's own page (Origin check failed).", true)
	}
	form, err := operatorForm(c)
	if err != nil {
		return s.operatorMessage(c, http.StatusBadRequest, "Bad request", "The form could not be read.", true)
	}
	want := cookieValue(c, operatorLoginName)
	got := form.Get("csrf")
	if want == "" || got == "" || subtle.ConstantTimeCompare([]byte(want), []byte(got)) != 1 {
		return s.operatorMessage(c, http.StatusForbidden, "Refused", "The form's CSRF token is missing or does not match. Reload the sign-in page and try again.", true)
	}
	cred, ok, err := s.AdminAuth.Resolve(r.Context(), form.Get("token"))
	if err != nil {
		return err
	}
	a, err := s.AdminAuth.Attempt(r.Context(), r, ok)
	if err != nil {
		return err
	}
	if !a.Allowed {
		c.Response().Header().Set("Retry-After", strconv.FormatInt(adminauth.RetryAfter(a), 10))
		return s.operatorMessage(c, http.StatusTooManyRequests, "Too many attempts", "Too many wrong admin tokens from this address. Wait a few seconds and try again.", true)
	}
	if !ok {
		return s.loginForm(c, http.StatusUnauthorized, "Wrong admin token.")
	}
	v, err := s.opAuth.newSession(cred)
	if err != nil {
		return err
	}
	s.setCookie(c, operatorSessionName, v, operatorSessionTTL)
	s.setCookie(c, operatorLoginName, "", -1)
	return c.Redirect(http.StatusSeeOther, operatorPath)
}

func (s *View) operatorLogout(c echo.Context) error {
	if !sameOrigin(c.Request()) {
		return s.operatorMessage(c, http.StatusForbidden, "Refused", "This form must be sent from the operator view's own page (Origin check failed).", true)
	}
	form, err := operatorForm(c)
	if err != nil {
		return s.operatorMessage(c, http.StatusBadRequest, "Bad request", "The form could not be read.", true)
	}
	ss, err := s.session(c)
	if err != nil {
		return err
	}
	if ss != nil && !ss.csrfOK(form.Get("csrf")) {
		return s.operatorMessage(c, http.StatusForbidden, "Refused", "The form's CSRF token is missing or does not match.", true)
	}
	s.setCookie(c, operatorSessionName, "", -1)
	return c.Redirect(http.StatusSeeOther, operatorPath+"/login")
}

// column is a sortable column header.
type column struct {
	Key, Label, Href, AriaSort, Arrow string
	Num                               bool
}

type viewPage struct {
	operator.Overview
	// Who is signed in; CanWrite whether their role may change tenants (the forms
	// are shown only then, and the writes refuse the others).
	Who      credentials.Credential
	CanWrite bool
	CSRF     string
	Columns  []column
	Sort     string
	Dir      string
	SortKeys []column
}

var columnLabels = map[string]string{
	operator.SortTenant: "Tenant", operator.SortPlan: "Plan", operator.SortWeight: "Weight",
	operator.SortShare: "Share (worker-s)", operator.SortEntitlement: "Entitlement",
	operator.SortQueued: "Queued", operator.SortRunning: "Running", operator.SortP99: "p99 wait",
	operator.SortLimitHits: "Limit hits / refused (24 h)",
}

func (s *View) operatorView(c echo.Context) error {
	ss, err := s.session(c)
	if err != nil {
		return err
	}
	if ss == nil {
		return c.Redirect(http.StatusSeeOther, operatorPath+"/login")
	}
	q, err := operator.ParseQuery(c.QueryParam("sort"), c.QueryParam("dir"), c.QueryParam("tenant"))
	if errors.Is(err, operator.ErrBadQuery) {
		msg := strings.TrimPrefix(err.Error(), operator.ErrBadQuery.Error()+": ")
		return s.operatorMessage(c, http.StatusBadRequest, "Bad query", "Cannot show this view: "+msg+".", false)
	}
	if s.Operator == nil {
		return s.operatorMessage(c, http.StatusServiceUnavailable, "Unavailable", "The operator view has no data source on this server.", false)
	}
	ov, err := s.Operator.Overview(c.Request().Context(), q)
	if err != nil {
		return err
	}
	p := viewPage{Overview: ov, Who: ss.cred, CanWrite: mayWrite(ss.cred.Role), CSRF: ss.csrf(), Sort: q.Sort, Dir: "asc"}
	if q.Desc {
		p.Dir = "desc"
	}
	for _, k := range operator.SortKeys {
		col := column{Key: k, Label: columnLabels[k], Num: k != operator.SortTenant && k != operator.SortPlan}
		dir := "desc"
		if !col.Num {
			dir = "asc"
		}
		if k == q.Sort {
			col.AriaSort, col.Arrow = "ascending", "▲"
			dir = "desc"
			if q.Desc {
				col.AriaSort, col.Arrow, dir = "descending", "▼", "asc"
			}
		}
		v := url.Values{"sort": {k}, "dir": {dir}}
		if q.Tenant != "" {
			v.Set("tenant", q.Tenant)
		}
		col.Href = operatorPath + "?" + v.Encode()
		p.Columns = append(p.Columns, col)
	}
	return s.page(c, http.StatusOK, "operator.html", p)
}
