package web

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/web/api"
)

// openapiOp is the part of an OpenAPI operation the tests look at.
type openapiOp struct {
	OperationID string                     `json:"operationId"`
	Parameters  []map[string]any           `json:"parameters"`
	Responses   map[string]json.RawMessage `json:"responses"`
	Security    *[]map[string][]string     `json:"security"`
}

type openapiDocument struct {
	OpenAPI    string                                `json:"openapi"`
	Paths      map[string]map[string]json.RawMessage `json:"paths"`
	Components struct {
		Parameters      map[string]map[string]any `json:"parameters"`
		SecuritySchemes map[string]map[string]any `json:"securitySchemes"`
	} `json:"components"`
}

// httpMethods are the keys of an OpenAPI path item that are operations.
var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

func testServer(t *testing.T) *Server {
	t.Helper()
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	return New(Deps{Plans: plans})
}

func parseOpenAPI(t *testing.T) openapiDocument {
	t.Helper()
	var doc openapiDocument
	dec := json.NewDecoder(bytes.NewReader(api.OpenAPI()))
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("web/api/openapi.json does not parse: %v", err)
	}
	if dec.More() {
		t.Fatal("web/api/openapi.json holds more than one JSON value")
	}
	return doc
}

var echoParam = regexp.MustCompile(`:([A-Za-z0-9_]+)`)

// openapiPath turns echo's /tasks/:id into OpenAPI's /tasks/{id}.
func openapiPath(p string) string { return echoParam.ReplaceAllString(p, "{$1}") }

// isEchoInternal reports whether r is a catch-all route that echo adds for a group
// with middleware (so the middleware runs for unknown paths under the prefix).
func isEchoInternal(r *echo.Route, groupPrefixes map[string]bool) bool {
	if r.Method == echo.RouteNotFound {
		return true
	}
	fromEcho := strings.HasPrefix(r.Name, "github.com/labstack/echo/")
	return fromEcho && (strings.HasSuffix(r.Path, "/*") || groupPrefixes[r.Path])
}

// registeredRoutes is the set of "METHOD /path" the router serves, in OpenAPI form.
func registeredRoutes(s *Server) map[string]bool {
	routes := s.Echo().Routes()
	prefixes := map[string]bool{}
	for _, r := range routes {
		if p, ok := strings.CutSuffix(r.Path, "/*"); ok && p != "" {
			prefixes[p] = true
		}
	}
	out := map[string]bool{}
	for _, r := range routes {
		if isEchoInternal(r, prefixes) {
			continue
		}
		out[r.Method+" "+openapiPath(r.Path)] = true
	}
	return out
}

func documentedRoutes(t *testing.T, doc openapiDocument) map[string]openapiOp {
	t.Helper()
	out := map[string]openapiOp{}
	for path, item := range doc.Paths {
		for key, raw := range item {
			if !slices.Contains(httpMethods, key) {
				continue // summary, description, parameters, servers...
			}
			var op openapiOp
			if err := json.Unmarshal(raw, &op); err != nil {
				t.Fatalf("%s %s: %v", key, path, err)
			}
			out[strings.ToUpper(key)+" "+path] = op
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// TestOpenAPIMatchesRoutes fails when a route is added without documenting it, or
// the document names an operation the router does not serve.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	s := testServer(t)
	doc := parseOpenAPI(t)
	served := registeredRoutes(s)
	documented := documentedRoutes(t, doc)

	if len(served) == 0 {
		t.Fatal("the router registers no route; the walk over Echo().Routes() is broken")
	}
	for _, r := range sortedKeys(served) {
		if _, ok := documented[r]; !ok {
			t.Errorf("route %s is registered by the server but missing from web/api/openapi.json", r)
		}
	}
	for _, r := range sortedKeys(documented) {
		if !served[r] {
			t.Errorf("web/api/openapi.json documents %s, which the server does not register", r)
		}
	}
}

func TestOpenAPIDocumentIsWellFormed(t *testing.T) {
	doc := parseOpenAPI(t)
	if !strings.HasPrefix(doc.OpenAPI, "3.1") {
		t.Errorf("openapi = %q, want 3.1.x", doc.OpenAPI)
	}
	for _, name := range []string{"tenantKey", "adminToken"} {
		sc, ok := doc.Components.SecuritySchemes[name]
		if !ok || sc["type"] != "http" || sc["scheme"] != "bearer" {
			t.Errorf("security scheme %s = %v, want an http bearer scheme", name, sc)
		}
	}

	ops := documentedRoutes(t, doc)
	if len(ops) == 0 {
		t.Fatal("the document has no operation")
	}
	ids := map[string]string{}
	pathParam := regexp.MustCompile(`\{([^}]+)\}`)
	for _, route := range sortedKeys(ops) {
		op := ops[route]
		if op.OperationID == "" {
			t.Errorf("%s has no operationId", route)
		} else if prev, dup := ids[op.OperationID]; dup {
			t.Errorf("%s and %s share operationId %q", prev, route, op.OperationID)
		} else {
			ids[op.OperationID] = route
		}

		// HTML form posts answer with a redirect (post/redirect/get): a 303 is their
		// success.
		path := strings.SplitN(route, " ", 2)[1]
		has2xx := false
		for code := range op.Responses {
			if len(code) == 3 && (code[0] == '2' || (code == "303" && strings.HasPrefix(path, "/panel/"))) {
				has2xx = true
			}
		}
		if !has2xx {
			t.Errorf("%s has no 2xx response", route)
		}

		if strings.HasPrefix(path, "/v1/") {
			if op.Security == nil || len(*op.Security) == 0 {
				t.Errorf("%s is under /v1 but names no security requirement", route)
			}
			if _, ok := op.Responses["401"]; !ok {
				t.Errorf("%s is authenticated but documents no 401", route)
			}
		}

		// Every {param} of the path is declared as a required path parameter.
		declared := map[string]bool{}
		for _, p := range op.Parameters {
			if ref, ok := p["$ref"].(string); ok {
				name, _ := strings.CutPrefix(ref, "#/components/parameters/")
				resolved, ok := doc.Components.Parameters[name]
				if !ok {
					t.Errorf("%s: parameter %s does not resolve", route, ref)
					continue
				}
				p = resolved
			}
			if p["in"] == "path" && p["required"] == true {
				declared[p["name"].(string)] = true
			}
		}
		for _, m := range pathParam.FindAllStringSubmatch(path, -1) {
			if !declared[m[1]] {
				t.Errorf("%s: path parameter %q is not declared as a required path parameter", route, m[1])
			}
		}
	}
}

// TestOpenAPIMapping pins the route-matching helpers, so a mistake in them cannot make
// TestOpenAPIMatchesRoutes pass vacuously.
func TestOpenAPIMapping(t *testing.T) {
	if got := openapiPath("/v1/tenants/:id/keys/:kid"); got != "/v1/tenants/{id}/keys/{kid}" {
		t.Errorf("openapiPath = %q", got)
	}
	s := testServer(t)
	before := registeredRoutes(s)
	s.Echo().GET("/v1/undocumented-probe", func(c echo.Context) error { return nil })
	after := registeredRoutes(s)
	if !after["GET /v1/undocumented-probe"] || len(after) != len(before)+1 {
		t.Fatalf("a newly registered route is not seen by the check: before %d routes, after %d", len(before), len(after))
	}
	documented := documentedRoutes(t, parseOpenAPI(t))
	if _, ok := documented["GET /v1/undocumented-probe"]; ok {
		t.Fatal("probe route unexpectedly documented")
	}
	for _, want := range []string{"POST /v1/tasks", "GET /v1/tasks/{id}", "DELETE /v1/admin/keys/{kid}"} {
		if !before[want] {
			t.Errorf("registered routes lack %s: %v", want, sortedKeys(before))
		}
	}
	for r := range before {
		if strings.HasSuffix(r, "/*") || strings.HasPrefix(r, echo.RouteNotFound) {
			t.Errorf("echo-internal route %s was not filtered", r)
		}
	}
}

func TestOpenAPIServed(t *testing.T) {
	s := testServer(t)
	req := httptest.NewRequest(http.MethodGet, "/openapi.json", nil)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	res := rec.Result()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /openapi.json = %d, want 200", res.StatusCode)
	}
	if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(body, api.OpenAPI()) {
		t.Errorf("served document (%d bytes) differs from the embedded one (%d bytes)", len(body), len(api.OpenAPI()))
	}
	if !json.Valid(body) {
		t.Error("served document is not valid JSON")
	}
}
