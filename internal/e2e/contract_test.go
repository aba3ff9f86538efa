package e2e_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/agentq/agentq/web/api"
)

// TestMain checks every answer the suite's requests to an agentq process get against
// the OpenAPI document the process serves: the requests of the harness, of the client
// package and of plain net/http calls all go through http.DefaultClient.
func TestMain(m *testing.M) {
	c, err := newContract(api.OpenAPI())
	if err != nil {
		fmt.Fprintln(os.Stderr, "the served OpenAPI document does not load:", err)
		os.Exit(1)
	}
	contractCheck = c
	http.DefaultClient.Transport = c
	os.Exit(m.Run())
}

// contractCheck is the suite's checker; each process a test starts registers its
// address with it.
var contractCheck *contract

// contract is an http.RoundTripper that checks the answers of the agentq processes
// registered with it against the OpenAPI document, reporting each mismatch as an
// error of the test that started the process. Requests are not checked: the bad-input
// tests send invalid ones on purpose.
//
// An answer of a documented status is checked against its documented headers and
// body. An error answer (4xx, 5xx) passes whenever its body has one of the error
// shapes the document names anywhere, documented for that operation and status or
// not: an error a route may give is the server's to choose, the shape is the contract.
// A page (the panel, the approval form) answers its documented errors as pages.
// Bodies other than JSON (event streams, pages, CSV) are checked for a documented
// media type only: a stream is never read here.
type contract struct {
	router    routers.Router
	bodies    *bodySchemas
	errShapes []string // the JSON pointers of the error bodies' schemas

	mu    sync.Mutex
	hosts map[string]*testing.T
}

func newContract(raw []byte) (*contract, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(raw)
	if err != nil {
		return nil, err
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("invalid: %w", err)
	}
	// The processes listen on random ports: match the paths whatever the host.
	doc.Servers = nil
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, err
	}
	bodies, err := newBodySchemas(raw)
	if err != nil {
		return nil, err
	}
	c := &contract{router: router, bodies: bodies, hosts: map[string]*testing.T{}}
	c.errShapes = errorShapes(doc)
	if len(c.errShapes) == 0 {
		return nil, errors.New("the document names no error body")
	}
	for _, ptr := range c.errShapes {
		if _, err := bodies.at(ptr); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// bodySchemas compiles the document's body schemas as the JSON Schema 2020-12 they
// are in OpenAPI 3.1 (kin-openapi validates a schema with references under OpenAPI
// 3.0 rules, where a schema without a type refuses null), once each.
type bodySchemas struct {
	mu       sync.Mutex
	compiler *jsonschema.Compiler
	compiled map[string]*jsonschema.Schema
}

const docURL = "file:///openapi.json"

func newBodySchemas(raw []byte) (*bodySchemas, error) {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource(docURL, v); err != nil {
		return nil, err
	}
	return &bodySchemas{compiler: c, compiled: map[string]*jsonschema.Schema{}}, nil
}

// at is the schema at ptr (a JSON pointer into the document, "#/...").
func (b *bodySchemas) at(ptr string) (*jsonschema.Schema, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s, ok := b.compiled[ptr]; ok {
		return s, nil
	}
	s, err := b.compiler.Compile(docURL + ptr)
	if err != nil {
		return nil, fmt.Errorf("compiling %s: %w", ptr, err)
	}
	b.compiled[ptr] = s
	return s, nil
}

// check validates the JSON body data against the schema at ptr.
func (b *bodySchemas) check(ptr string, data []byte) error {
	s, err := b.at(ptr)
	if err != nil {
		return err
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("the body %s is not JSON: %w", truncate(data), err)
	}
	return s.Validate(v)
}

// pointer escapes one JSON pointer token.
func pointer(tokens ...string) string {
	r := strings.NewReplacer("~", "~0", "/", "~1")
	var sb strings.Builder
	sb.WriteString("#")
	for _, t := range tokens {
		sb.WriteString("/" + r.Replace(t))
	}
	return sb.String()
}

// jsonSchemaOf is the pointer of the application/json schema of a documented
// answer: of the component it refers to, or of the operation's own.
func jsonSchemaOf(r *openapi3.ResponseRef, opPath ...string) (string, bool) {
	if r == nil || r.Value == nil {
		return "", false
	}
	var key string
	for k, mt := range r.Value.Content {
		if mt != nil && mt.Schema != nil && isJSONType(k) {
			key = k
		}
	}
	if key == "" {
		return "", false
	}
	if name, ok := strings.CutPrefix(r.Ref, "#/components/responses/"); ok {
		return pointer("components", "responses", name, "content", key, "schema"), true
	}
	return pointer(append(opPath, "content", key, "schema")...), true
}

// errorShapes are the distinct JSON schemas of the document's 4xx and 5xx answers,
// as pointers.
func errorShapes(doc *openapi3.T) []string {
	seen := map[string]bool{}
	var out []string
	add := func(r *openapi3.ResponseRef, opPath ...string) {
		ptr, ok := jsonSchemaOf(r, opPath...)
		if !ok {
			return
		}
		mt := r.Value.Content.Get("application/json")
		if mt != nil && mt.Schema != nil && mt.Schema.Ref != "" {
			ptr = mt.Schema.Ref
		}
		if !seen[ptr] {
			seen[ptr] = true
			out = append(out, ptr)
		}
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			for code, r := range op.Responses.Map() {
				if len(code) == 3 && (code[0] == '4' || code[0] == '5') {
					add(r, "paths", path, strings.ToLower(method), "responses", code)
				}
			}
		}
	}
	for _, r := range doc.Components.Responses {
		add(r)
	}
	sort.Strings(out)
	return out
}

// watch checks the answers of the process at base for t until t ends.
func (c *contract) watch(t *testing.T, base string) {
	host := strings.TrimPrefix(base, "http://")
	c.mu.Lock()
	c.hosts[host] = t
	c.mu.Unlock()
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.hosts[host] == t {
			delete(c.hosts, host)
		}
	})
}

func (c *contract) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	c.mu.Lock()
	_, watched := c.hosts[req.URL.Host]
	c.mu.Unlock()
	if !watched {
		return resp, nil
	}
	if problem := c.check(req, resp); problem != nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		// Reported only while the test that started the process runs.
		if t := c.hosts[req.URL.Host]; t != nil {
			t.Errorf("OpenAPI: %s %s answered %d, which the served document does not describe: %v",
				req.Method, req.URL.RequestURI(), resp.StatusCode, problem)
		}
	}
	return resp, nil
}

// check tells how resp departs from the document; nil when it does not.
func (c *contract) check(req *http.Request, resp *http.Response) error {
	if req.Method == http.MethodHead {
		return nil
	}
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		if resp.StatusCode >= 400 { // an unknown route or method: the documented error body
			return c.checkError(resp)
		}
		return fmt.Errorf("no documented operation: %w", err)
	}
	code, r := documentedAnswer(route.Operation, resp.StatusCode)
	if r == nil {
		if resp.StatusCode >= 400 {
			return c.checkError(resp)
		}
		return fmt.Errorf("status %d is not documented for this operation", resp.StatusCode)
	}
	// The documented headers.
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 resp.StatusCode, Header: resp.Header,
		Options: &openapi3filter.Options{ExcludeResponseBody: true, MultiError: true},
	}
	if err := openapi3filter.ValidateResponse(req.Context(), in); err != nil {
		return err
	}
	if resp.StatusCode >= 400 && (isJSON(resp) || checkMediaType(r, resp) != nil) {
		return c.checkError(resp)
	}
	if err := checkMediaType(r, resp); err != nil || !isJSON(resp) {
		return err // a page's error (HTML) is as documented for its status
	}
	ptr, ok := jsonSchemaOf(r, "paths", route.Path, strings.ToLower(route.Method), "responses", code)
	if !ok {
		return nil
	}
	data, err := readBack(resp)
	if err != nil {
		return err
	}
	if err := c.bodies.check(ptr, data); err != nil {
		return fmt.Errorf("the body %s does not match %s: %w", truncate(data), ptr, err)
	}
	return nil
}

// documentedAnswer is the operation's answer for status and its key ("201",
// "2XX", "default"); nil when it documents none.
func documentedAnswer(op *openapi3.Operation, status int) (string, *openapi3.ResponseRef) {
	for _, code := range []string{strconv.Itoa(status), strconv.Itoa(status/100) + "XX", "default"} {
		if r := op.Responses.Value(code); r != nil {
			return code, r
		}
	}
	return "", nil
}

// checkMediaType fails when resp has a body of a media type its documented answer
// does not list.
func checkMediaType(r *openapi3.ResponseRef, resp *http.Response) error {
	if r.Value == nil || len(r.Value.Content) == 0 || resp.ContentLength == 0 {
		return nil
	}
	ct := resp.Header.Get("Content-Type")
	if r.Value.Content.Get(ct) == nil {
		return fmt.Errorf("media type %q is not documented (documented: %s)", ct, strings.Join(mediaTypes(r.Value.Content), ", "))
	}
	return nil
}

func mediaTypes(c openapi3.Content) []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkError fails unless resp is a JSON body of one of the documented error shapes.
func (c *contract) checkError(resp *http.Response) error {
	if !isJSON(resp) {
		return fmt.Errorf("an error answer of media type %q, not the documented JSON error body", resp.Header.Get("Content-Type"))
	}
	data, err := readBack(resp)
	if err != nil {
		return err
	}
	var errs []string
	for _, ptr := range c.errShapes {
		err := c.bodies.check(ptr, data)
		if err == nil {
			return nil
		}
		errs = append(errs, ptr+": "+err.Error())
	}
	return fmt.Errorf("the error body %s has none of the documented error shapes: %s", truncate(data), strings.Join(errs, "; "))
}

func isJSON(resp *http.Response) bool { return isJSONType(resp.Header.Get("Content-Type")) }

func isJSONType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// readBack reads resp's body and puts it back for the caller.
func readBack(resp *http.Response) ([]byte, error) {
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("reading the body: %w", err)
	}
	return data, nil
}

func truncate(b []byte) string {
	if len(b) > 300 {
		return strconv.Quote(string(b[:300])) + "..."
	}
	return strconv.Quote(string(b))
}

// TestContractCheckCatchesWhatTheDocumentDoesNotSay runs the checker on answers
// made up here: a field the schema does not list, a status the operation does not
// document, an unknown route that answers 200 fail; an error of any documented shape
// passes on any route, whatever its status and code.
func TestContractCheckCatchesWhatTheDocumentDoesNotSay(t *testing.T) {
	plan := `{"name":"free","weight":1,"limits":{},"budget":{"default":{"max_steps":1,"max_wallclock_s":1,"max_cost_usd":1},"ceiling":{"max_steps":1,"max_wallclock_s":1,"max_cost_usd":1}},` +
		`"tree":{"default":{"max_tasks":1,"max_depth":0,"max_steps":1,"max_tokens":1,"max_cost_usd":1},` +
		`"ceiling":{"max_tasks":1,"max_depth":0,"max_steps":1,"max_tokens":1,"max_cost_usd":1}},"max_repeat_steps":10,` +
		`"sla":{"start_within_s":"unlimited","pool_wait_within_s":"unlimited"}}`
	answer := func(method, path string, status int, body string) error {
		req, err := http.NewRequest(method, "http://127.0.0.1:1"+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp := &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body))}
		return contractCheck.check(req, resp)
	}
	for _, c := range []struct {
		name         string
		method, path string
		status       int
		body         string
		ok           bool
	}{
		{"documented plans", "GET", "/v1/admin/plans", 200, `{"plans":[` + plan + `]}`, true},
		{"an undocumented field", "GET", "/v1/admin/plans", 200, `{"plans":[` + strings.Replace(plan, `"weight"`, `"surprise":1,"weight"`, 1) + `]}`, false},
		{"a required field missing", "GET", "/v1/admin/plans", 200, `{"plans":[` + strings.Replace(plan, `"weight":1,`, ``, 1) + `]}`, false},
		{"an undocumented success status", "GET", "/v1/admin/plans", 206, `{"plans":[]}`, false},
		{"an unknown route's success", "GET", "/v1/nowhere", 200, `{}`, false},
		{"an error of a new code and status", "POST", "/v1/tasks/0191d5c8-3fb0-7a8e-9b4e-1c2d3e4f5a6b/resume", 418,
			`{"error":{"code":"SOMETHING_NEW","message":"m","extra":1}}`, true},
		{"an unknown route's error", "GET", "/v1/nowhere", 404, `{"error":{"code":"NOT_FOUND","message":"m"}}`, true},
		{"an error of no documented shape", "GET", "/v1/admin/plans", 500, `{"message":"m"}`, false},
	} {
		err := answer(c.method, c.path, c.status, c.body)
		if (err == nil) != c.ok {
			t.Errorf("%s: check = %v, want ok=%v", c.name, err, c.ok)
		}
	}
}
