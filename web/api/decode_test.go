package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/web/internal/webtest"
)

func TestDecodeStrict(t *testing.T) {
	cases := []struct {
		name, body string
		status     int
		code       string
	}{
		{"ok", `{"agent":"sim"}`, 0, ""},
		{"empty", ``, 400, CodeInvalidJSON},
		{"malformed", `{"agent":`, 400, CodeInvalidJSON},
		{"unknown field", `{"agent":"sim","bogus":1}`, 400, CodeInvalidRequest},
		{"wrong type", `{"agent":7}`, 400, CodeInvalidRequest},
		{"two values", `{"agent":"sim"}{"agent":"sim"}`, 400, CodeInvalidJSON},
		{"trailing junk", `{"agent":"sim"} x`, 400, CodeInvalidJSON},
		{"array", `[1]`, 400, CodeInvalidRequest},
	}
	for _, c := range cases {
		var req SubmitRequest
		err := decodeStrict([]byte(c.body), &req, false)
		if c.status == 0 {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		var ae *APIError
		if !errors.As(err, &ae) || ae.Status != c.status || ae.Code != c.code {
			t.Errorf("%s: err = %v, want %d %s", c.name, err, c.status, c.code)
		}
	}
}

func TestCheckJSONText(t *testing.T) {
	cases := []struct {
		name, body string
		code       string // "" = accepted
	}{
		{"plain", `{"a":"b","n":[1,-2.5e3,0,0.0,1e-300]}`, ""},
		{"surrogate pair", `{"a":"\ud83d\ude00"}`, ""},
		{"escaped backslash before u0000", `{"a":"\\u0000"}`, ""},
		{"newline and tab in free text", `{"a":"x\ny\tz"}`, ""},
		{"quote escapes", `{"a":"\"\\\"","b":"\u0041"}`, ""},
		{"U+FFFD itself", `{"a":"\ufffd` + "\xef\xbf\xbd" + `"}`, ""},
		{"depth at the limit", strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth), ""},
		{"NUL escape", `{"a":"\u0000"}`, CodeInvalidJSON},
		{"NUL escape after an escaped backslash", `{"a":"\\\u0000"}`, CodeInvalidJSON},
		{"NUL escape in a key", `{"\u0000":1}`, CodeInvalidJSON},
		{"lone high surrogate", `{"a":"\ud800"}`, CodeInvalidJSON},
		{"lone high surrogate at the end", `"\udbff`, CodeInvalidJSON},
		{"lone low surrogate", `{"a":"\udc00"}`, CodeInvalidJSON},
		{"two high surrogates", `{"a":"\ud800\ud800"}`, CodeInvalidJSON},
		{"invalid UTF-8", "{\"a\":\"\xff\"}", CodeInvalidJSON},
		{"encoded surrogate", "{\"a\":\"\xed\xa0\x80\"}", CodeInvalidJSON},
		{"too deep", strings.Repeat("[", maxJSONDepth+1) + strings.Repeat("]", maxJSONDepth+1), CodeInvalidRequest},
		{"overflowing number", `{"n":1e309}`, CodeInvalidRequest},
		{"underflowing number", `{"n":-1e-400}`, CodeInvalidRequest},
		{"long digit string", `{"n":` + strings.Repeat("9", 400) + `}`, CodeInvalidRequest},
	}
	for _, c := range cases {
		err := checkJSONText([]byte(c.body))
		if c.code == "" {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		var ae *APIError
		if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Code != c.code {
			t.Errorf("%s: err = %v, want 400 %s", c.name, err, c.code)
		}
	}
}

// cleanText fails the test if a decoded value holds a NUL, or a U+FFFD that the raw
// body did not spell (json.Unmarshal writes U+FFFD for invalid UTF-8 and lone
// surrogates, so such a U+FFFD means one was accepted).
func cleanText(t *testing.T, body []byte, v any) {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("re-encoding an accepted value: %v", err)
	}
	var tree any
	if err := json.Unmarshal(raw, &tree); err != nil {
		t.Fatal(err)
	}
	spelled := bytes.Contains(body, []byte("\xef\xbf\xbd")) || bytes.Contains(bytes.ToLower(body), []byte(`\ufffd`))
	var walk func(any)
	check := func(s string) {
		if strings.ContainsRune(s, 0) {
			t.Fatalf("accepted %q holds a NUL: %q", body, s)
		}
		if strings.ContainsRune(s, utf8.RuneError) && !spelled {
			t.Fatalf("accepted %q decodes to a replacement character: %q", body, s)
		}
	}
	walk = func(n any) {
		switch n := n.(type) {
		case string:
			check(n)
		case []any:
			for _, e := range n {
				walk(e)
			}
		case map[string]any:
			for k, e := range n {
				check(k)
				walk(e)
			}
		}
	}
	walk(tree)
}

// FuzzDecodeSubmit: any body either decodes or yields a 400 with the documented body;
// never a panic or another status. What is accepted is valid UTF-8 without NUL or lone
// surrogates, anywhere (input included), and its identifiers pass validate or are
// refused by it with a 400.
func FuzzDecodeSubmit(f *testing.F) {
	for _, s := range []string{
		`{"agent":"sim","input":{"steps":3}}`, `{"agent":`, `{}`, `null`, `[]`, `{"priority":1e400}`,
		`{"budget":{"max_steps":"x"}}`, `{"agent":"sim"} {}`, "\xff", `{"agent":"a","input":{"x":"\u0000"}}`,
		`{"agent":"a","input":["\ud800"]}`, `{"agent":"a","user":"\u0001"}`, `{"agent":"a","input":{"n":1e-999}}`,
		`{"agent":"a","input":"\ud83d\ude00"}`, "{\"agent\":\"a\",\"input\":\"\xc0\x80\"}", `{"agent":"a","input":[[[[[[[[[[]]]]]]]]]]}`,
		`{"agent":"a","start_within_s":-1}`, `{"agent":"a","start_within_s":"1"}`, `{"agent":"a","start_within_s":1e-400}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req SubmitRequest
		err := decodeStrict(body, &req, false)
		if err == nil {
			if !utf8.Valid(body) {
				t.Fatalf("accepted invalid UTF-8: %q", body)
			}
			if len(req.Input) > 0 && !json.Valid(req.Input) {
				t.Fatalf("accepted input is not JSON: %q", req.Input)
			}
			cleanText(t, body, req)
			var in any
			if len(req.Input) > 0 {
				if err := json.Unmarshal(req.Input, &in); err != nil {
					t.Fatal(err)
				}
				cleanText(t, body, in)
			}
			err = req.validate()
			if err == nil {
				for _, s := range []string{req.Agent, req.User, req.IdempotencyKey} {
					if identifierProblem(s, maxIdentifier) != "" {
						t.Fatalf("validate accepted identifier %q", s)
					}
				}
				return
			}
		}
		var ae *APIError
		if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Code == "" || strings.TrimSpace(ae.Message) == "" {
			t.Fatalf("decodeStrict(%q) = %v, want a 400 APIError", body, err)
		}
	})
}

// FuzzDecodeAdminBodies: the admin API's bodies decode or give a 400, and what decodes
// holds no NUL or replaced character.
func FuzzDecodeAdminBodies(f *testing.F) {
	for _, s := range []string{
		`{"id":"acme","name":"Acme","plan":"pro","weight":2,"overrides":{"tenant_rate":5}}`,
		`{"scopes":{"agents":["sim"],"principals":["u1"]}}`, `{"url":"http://x/","headers":{"A":"b"},"step_timeout_s":3}`,
		`{"name":"\u0000"}`, `{"scopes":{"agents":["\udfff"]}}`, `{"headers":{"A":"` + "\xff" + `"}}`, `{"weight":1e999}`,
		`{"url":"http://127.0.0.1:9/hook","types":["usage.limit_hit"],"tenant":"acme"}`, `{"types":"usage.limit_hit"}`,
		`{"types":["\ud800"]}`, `{"tenant":"\u0000"}`, `{"url":"http://x/","types":[1]}`,
		`{"tokens_per_minute":120000,"burst_tokens":6000,"requests_per_minute":600}`, `{"tokens_per_minute":1e400}`,
		`{"burst_tokens":-1.5}`, `{"pool":"llm","tokens_per_step":1000}`, `{"pool":"\u0000","tokens_per_step":"1"}`,
		`{"budget":{"max_cost_usd":0.2}}`, `{"budget":{"max_steps":1e400}}`, `{"budget":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, dst := range []any{&TenantRequest{}, &KeyRequest{}, &AgentRequest{}, &WebhookRequest{}, &PoolRequest{}, &AgentPoolRequest{}, &ResumeRequest{}} {
			err := decodeStrict(body, dst, true)
			if err == nil {
				cleanText(t, body, dst)
				continue
			}
			var ae *APIError
			if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Code == "" || strings.TrimSpace(ae.Message) == "" {
				t.Fatalf("decodeStrict(%q, %T) = %v, want a 400 APIError", body, dst, err)
			}
		}
	})
}

// FuzzValidateInput drives the central request check with arbitrary path parameters,
// query strings and headers: the answer is the handler's 200 or a 400 with the error
// body, never a 5xx or a panic, and the handler only ever sees printable identifiers.
func FuzzValidateInput(f *testing.F) {
	f.Add("acme", "state=queued&limit=5", "k1", "application/json")
	f.Add("%00", "x=%00", "a\tb", "application/json")
	f.Add("\xff", "%ff=1", "\xc3", "text/plain; \x85")
	f.Add(strings.Repeat("a", 300), "a=%zz;b", strings.Repeat("k", 300), "")
	f.Add("a%2Fb", "q=%E2%82", "", "\x7f")
	e := echo.New()
	e.HTTPErrorHandler = ErrorHandler(webtest.Quiet())
	e.Use(ValidateInput)
	e.GET("/x/:id", func(c echo.Context) error {
		vals := []string{c.Param("id"), c.Request().Header.Get("Idempotency-Key"), c.Request().Header.Get("Content-Type")}
		for k, vs := range c.QueryParams() {
			vals = append(append(vals, k), vs...)
		}
		for _, v := range vals {
			if p := identifierProblem(v, maxIdentifier); p != "" {
				return fmt.Errorf("the handler saw %q, which %s", v, p)
			}
		}
		return c.NoContent(http.StatusOK)
	})
	f.Fuzz(func(t *testing.T, id, query, idem, ctype string) {
		req := &http.Request{
			Method: http.MethodGet, URL: &url.URL{Path: "/x/" + id, RawQuery: query},
			Header: http.Header{"Idempotency-Key": {idem}, "Content-Type": {ctype}}, Body: http.NoBody,
		}
		req = req.WithContext(context.Background())
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK:
		case http.StatusBadRequest, http.StatusNotFound:
			var eb struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil || eb.Error.Code == "" || eb.Error.Message == "" || !utf8.Valid(rec.Body.Bytes()) {
				t.Fatalf("%d answer %q is not the error body", rec.Code, rec.Body.Bytes())
			}
		default:
			t.Fatalf("id %q query %q idem %q type %q: %d %s", id, query, idem, ctype, rec.Code, rec.Body.Bytes())
		}
	})
}
