package web

import (
	"errors"
	"net/http"
	"strings"
	"testing"
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

// FuzzDecodeSubmit: any body either decodes or yields a 400 with the documented body;
// never a panic or another status.
func FuzzDecodeSubmit(f *testing.F) {
	for _, s := range []string{
		`{"agent":"sim","input":{"steps":3}}`, `{"agent":`, `{}`, `null`, `[]`, `{"priority":1e400}`,
		`{"budget":{"max_steps":"x"}}`, `{"agent":"sim"} {}`, "\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req SubmitRequest
		err := decodeStrict(body, &req, false)
		if err == nil {
			return
		}
		var ae *APIError
		if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Code == "" || strings.TrimSpace(ae.Message) == "" {
			t.Fatalf("decodeStrict(%q) = %v, want a 400 APIError", body, err)
		}
	})
}
