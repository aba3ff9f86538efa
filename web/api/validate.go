package api

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
)

// Bounds on what a request may carry. Text that reaches Postgres or Redis must be valid
// UTF-8 without NUL (Postgres refuses both, and the refusal would be a 500 after limits
// were spent); identifiers also carry no control characters, so they stay printable in
// logs, key names and answers.
const (
	maxIdentifier  = 255  // agent, user, idempotency key, scope entry, path and query values
	maxQueryBytes  = 2048 // the whole raw query string
	maxHeaderBytes = 255  // each header the API reads (Idempotency-Key, Content-Type, X-Request-Id)
	maxJSONDepth   = 64   // nesting of arrays and objects in a body
)

// checkedHeaders are the request headers the API reads besides Authorization, which the
// auth middlewares check (a malformed one is a 401, like any bad key).
var checkedHeaders = []string{"Idempotency-Key", echo.HeaderContentType, echo.HeaderXRequestID}

// isControl tells the C0 controls, DEL and the C1 controls.
func isControl(r rune) bool { return r < 0x20 || (r >= 0x7f && r <= 0x9f) }

// identifierProblem says what is wrong with an identifier, or "" when it is fine: valid
// UTF-8, no control characters, at most max bytes.
func identifierProblem(s string, max int) string {
	switch {
	case len(s) > max:
		return "is longer than " + strconv.Itoa(max) + " bytes"
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case strings.ContainsFunc(s, isControl):
		return "contains a control character"
	}
	return ""
}

// checkIdentifier refuses an identifier field that is not printable text of at most
// max bytes; empty is left to the caller (some fields are optional).
func checkIdentifier(field, value string, max int) error {
	if p := identifierProblem(value, max); p != "" {
		return Errorf(http.StatusBadRequest, CodeInvalidRequest, "%s %s.", field, p)
	}
	return nil
}

// ValidateInput is the central check of what every request carries outside its body:
// path parameters, query parameters and the headers the API reads. It runs after
// routing (so path parameters are known) and before authentication, so a malformed
// request spends nothing. Bodies are checked where they are decoded (checkJSONText).
func ValidateInput(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		for i, v := range c.ParamValues() {
			name := "Path parameter"
			if names := c.ParamNames(); i < len(names) {
				name += " " + names[i]
			}
			if err := checkIdentifier(name, v, maxIdentifier); err != nil {
				return err
			}
			// echo may hand out the escaped form; what it stands for must pass too
			if u, err := url.PathUnescape(v); err == nil && u != v {
				if err := checkIdentifier(name, u, maxIdentifier); err != nil {
					return err
				}
			}
		}
		r := c.Request()
		if raw := r.URL.RawQuery; raw != "" {
			if len(raw) > maxQueryBytes {
				return Errorf(http.StatusBadRequest, CodeInvalidRequest, "The query string is longer than %d bytes.", maxQueryBytes)
			}
			q, err := url.ParseQuery(raw)
			if err != nil {
				return Errorf(http.StatusBadRequest, CodeInvalidRequest, "Malformed query string: %s.", queryProblem(err))
			}
			for k, vs := range q {
				if err := checkIdentifier("Query parameter name", k, maxIdentifier); err != nil {
					return err
				}
				for _, v := range vs {
					if err := checkIdentifier("Query parameter "+strconv.Quote(k), v, maxIdentifier); err != nil {
						return err
					}
				}
			}
		}
		for _, h := range checkedHeaders {
			for _, v := range r.Header.Values(h) {
				if err := checkIdentifier("Header "+h, v, maxHeaderBytes); err != nil {
					return err
				}
			}
		}
		return next(c)
	}
}

// queryProblem names what url.ParseQuery refused without echoing raw input.
func queryProblem(err error) string {
	if strings.Contains(err.Error(), "semicolon") {
		return "semicolons are not separators, use '&'"
	}
	return "invalid percent-escape"
}

// bearerToken extracts the token of an "Authorization: Bearer <token>" value. A value
// with control characters or invalid UTF-8 gives "" (the caller answers 401, as for
// any bad key): tokens are printable ASCII, so such a header is malformed, not a token
// to trim into shape.
func bearerToken(h string) string {
	if len(h) <= 7 || !strings.EqualFold(h[:7], "bearer ") || identifierProblem(h, 4096) != "" {
		return ""
	}
	return strings.Trim(h[7:], " ")
}

// checkJSONText refuses a body whose text Postgres or the decoder would mangle or
// refuse, before it is decoded (json.Unmarshal silently turns invalid UTF-8 and lone
// surrogates into U+FFFD, while json.RawMessage fields keep them as they are and
// Postgres then refuses the row): invalid UTF-8, the \u0000 escape, unpaired surrogate
// escapes, nesting deeper than maxJSONDepth, and numbers outside float64's range
// (Postgres numeric refuses some, and no client can read them back). Syntax errors are
// left to the decoder, which names them better.
func checkJSONText(body []byte) error {
	if !utf8.Valid(body) {
		return Errorf(http.StatusBadRequest, CodeInvalidJSON, "The request body is not valid UTF-8.")
	}
	depth := 0
	for i := 0; i < len(body); i++ {
		switch b := body[i]; {
		case b == '"':
			end, err := checkJSONString(body, i+1)
			if err != nil {
				return err
			}
			i = end
		case b == '[' || b == '{':
			if depth++; depth > maxJSONDepth {
				return Errorf(http.StatusBadRequest, CodeInvalidRequest, "The request body nests deeper than %d levels.", maxJSONDepth)
			}
		case b == ']' || b == '}':
			depth--
		case b == '-' || (b >= '0' && b <= '9'):
			j := i
			for j < len(body) && strings.IndexByte("+-.eE0123456789", body[j]) >= 0 {
				j++
			}
			if err := checkJSONNumber(string(body[i:j])); err != nil {
				return err
			}
			i = j - 1
		}
	}
	return nil
}

// checkJSONString checks the string whose content starts at body[i] and returns the
// index of its closing quote (or len(body) when unterminated: the decoder reports it).
func checkJSONString(body []byte, i int) (int, error) {
	for ; i < len(body); i++ {
		switch body[i] {
		case '"':
			return i, nil
		case '\\':
			if i+1 >= len(body) {
				return len(body), nil
			}
			i++
			if body[i] != 'u' {
				continue
			}
			r, ok := hex4(body, i+1)
			if !ok {
				continue // malformed escape: a syntax error the decoder reports
			}
			i += 4
			switch {
			case r == 0:
				return 0, Errorf(http.StatusBadRequest, CodeInvalidJSON, "The request body holds a NUL character (\\u0000), which no text field may contain.")
			case r >= 0xdc00 && r <= 0xdfff:
				return 0, loneSurrogate()
			case r >= 0xd800 && r <= 0xdbff:
				if i+2 >= len(body) || body[i+1] != '\\' || body[i+2] != 'u' {
					return 0, loneSurrogate()
				}
				lo, ok := hex4(body, i+3)
				if !ok || lo < 0xdc00 || lo > 0xdfff {
					return 0, loneSurrogate()
				}
				i += 6
			}
		}
	}
	return len(body), nil
}

func loneSurrogate() error {
	return Errorf(http.StatusBadRequest, CodeInvalidJSON, "The request body holds an unpaired UTF-16 surrogate escape, which is not a character.")
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[i:i+4]), 16, 32)
	return rune(n), err == nil
}

// checkJSONNumber refuses a number literal float64 cannot hold: one that overflows, or
// a non-zero one that underflows to zero.
func checkJSONNumber(lit string) error {
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil {
		if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
			return numberOutOfRange()
		}
		return nil // not a number after all: a syntax error the decoder reports
	}
	if f == 0 {
		mantissa, _, _ := strings.Cut(strings.ToLower(lit), "e")
		if strings.ContainsAny(mantissa, "123456789") {
			return numberOutOfRange()
		}
	}
	return nil
}

func numberOutOfRange() error {
	return Errorf(http.StatusBadRequest, CodeInvalidRequest, "The request body holds a number outside the range of a 64-bit float.")
}

// validate checks the identifiers of a submission (the body's text was checked before
// decoding).
func (r *SubmitRequest) validate() error {
	if err := checkIdentifier("Field agent", r.Agent, maxIdentifier); err != nil {
		return err
	}
	if err := checkIdentifier("Field user", r.User, maxIdentifier); err != nil {
		return err
	}
	return checkIdentifier("Field idempotency_key", r.IdempotencyKey, maxIdempotencyKey)
}
