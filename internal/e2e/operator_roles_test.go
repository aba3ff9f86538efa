package e2e_test

import (
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
)

// opClient signs in to a process's operator view and sends its forms, as a browser
// on the same origin does (the Secure session cookie is carried by hand: the test
// speaks plain HTTP).
type opClient struct {
	h       *harness
	session *http.Cookie
}

func (o *opClient) send(method, path string, form url.Values, cookies ...*http.Cookie) (*http.Response, string) {
	o.h.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, _ := http.NewRequest(method, o.h.base+path, body)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", o.h.base)
	}
	for _, c := range append(cookies, o.session) {
		if c != nil {
			req.AddCookie(c)
		}
	}
	client := &http.Client{Transport: http.DefaultClient.Transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		o.h.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp, string(raw)
}

func cookieNamed(resp *http.Response, name string) *http.Cookie {
	for _, c := range resp.Cookies() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// signIn signs in with token and keeps the session.
func (o *opClient) signIn(token string) {
	o.h.t.Helper()
	resp, _ := o.send("GET", "/panel/admin/login", nil)
	csrf := cookieNamed(resp, "aq_op_login")
	resp, _ = o.send("POST", "/panel/admin/login", url.Values{"token": {token}, "csrf": {csrf.Value}}, csrf)
	if o.session = cookieNamed(resp, "aq_op_session"); resp.StatusCode != http.StatusSeeOther || o.session == nil {
		o.h.t.Fatalf("sign-in: %d", resp.StatusCode)
	}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// view loads the overview: its status, body and the session's CSRF token.
func (o *opClient) view() (int, string, string) {
	o.h.t.Helper()
	resp, body := o.send("GET", "/panel/admin", nil)
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		return resp.StatusCode, body, ""
	}
	return resp.StatusCode, body, m[1]
}

// setStatus sends the view's suspend/reactivate form for tenant.
func (o *opClient) setStatus(tenant, status, csrf string) (int, string) {
	resp, body := o.send("POST", "/panel/admin/tenants/"+tenant+"/status", url.Values{"status": {status}, "csrf": {csrf}})
	return resp.StatusCode, body
}

func (h *harness) tenantStatus(id string) string {
	var tn struct{ Status string }
	if st, _ := h.do("GET", "/v1/admin/tenants/"+id, h.admin, nil, &tn); st != http.StatusOK {
		h.t.Fatalf("tenant %s: %d", id, st)
	}
	return tn.Status
}

// A viewer signs in to the operator view, sees who it is, is shown no write and is
// refused one; an operator suspends a tenant from the view. Revoking or rotating a
// credential ends its sessions.
func TestOperatorViewFollowsTheCredentialsRole(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	h, creds := roleCredentials(t, newEnv(t), &logs)
	if st, _ := h.do("POST", "/v1/admin/tenants", h.admin, `{"id":"acme","plan":"pro"}`, nil); st != http.StatusCreated {
		t.Fatalf("tenant: %d", st)
	}
	viewer, operator := creds[len(creds)-1], creds[len(creds)-3] // stored-viewer, stored-operator
	v := &opClient{h: h}
	v.signIn(viewer.token)
	st, body, csrf := v.view()
	if st != http.StatusOK || !strings.Contains(body, "Signed in as <strong>stored-viewer</strong>") || !strings.Contains(body, `data-role="viewer"`) ||
		strings.Contains(body, "/panel/admin/tenants/acme/status") || csrf == "" {
		t.Fatalf("the viewer's view: %d, name and role shown %v, write form shown %v", st,
			strings.Contains(body, "stored-viewer"), strings.Contains(body, "/status"))
	}
	if st, body := v.setStatus("acme", "suspended", csrf); st != http.StatusForbidden || !strings.Contains(body, "viewer") || h.tenantStatus("acme") != "active" {
		t.Fatalf("the viewer's write: %d, tenant %s", st, h.tenantStatus("acme"))
	}

	o := &opClient{h: h}
	o.signIn(operator.token)
	st, body, ocsrf := o.view()
	if st != http.StatusOK || !strings.Contains(body, "Signed in as <strong>stored-operator</strong>") || !strings.Contains(body, "/panel/admin/tenants/acme/status") {
		t.Fatalf("the operator's view: %d, write form shown %v", st, strings.Contains(body, "/status"))
	}
	if st, _ := o.setStatus("acme", "suspended", csrf); st != http.StatusForbidden {
		t.Fatalf("the operator's write with the viewer's CSRF token: %d", st)
	}
	if st, _ := o.setStatus("acme", "suspended", ocsrf); st != http.StatusSeeOther || h.tenantStatus("acme") != "suspended" {
		t.Fatalf("the operator's write: %d, tenant %s", st, h.tenantStatus("acme"))
	}

	// Revoking ends the viewer's session, rotating the operator's.
	if st, _ := h.do("DELETE", "/v1/admin/credentials/"+viewer.name, h.admin, nil, nil); st != http.StatusNoContent {
		t.Fatalf("revoke: %d", st)
	}
	if st, _ := h.do("POST", "/v1/admin/credentials/"+operator.name+"/rotate", h.admin, nil, nil); st != http.StatusOK {
		t.Fatalf("rotate: %d", st)
	}
	for _, c := range []*opClient{v, o} {
		if resp, _ := c.send("GET", "/panel/admin", nil); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/panel/admin/login" {
			t.Errorf("a session of a changed credential: %d to %q, want the sign-in", resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	if st, _ := o.setStatus("acme", "active", ocsrf); st != http.StatusSeeOther || h.tenantStatus("acme") != "suspended" {
		t.Errorf("a write with a rotated credential's session: %d, tenant %s", st, h.tenantStatus("acme"))
	}
	for _, c := range creds {
		if strings.Contains(logs.String(), c.token) {
			t.Errorf("the log holds %s's token", c.name)
		}
	}
}
