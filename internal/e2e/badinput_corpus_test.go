package e2e_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// hostile is one request of the bad-input corpus. path and header values go on the
// wire byte for byte (the request is written to a raw TCP connection, since Go's
// client refuses to send most of them).
type hostile struct {
	name   string
	method string
	path   string
	auth   string            // "key" (the tenant's key), "admin", "" (none) or a literal Authorization value
	header map[string]string // extra headers, raw
	body   string
	status int
	code   string // the error code; "" with status 400 means Go's HTTP server refuses the request before the API sees it
}

const (
	nul     = `\u0000`
	badUTF8 = "\xff\xfe"
)

// corpus builds the hostile requests. task is the id of a finished task of the
// tenant, kid its key's id.
func corpus(task, kid string) []hostile {
	long := strings.Repeat("a", 256)
	huge := strings.Repeat("a", 5000)
	deep := strings.Repeat("[", 20000) + strings.Repeat("]", 20000)
	const inv, nf, un = 400, 404, 401
	const ir, ij, nfc, ua = "INVALID_REQUEST", "INVALID_JSON", "NOT_FOUND", "UNAUTHORIZED"
	sub := func(name, body string, status int, code string) hostile {
		return hostile{name: "submit: " + name, method: "POST", path: "/v1/tasks", auth: "key", body: body, status: status, code: code}
	}
	var cs []hostile
	cs = append(cs,
		// POST /v1/tasks: strings anywhere in the body.
		sub("NUL in agent", `{"agent":"sim`+nul+`"}`, inv, ij),
		sub("NUL in http agent input", `{"agent":"echo","input":{"prompt":"a`+nul+`b"}}`, inv, ij),
		sub("NUL nested deep in input", `{"agent":"echo","input":{"a":[1,{"b":["x","`+nul+`"]}]}}`, inv, ij),
		sub("NUL in an input object key", `{"agent":"echo","input":{"k`+nul+`":1}}`, inv, ij),
		sub("NUL as the whole input", `{"agent":"echo","input":"`+nul+`"}`, inv, ij),
		sub("escaped NUL spelled in upper case", `{"agent":"echo","input":{"p":"\U0000"}}`, inv, ij),
		sub("lone high surrogate in input", `{"agent":"echo","input":{"p":"\ud800"}}`, inv, ij),
		sub("lone low surrogate in input", `{"agent":"echo","input":{"p":"\udc00x"}}`, inv, ij),
		sub("high surrogate followed by a non-surrogate", `{"agent":"echo","input":{"p":"\ud800\u0041"}}`, inv, ij),
		sub("invalid UTF-8 in input", `{"agent":"echo","input":{"p":"`+badUTF8+`"}}`, inv, ij),
		sub("invalid UTF-8 in input key", `{"agent":"echo","input":{"`+badUTF8+`":1}}`, inv, ij),
		sub("overlong UTF-8 encoding of NUL", `{"agent":"echo","input":{"p":"\xc0\x80"}}`, inv, ij),
		sub("UTF-8 encoded surrogate", `{"agent":"echo","input":{"p":"\xed\xa0\x80"}}`, inv, ij),
		sub("truncated UTF-8 sequence", `{"agent":"echo","input":{"p":"\xe2\x82"}}`, inv, ij),
		sub("invalid UTF-8 in agent", `{"agent":"sim`+badUTF8+`"}`, inv, ij),
		sub("invalid UTF-8 in user", `{"agent":"sim","user":"`+badUTF8+`"}`, inv, ij),
		sub("invalid UTF-8 in idempotency key", `{"agent":"sim","idempotency_key":"`+badUTF8+`"}`, inv, ij),
		sub("invalid UTF-8 outside strings", "{\"agent\":\"sim\"}\xff", inv, ij),
		sub("raw NUL byte in a string", "{\"agent\":\"sim\x00\"}", inv, ij),
		sub("raw NUL byte between tokens", "{\"agent\":\x00\"sim\"}", inv, ij),
		sub("UTF-16 body", "\xff\xfe{\x00}\x00", inv, ij),
		sub("UTF-8 BOM", "\xef\xbb\xbf{\"agent\":\"sim\"}", inv, ij),
		sub("NUL in user", `{"agent":"sim","user":"u`+nul+`"}`, inv, ij),
		sub("control character in user", `{"agent":"sim","user":"u\u0001"}`, inv, ir),
		sub("newline in user", `{"agent":"sim","user":"u\n1"}`, inv, ir),
		sub("DEL in user", `{"agent":"sim","user":"u\u007f"}`, inv, ir),
		sub("C1 control in user", `{"agent":"sim","user":"u\u0085"}`, inv, ir),
		sub("overlong user", `{"agent":"sim","user":"`+long+`"}`, inv, ir),
		sub("tab in agent", `{"agent":"sim\t"}`, inv, ir),
		sub("control character in agent", `{"agent":"\u001bsim"}`, inv, ir),
		sub("overlong agent", `{"agent":"`+long+`"}`, inv, ir),
		sub("NUL in idempotency key", `{"agent":"sim","idempotency_key":"k`+nul+`"}`, inv, ij),
		sub("control character in idempotency key", `{"agent":"sim","idempotency_key":"k\r\n"}`, inv, ir),
		sub("overlong idempotency key", `{"agent":"sim","idempotency_key":"`+long+`"}`, inv, ir),
		sub("nesting deeper than the decoder allows", `{"agent":"echo","input":`+deep+`}`, inv, ir),
		sub("nesting beyond the limit", `{"agent":"echo","input":`+strings.Repeat("[", 64)+strings.Repeat("]", 64)+`}`, inv, ir),
		sub("number beyond numeric", `{"agent":"echo","input":{"n":1e1000000}}`, inv, ir),
		sub("number with a huge negative exponent", `{"agent":"echo","input":{"n":1e-1000000}}`, inv, ir),
		sub("huge integer priority", `{"agent":"sim","priority":1e400}`, inv, ir),
		sub("NUL in an unknown field name", `{"agent":"sim","x`+nul+`":1}`, inv, ij),
		sub("unknown field in budget", `{"agent":"sim","budget":{"max_steps":1,"evil":1}}`, inv, ir),
		sub("string budget", `{"agent":"sim","budget":"`+nul+`"}`, inv, ij),
		sub("zero start_within_s", `{"agent":"sim","start_within_s":0}`, inv, ir),
		sub("negative start_within_s", `{"agent":"sim","start_within_s":-30}`, inv, ir),
		sub("start_within_s over 7 days", `{"agent":"sim","start_within_s":604801}`, inv, ir),
		sub("start_within_s as a string", `{"agent":"sim","start_within_s":"60"}`, inv, ir),
		sub("start_within_s beyond a float", `{"agent":"sim","start_within_s":1e400}`, inv, ir),
		sub("NaN start_within_s", `{"agent":"sim","start_within_s":NaN}`, inv, ij),
		sub("NUL in a sim input field name", `{"agent":"sim","input":{"steps`+nul+`":1}}`, inv, ij),
		hostile{name: "submit: body over 1 MiB, chunked", method: "POST", path: "/v1/tasks", auth: "key", header: map[string]string{"Transfer-Encoding": "chunked"},
			body: `{"agent":"echo","input":{"p":"` + strings.Repeat("x", 1<<20) + `"}}`, status: 413, code: "PAYLOAD_TOO_LARGE"},
		hostile{name: "submit: body over 1 MiB", method: "POST", path: "/v1/tasks", auth: "key",
			body: `{"agent":"echo","input":{"p":"` + strings.Repeat("x", 1<<20) + `"}}`, status: 413, code: "PAYLOAD_TOO_LARGE"},

		// Headers the API reads.
		hostile{name: "Idempotency-Key with a tab", method: "POST", path: "/v1/tasks", auth: "key", header: map[string]string{"Idempotency-Key": "a\tb"}, body: `{"agent":"sim"}`, status: inv, code: ir},
		hostile{name: "Idempotency-Key with invalid UTF-8", method: "POST", path: "/v1/tasks", auth: "key", header: map[string]string{"Idempotency-Key": "k" + badUTF8}, body: `{"agent":"sim"}`, status: inv, code: ir},
		hostile{name: "Idempotency-Key overlong", method: "POST", path: "/v1/tasks", auth: "key", header: map[string]string{"Idempotency-Key": long}, body: `{"agent":"sim"}`, status: inv, code: ir},
		hostile{name: "Idempotency-Key with a raw NUL", method: "POST", path: "/v1/tasks", auth: "key", header: map[string]string{"Idempotency-Key": "k\x00"}, body: `{"agent":"sim"}`, status: inv},
		hostile{name: "Idempotency-Key with DEL", method: "POST", path: "/v1/tasks", auth: "key", header: map[string]string{"Idempotency-Key": "k\x7f"}, body: `{"agent":"sim"}`, status: inv},
		hostile{name: "Idempotency-Key with a C1 control", method: "POST", path: "/v1/tasks", auth: "key", header: map[string]string{"Idempotency-Key": "k\u0085"}, body: `{"agent":"sim"}`, status: inv, code: ir},
		hostile{name: "Content-Type with invalid UTF-8", method: "POST", path: "/v1/tasks", auth: "key", header: map[string]string{"Content-Type": "application/json; x=" + badUTF8}, body: `{"agent":"sim"}`, status: inv, code: ir},
		hostile{name: "Content-Type with a tab", method: "POST", path: "/v1/admin/tenants", auth: "admin", header: map[string]string{"Content-Type": "application/json;\tx=1"}, body: `{"id":"ct","plan":"pro"}`, status: inv, code: ir},
		hostile{name: "Content-Type overlong", method: "POST", path: "/v1/admin/tenants", auth: "admin", header: map[string]string{"Content-Type": "application/json; x=" + huge}, body: `{"id":"ct","plan":"pro"}`, status: inv, code: ir},
		hostile{name: "header with a raw control character", method: "GET", path: "/v1/tasks", auth: "key", header: map[string]string{"Content-Type": "a\x01"}, status: inv},
		hostile{name: "header name with a NUL", method: "GET", path: "/v1/tasks", auth: "key", header: map[string]string{"X-\x00": "1"}, status: inv},

		// Authorization.
		hostile{name: "auth: key with invalid UTF-8", method: "GET", path: "/v1/tasks", auth: "Bearer aq_" + badUTF8, status: un, code: ua},
		hostile{name: "auth: key with a tab inside", method: "GET", path: "/v1/tasks", auth: "Bearer \taq_x", status: un, code: ua},
		hostile{name: "auth: valid key with a tab before it", method: "GET", path: "/v1/tasks", auth: "Bearer \t{key}", status: un, code: ua},
		hostile{name: "auth: valid key followed by invalid UTF-8", method: "GET", path: "/v1/usage", auth: "Bearer {key}" + badUTF8, status: un, code: ua},
		hostile{name: "auth: valid key with a C1 control", method: "POST", path: "/v1/tasks", auth: "Bearer {key}\u0085", body: `{"agent":"sim"}`, status: un, code: ua},
		hostile{name: "auth: overlong key", method: "GET", path: "/v1/tasks", auth: "Bearer aq_" + huge, status: un, code: ua},
		hostile{name: "auth: raw NUL in the key", method: "GET", path: "/v1/tasks", auth: "Bearer aq_\x00", status: inv},
		hostile{name: "auth: Basic scheme", method: "GET", path: "/v1/tasks", auth: "Basic YTpi", status: un, code: ua},
		hostile{name: "auth: scheme only", method: "GET", path: "/v1/usage", auth: "Bearer", status: un, code: ua},
		hostile{name: "auth: key with a kid of NUL escapes", method: "GET", path: "/v1/usage", auth: "Bearer aq_%00_" + strings.Repeat("0", 64), status: un, code: ua},
		hostile{name: "auth: admin token with invalid UTF-8", method: "GET", path: "/v1/admin/plans", auth: "Bearer {admin}" + badUTF8, status: un, code: ua},
		hostile{name: "auth: admin token with a tab before it", method: "GET", path: "/v1/admin/tenants", auth: "Bearer \t{admin}", status: un, code: ua},
		hostile{name: "auth: admin token overlong", method: "POST", path: "/v1/admin/tenants", auth: "Bearer " + huge, body: `{"id":"au","plan":"pro"}`, status: un, code: ua},
		hostile{name: "auth: tenant key on the admin API", method: "POST", path: "/v1/admin/tenants", auth: "key", body: `{"id":"au","plan":"pro"}`, status: un, code: ua},
		hostile{name: "auth: admin token with a raw control character", method: "DELETE", path: "/v1/admin/keys/" + kid, auth: "Bearer {admin}\x01", status: inv},

		// Query parameters.
		hostile{name: "list: NUL in state", method: "GET", path: "/v1/tasks?state=%00", auth: "key", status: inv, code: ir},
		hostile{name: "list: invalid UTF-8 in state", method: "GET", path: "/v1/tasks?state=%FF", auth: "key", status: inv, code: ir},
		hostile{name: "list: raw invalid UTF-8 in state", method: "GET", path: "/v1/tasks?state=\xff", auth: "key", status: inv, code: ir},
		hostile{name: "list: control character in state", method: "GET", path: "/v1/tasks?state=queued%0A", auth: "key", status: inv, code: ir},
		hostile{name: "list: overlong state", method: "GET", path: "/v1/tasks?state=" + long, auth: "key", status: inv, code: ir},
		hostile{name: "list: NUL in cursor", method: "GET", path: "/v1/tasks?cursor=%00", auth: "key", status: inv, code: ir},
		hostile{name: "list: overlong cursor", method: "GET", path: "/v1/tasks?cursor=" + huge, auth: "key", status: inv, code: ir},
		hostile{name: "list: NUL in limit", method: "GET", path: "/v1/tasks?limit=1%00", auth: "key", status: inv, code: ir},
		hostile{name: "list: huge limit", method: "GET", path: "/v1/tasks?limit=99999999999999999999999", auth: "key", status: inv, code: ir},
		hostile{name: "list: NUL in a parameter name", method: "GET", path: "/v1/tasks?%00=1", auth: "key", status: inv, code: ir},
		hostile{name: "list: malformed escape", method: "GET", path: "/v1/tasks?state=%zz", auth: "key", status: inv, code: ir},
		hostile{name: "list: semicolon separator", method: "GET", path: "/v1/tasks?state=queued;limit=1", auth: "key", status: inv, code: ir},
		hostile{name: "list: overlong query", method: "GET", path: "/v1/tasks?state=queued&x=" + huge, auth: "key", status: inv, code: ir},
		hostile{name: "list: raw space in query", method: "GET", path: "/v1/tasks?state=a b", auth: "key", status: inv},
		hostile{name: "usage: NUL in user", method: "GET", path: "/v1/usage?user=%00", auth: "key", status: inv, code: ir},
		hostile{name: "usage: invalid UTF-8 in agent", method: "GET", path: "/v1/usage?agent=%C3%28", auth: "key", status: inv, code: ir},
		hostile{name: "usage: control character in user", method: "GET", path: "/v1/usage?user=u%1B", auth: "key", status: inv, code: ir},
		hostile{name: "usage: overlong user", method: "GET", path: "/v1/usage?user=" + long, auth: "key", status: inv, code: ir},
		hostile{name: "usage: overlong agent", method: "GET", path: "/v1/usage?agent=" + long, auth: "key", status: inv, code: ir},
		hostile{name: "events: not a cursor", method: "GET", path: "/v1/events?after=nope", auth: "key", status: inv, code: ir},
		hostile{name: "events: a cursor of another version", method: "GET", path: "/v1/events?after=AgAAAAAAAAABAAAAAAAAAAE", auth: "key", status: inv, code: ir},
		hostile{name: "events: NUL in the cursor", method: "GET", path: "/v1/events?after=%00", auth: "key", status: inv, code: ir},
		hostile{name: "events: limit 0", method: "GET", path: "/v1/events?limit=0", auth: "key", status: inv, code: ir},
		hostile{name: "events: limit above 1000", method: "GET", path: "/v1/events?limit=1001", auth: "key", status: inv, code: ir},
		hostile{name: "events: huge limit", method: "GET", path: "/v1/events?limit=99999999999999999999999", auth: "key", status: inv, code: ir},
		hostile{name: "events: unknown type", method: "GET", path: "/v1/events?type=usage.other", auth: "key", status: inv, code: ir},
		hostile{name: "events: a tenant filter on the tenant feed", method: "GET", path: "/v1/events?tenant=globex", auth: "key", status: inv, code: ir},
		hostile{name: "admin events: not a cursor", method: "GET", path: "/v1/admin/events?after=%2F%2F", auth: "admin", status: inv, code: ir},
		hostile{name: "admin events: negative limit", method: "GET", path: "/v1/admin/events?limit=-1", auth: "admin", status: inv, code: ir},
		hostile{name: "admin events: unknown type", method: "GET", path: "/v1/admin/events?type=%27%20OR%201%3D1", auth: "admin", status: inv, code: ir},
		hostile{name: "admin events: control character in tenant", method: "GET", path: "/v1/admin/events?tenant=a%1B", auth: "admin", status: inv, code: ir},
		hostile{name: "admin events: unknown query parameter", method: "GET", path: "/v1/admin/events?cursor=x", auth: "admin", status: inv, code: ir},
		hostile{name: "usage: days 0", method: "GET", path: "/v1/usage?days=0", auth: "key", status: inv, code: ir},
		hostile{name: "usage: huge days", method: "GET", path: "/v1/usage?days=99999999999999999999", auth: "key", status: inv, code: ir},
		hostile{name: "panel: NUL in the token", method: "GET", path: "/panel/t?token=%00", status: inv, code: ir},
		hostile{name: "panel usage: a forged token", method: "GET", path: "/panel/t/usage?token=MXxhY21lfDk5OTk5OTk5OTk.AAAA", status: un, code: ua},
		hostile{name: "panel usage: an overlong token", method: "GET", path: "/panel/t/usage?token=" + long, status: inv, code: ir},
		hostile{name: "panel asset: a path outside the assets", method: "GET", path: "/panel/t/assets/..%2Fpanel_tenant.go", status: nf, code: nfc},
		hostile{name: "panel link: ttl 0", method: "POST", path: "/v1/admin/tenants/acme/panel-links", auth: "admin", body: `{"ttl_s":0}`, status: inv, code: ir},
		hostile{name: "panel link: ttl as a string", method: "POST", path: "/v1/admin/tenants/acme/panel-links", auth: "admin", body: `{"ttl_s":"60"}`, status: inv, code: ir},
		hostile{name: "panel link: unknown field", method: "POST", path: "/v1/admin/tenants/acme/panel-links", auth: "admin", body: `{"tenant":"globex"}`, status: inv, code: ir},
		hostile{name: "panel links revoke: unknown field", method: "POST", path: "/v1/admin/tenants/acme/panel-links/revoke", auth: "admin", body: `{"before":"2026-01-01T00:00:00Z"}`, status: inv, code: ir},
		hostile{name: "panel links revoke: unknown tenant", method: "POST", path: "/v1/admin/tenants/nobody/panel-links/revoke", auth: "admin", status: nf, code: nfc},
		hostile{name: "usage export: no period", method: "GET", path: "/v1/admin/usage", auth: "admin", status: inv, code: ir},
		hostile{name: "usage export: month 13", method: "GET", path: "/v1/admin/usage?period=2026-13", auth: "admin", status: inv, code: ir},
		hostile{name: "usage export: SQL in period", method: "GET", path: "/v1/admin/usage?period=2026-01%27%3B%20DROP%20TABLE%20tenants", auth: "admin", status: inv, code: ir},
		hostile{name: "usage export: huge year", method: "GET", path: "/v1/admin/usage?period=99999-01", auth: "admin", status: inv, code: ir},
		hostile{name: "usage export: unknown format", method: "GET", path: "/v1/admin/usage?period=2026-01&format=xlsx", auth: "admin", status: inv, code: ir},
		hostile{name: "usage export: unknown query parameter", method: "GET", path: "/v1/admin/usage?period=2026-01&tenant=x", auth: "admin", status: inv, code: ir},
		hostile{name: "tenant: unknown time zone", method: "POST", path: "/v1/admin/tenants", auth: "admin", body: `{"id":"tz1","plan":"pro","time_zone":"../../etc/passwd"}`, status: inv, code: ir},
		hostile{name: "tenant: billing day 99", method: "POST", path: "/v1/admin/tenants", auth: "admin", body: `{"id":"bd1","plan":"pro","billing_day":99}`, status: inv, code: ir},
		hostile{name: "admin list: NUL in a query parameter", method: "GET", path: "/v1/admin/tenants?x=%00", auth: "admin", status: inv, code: ir},
		hostile{name: "admin plans: invalid UTF-8 in a query name", method: "GET", path: "/v1/admin/plans?%FF=1", auth: "admin", status: inv, code: ir},
		hostile{name: "admin agents: control character in a query parameter", method: "GET", path: "/v1/admin/agents?x=%07", auth: "admin", status: inv, code: ir},
		hostile{name: "healthz: NUL in a query parameter", method: "GET", path: "/healthz?x=%00", status: inv, code: ir},
		hostile{name: "readyz: invalid UTF-8 in a query parameter", method: "GET", path: "/readyz?x=%FF", status: inv, code: ir},
		hostile{name: "metrics: invalid UTF-8 in a query parameter", method: "GET", path: "/metrics?x=%FF", status: inv, code: ir},
		hostile{name: "openapi: control character in a query parameter", method: "GET", path: "/openapi.json?x=%01", status: inv, code: ir},

		// Path parameters of the tenant API.
		hostile{name: "get task: NUL id", method: "GET", path: "/v1/tasks/%00", auth: "key", status: inv, code: ir},
		hostile{name: "get task: invalid UTF-8 id", method: "GET", path: "/v1/tasks/%FF", auth: "key", status: inv, code: ir},
		hostile{name: "get task: raw invalid UTF-8 id", method: "GET", path: "/v1/tasks/\xff\xfe", auth: "key", status: inv, code: ir},
		hostile{name: "get task: id with a newline", method: "GET", path: "/v1/tasks/" + task + "%0A", auth: "key", status: inv, code: ir},
		hostile{name: "get task: overlong id", method: "GET", path: "/v1/tasks/" + huge, auth: "key", status: inv, code: ir},
		hostile{name: "get task: id with a NUL after a valid one", method: "GET", path: "/v1/tasks/" + task + "%00", auth: "key", status: inv, code: ir},
		hostile{name: "get task: no such task", method: "GET", path: "/v1/tasks/00000000-0000-7000-8000-000000000000", auth: "key", status: nf, code: nfc},
		hostile{name: "get task: uuid-shaped, not hex", method: "GET", path: "/v1/tasks/zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz", auth: "key", status: nf, code: nfc},
		hostile{name: "get task: not a uuid", method: "GET", path: "/v1/tasks/abc", auth: "key", status: nf, code: nfc},
		hostile{name: "tree: NUL id", method: "GET", path: "/v1/tasks/%00/tree", auth: "key", status: inv, code: ir},
		hostile{name: "tree: overlong id", method: "GET", path: "/v1/tasks/" + huge + "/tree", auth: "key", status: inv, code: ir},
		hostile{name: "tree: no such task", method: "GET", path: "/v1/tasks/00000000-0000-7000-8000-000000000000/tree", auth: "key", status: nf, code: nfc},
		hostile{name: "tree: not a uuid", method: "GET", path: "/v1/tasks/abc/tree", auth: "key", status: nf, code: nfc},
		hostile{name: "list: root_id not a uuid", method: "GET", path: "/v1/tasks?root_id=abc", auth: "key", status: inv, code: ir},
		hostile{name: "list: root_id with a NUL", method: "GET", path: "/v1/tasks?root_id=%00", auth: "key", status: inv, code: ir},
		hostile{name: "submit: tree budget over the ceiling", method: "POST", path: "/v1/tasks", auth: "key", body: `{"agent":"sim","tree_budget":{"max_tasks":100000}}`, status: inv, code: ir},
		hostile{name: "submit: tree budget of the wrong type", method: "POST", path: "/v1/tasks", auth: "key", body: `{"agent":"sim","tree_budget":{"max_depth":"deep"}}`, status: inv, code: ir},
		hostile{name: "submit: tree budget with an unknown field", method: "POST", path: "/v1/tasks", auth: "key", body: `{"agent":"sim","tree_budget":{"max_width":3}}`, status: inv, code: ir},
		hostile{name: "cancel: NUL id", method: "POST", path: "/v1/tasks/%00/cancel", auth: "key", status: inv, code: ir},
		hostile{name: "cancel: invalid UTF-8 id", method: "POST", path: "/v1/tasks/%C0%80/cancel", auth: "key", status: inv, code: ir},
		hostile{name: "cancel: overlong id", method: "POST", path: "/v1/tasks/" + huge + "/cancel", auth: "key", status: inv, code: ir},
		// cancel takes no body, so its content is not read
		hostile{name: "cancel: finished task with a hostile body", method: "POST", path: "/v1/tasks/" + task + "/cancel", auth: "key", body: `{"x":"` + nul + `"}`, status: 409, code: "TASK_ALREADY_FINISHED"},
		hostile{name: "cancel: finished task", method: "POST", path: "/v1/tasks/" + task + "/cancel", auth: "key", status: 409, code: "TASK_ALREADY_FINISHED"},
		hostile{name: "resume: NUL id", method: "POST", path: "/v1/tasks/%00/resume", auth: "key", status: inv, code: ir},
		hostile{name: "resume: overlong id", method: "POST", path: "/v1/tasks/" + huge + "/resume", auth: "key", status: inv, code: ir},
		hostile{name: "resume: unknown field", method: "POST", path: "/v1/tasks/" + task + "/resume", auth: "key", body: `{"budjet":{}}`, status: inv, code: ir},
		hostile{name: "resume: a budget that is not an object", method: "POST", path: "/v1/tasks/" + task + "/resume", auth: "key", body: `{"budget":[1]}`, status: inv, code: ir},
		hostile{name: "resume: NUL in the body", method: "POST", path: "/v1/tasks/" + task + "/resume", auth: "key", body: `{"budget":{"max_steps":"` + nul + `"}}`, status: inv, code: ij},
		hostile{name: "resume: a completed task", method: "POST", path: "/v1/tasks/" + task + "/resume", auth: "key", body: `{"budget":{"max_steps":99}}`, status: 409, code: "TASK_NOT_PAUSED"},
		hostile{name: "approve: NUL in the token", method: "GET", path: "/approve?token=%00", status: inv, code: ir},
		hostile{name: "approve: an overlong token", method: "GET", path: "/approve?token=" + long, status: inv, code: ir},
		hostile{name: "approve POST: NUL in the token", method: "POST", path: "/approve?token=%00", status: inv, code: ir},
		hostile{name: "approve POST: invalid UTF-8 in the token", method: "POST", path: "/approve?token=%C0%80", status: inv, code: ir},
		hostile{name: "events: NUL id", method: "GET", path: "/v1/tasks/%00/events", auth: "key", status: inv, code: ir},
		hostile{name: "events: control character id", method: "GET", path: "/v1/tasks/%1F/events", auth: "key", status: inv, code: ir},
		hostile{name: "events: not a uuid", method: "GET", path: "/v1/tasks/zzz/events", auth: "key", status: nf, code: nfc},

		// The admin API: bodies.
		hostile{name: "create tenant: NUL in name", method: "POST", path: "/v1/admin/tenants", auth: "admin", body: `{"id":"n1","plan":"pro","name":"a` + nul + `"}`, status: inv, code: ij},
		hostile{name: "create tenant: invalid UTF-8 in name", method: "POST", path: "/v1/admin/tenants", auth: "admin", body: `{"id":"n1","plan":"pro","name":"a` + badUTF8 + `"}`, status: inv, code: ij},
		hostile{name: "create tenant: control character in name", method: "POST", path: "/v1/admin/tenants", auth: "admin", body: `{"id":"n1","plan":"pro","name":"a\u0008"}`, status: inv, code: ir},
		hostile{name: "create tenant: lone surrogate in name", method: "POST", path: "/v1/admin/tenants", auth: "admin", body: `{"id":"n1","plan":"pro","name":"a\udfff"}`, status: inv, code: ij},
		hostile{name: "create tenant: overlong name", method: "POST", path: "/v1/admin/tenants", auth: "admin", body: `{"id":"n1","plan":"pro","name":"` + huge + `"}`, status: inv, code: ir},
		hostile{name: "create tenant: NUL in id", method: "POST", path: "/v1/admin/tenants", auth: "admin", body: `{"id":"n` + nul + `","plan":"pro"}`, status: inv, code: ij},
		hostile{name: "create tenant: newline at the end of id", method: "POST", path: "/v1/admin/tenants", auth: "admin", body: `{"id":"n1\n","plan":"pro"}`, status: inv, code: ir},
		hostile{name: "create tenant: overlong id", method: "POST", path: "/v1/admin/tenants", auth: "admin", body: `{"id":"` + long + `","plan":"pro"}`, status: inv, code: ir},
		hostile{name: "create tenant: NUL in plan", method: "POST", path: "/v1/admin/tenants", auth: "admin", body: `{"id":"n1","plan":"pro` + nul + `"}`, status: inv, code: ij},
		hostile{name: "create tenant: NUL in an override name", method: "POST", path: "/v1/admin/tenants", auth: "admin", body: `{"id":"n1","plan":"pro","overrides":{"tenant_rate` + nul + `":1}}`, status: inv, code: ij},
		hostile{name: "create tenant: overflowing weight", method: "POST", path: "/v1/admin/tenants", auth: "admin", body: `{"id":"n1","plan":"pro","weight":1e30}`, status: inv, code: ir},
		hostile{name: "create tenant: override beyond float64", method: "POST", path: "/v1/admin/tenants", auth: "admin", body: `{"id":"n1","plan":"pro","overrides":{"tenant_rate":1e400}}`, status: inv, code: ir},
		hostile{name: "create tenant: invalid UTF-8 in the body", method: "POST", path: "/v1/admin/tenants", auth: "admin", body: "{\"id\":\"n1\",\"plan\":\"pro\"}\xc3", status: inv, code: ij},
		hostile{name: "update tenant: NUL in name", method: "PATCH", path: "/v1/admin/tenants/acme", auth: "admin", body: `{"name":"` + nul + `"}`, status: inv, code: ij},
		hostile{name: "update tenant: invalid UTF-8 in name", method: "PATCH", path: "/v1/admin/tenants/acme", auth: "admin", body: `{"name":"` + badUTF8 + `"}`, status: inv, code: ij},
		hostile{name: "update tenant: control character in name", method: "PATCH", path: "/v1/admin/tenants/acme", auth: "admin", body: `{"name":"x\u001f"}`, status: inv, code: ir},
		hostile{name: "update tenant: NUL in status", method: "PATCH", path: "/v1/admin/tenants/acme", auth: "admin", body: `{"status":"active` + nul + `"}`, status: inv, code: ij},
		hostile{name: "update tenant: NUL in id field", method: "PATCH", path: "/v1/admin/tenants/acme", auth: "admin", body: `{"id":"acme` + nul + `"}`, status: inv, code: ij},
		hostile{name: "create key: NUL in an agent scope", method: "POST", path: "/v1/admin/tenants/acme/keys", auth: "admin", body: `{"scopes":{"agents":["sim` + nul + `"]}}`, status: inv, code: ij},
		hostile{name: "create key: invalid UTF-8 in a principal scope", method: "POST", path: "/v1/admin/tenants/acme/keys", auth: "admin", body: `{"scopes":{"principals":["` + badUTF8 + `"]}}`, status: inv, code: ij},
		hostile{name: "create key: control character in a scope", method: "POST", path: "/v1/admin/tenants/acme/keys", auth: "admin", body: `{"scopes":{"principals":["u\u0002"]}}`, status: inv, code: ir},
		hostile{name: "create key: overlong scope", method: "POST", path: "/v1/admin/tenants/acme/keys", auth: "admin", body: `{"scopes":{"agents":["` + long + `"]}}`, status: inv, code: ir},
		hostile{name: "create key: unknown scope field", method: "POST", path: "/v1/admin/tenants/acme/keys", auth: "admin", body: `{"scopes":{"tenants":["x"]}}`, status: inv, code: ir},
		hostile{name: "put agent: NUL in url", method: "PUT", path: "/v1/admin/agents/evil", auth: "admin", body: `{"url":"http://127.0.0.1:1/` + nul + `"}`, status: inv, code: ij},
		hostile{name: "put agent: invalid UTF-8 in url", method: "PUT", path: "/v1/admin/agents/evil", auth: "admin", body: `{"url":"http://127.0.0.1:1/` + badUTF8 + `"}`, status: inv, code: ij},
		hostile{name: "put agent: invalid UTF-8 in url host", method: "PUT", path: "/v1/admin/agents/evil", auth: "admin", body: `{"url":"http://\u00ff` + `.example/"}`, status: inv, code: ir},
		hostile{name: "put agent: overlong url", method: "PUT", path: "/v1/admin/agents/evil", auth: "admin", body: `{"url":"http://127.0.0.1:1/` + strings.Repeat("a", 10000) + `"}`, status: inv, code: ir},
		hostile{name: "put agent: NUL in a header value", method: "PUT", path: "/v1/admin/agents/evil", auth: "admin", body: `{"url":"http://127.0.0.1:1/","headers":{"X-Key":"` + nul + `"}}`, status: inv, code: ij},
		hostile{name: "put agent: control character in a header value", method: "PUT", path: "/v1/admin/agents/evil", auth: "admin", body: `{"url":"http://127.0.0.1:1/","headers":{"X-Key":"a\u0001"}}`, status: inv, code: ir},
		hostile{name: "put agent: non-token header name", method: "PUT", path: "/v1/admin/agents/evil", auth: "admin", body: `{"url":"http://127.0.0.1:1/","headers":{"X-K\u00e9y":"a"}}`, status: inv, code: ir},
		hostile{name: "put agent: invalid UTF-8 in a header name", method: "PUT", path: "/v1/admin/agents/evil", auth: "admin", body: `{"url":"http://127.0.0.1:1/","headers":{"X-` + badUTF8 + `":"a"}}`, status: inv, code: ij},
		hostile{name: "put agent: overlong header value", method: "PUT", path: "/v1/admin/agents/evil", auth: "admin", body: `{"url":"http://127.0.0.1:1/","headers":{"X-Key":"` + strings.Repeat("v", 10000) + `"}}`, status: inv, code: ir},
		hostile{name: "create webhook: NUL in url", method: "POST", path: "/v1/admin/webhooks", auth: "admin", body: `{"url":"http://127.0.0.1:1/` + nul + `","types":["usage.limit_hit"]}`, status: inv, code: ij},
		hostile{name: "create webhook: invalid UTF-8 in a type", method: "POST", path: "/v1/admin/webhooks", auth: "admin", body: `{"url":"http://127.0.0.1:1/","types":["` + badUTF8 + `"]}`, status: inv, code: ij},
		hostile{name: "create webhook: unknown type", method: "POST", path: "/v1/admin/webhooks", auth: "admin", body: `{"url":"http://127.0.0.1:1/","types":["usage.other"]}`, status: inv, code: ir},
		hostile{name: "create webhook: no types", method: "POST", path: "/v1/admin/webhooks", auth: "admin", body: `{"url":"http://127.0.0.1:1/","types":[]}`, status: inv, code: ir},
		hostile{name: "create webhook: types not a list", method: "POST", path: "/v1/admin/webhooks", auth: "admin", body: `{"url":"http://127.0.0.1:1/","types":"usage.limit_hit"}`, status: inv, code: ir},
		hostile{name: "create webhook: relative url", method: "POST", path: "/v1/admin/webhooks", auth: "admin", body: `{"url":"/hook","types":["usage.limit_hit"]}`, status: inv, code: ir},
		hostile{name: "create webhook: javascript url", method: "POST", path: "/v1/admin/webhooks", auth: "admin", body: `{"url":"javascript:alert(1)","types":["usage.limit_hit"]}`, status: inv, code: ir},
		hostile{name: "create webhook: overlong url", method: "POST", path: "/v1/admin/webhooks", auth: "admin", body: `{"url":"http://127.0.0.1:1/` + strings.Repeat("a", 10000) + `","types":["usage.limit_hit"]}`, status: inv, code: ir},
		hostile{name: "create webhook: unknown tenant", method: "POST", path: "/v1/admin/webhooks", auth: "admin", body: `{"url":"http://127.0.0.1:1/","types":["usage.limit_hit"],"tenant":"no-such-tenant"}`, status: inv, code: ir},
		hostile{name: "create webhook: NUL in tenant", method: "POST", path: "/v1/admin/webhooks", auth: "admin", body: `{"url":"http://127.0.0.1:1/","types":["usage.limit_hit"],"tenant":"a` + nul + `"}`, status: inv, code: ij},
		hostile{name: "create webhook: a secret given", method: "POST", path: "/v1/admin/webhooks", auth: "admin", body: `{"url":"http://127.0.0.1:1/","types":["usage.limit_hit"],"secret":"whsec_x"}`, status: inv, code: ir},
		hostile{name: "create webhook: tenant key", method: "POST", path: "/v1/admin/webhooks", auth: "key", body: `{"url":"http://127.0.0.1:1/","types":["usage.limit_hit"]}`, status: un, code: ua},
		hostile{name: "list webhooks: control character in a query parameter", method: "GET", path: "/v1/admin/webhooks?x=%07", auth: "admin", status: inv, code: ir},
		hostile{name: "get webhook: not a uuid", method: "GET", path: "/v1/admin/webhooks/nope", auth: "admin", status: nf, code: nfc},
		hostile{name: "get webhook: no such endpoint", method: "GET", path: "/v1/admin/webhooks/00000000-0000-4000-8000-000000000000", auth: "admin", status: nf, code: nfc},
		hostile{name: "get webhook: NUL id", method: "GET", path: "/v1/admin/webhooks/%00", auth: "admin", status: inv, code: ir},
		hostile{name: "delete webhook: invalid UTF-8 id", method: "DELETE", path: "/v1/admin/webhooks/%FF", auth: "admin", status: inv, code: ir},
		hostile{name: "rotate webhook: no such endpoint", method: "POST", path: "/v1/admin/webhooks/00000000-0000-4000-8000-000000000000/rotate", auth: "admin", status: nf, code: nfc},
		hostile{name: "webhook attempts: not a cursor", method: "GET", path: "/v1/admin/webhooks/00000000-0000-4000-8000-000000000000/attempts?after=x", auth: "admin", status: inv, code: ir},
		hostile{name: "tenant webhook: NUL in url", method: "POST", path: "/v1/webhooks", auth: "key", body: `{"url":"https://x.example/` + nul + `","types":["usage.limit_hit"]}`, status: inv, code: ij},
		hostile{name: "tenant webhook: link-local address", method: "POST", path: "/v1/webhooks", auth: "key", body: `{"url":"http://169.254.169.254/latest/meta-data/","types":["usage.limit_hit"]}`, status: inv, code: ir},
		hostile{name: "tenant webhook: IPv4-mapped private address", method: "POST", path: "/v1/webhooks", auth: "key", body: `{"url":"http://[::ffff:10.0.0.5]/","types":["usage.limit_hit"]}`, status: inv, code: ir},
		hostile{name: "tenant webhook: unknown type", method: "POST", path: "/v1/webhooks", auth: "key", body: `{"url":"https://x.example/","types":["usage.other"]}`, status: inv, code: ir},
		hostile{name: "tenant webhook: a tenant given", method: "POST", path: "/v1/webhooks", auth: "key", body: `{"url":"https://x.example/","types":["usage.limit_hit"],"tenant":"other"}`, status: inv, code: ir},
		hostile{name: "tenant webhook: no key", method: "POST", path: "/v1/webhooks", body: `{"url":"https://x.example/","types":["usage.limit_hit"]}`, status: un, code: ua},
		hostile{name: "tenant webhooks: control character in a query parameter", method: "GET", path: "/v1/webhooks?x=%07", auth: "key", status: inv, code: ir},
		hostile{name: "tenant webhooks: unknown query parameter", method: "GET", path: "/v1/webhooks?limit=5", auth: "key", status: inv, code: ir},
		hostile{name: "tenant webhook: not a uuid", method: "GET", path: "/v1/webhooks/nope", auth: "key", status: nf, code: nfc},
		hostile{name: "tenant webhook: invalid UTF-8 id", method: "DELETE", path: "/v1/webhooks/%FF", auth: "key", status: inv, code: ir},
		hostile{name: "tenant webhook rotate: no such endpoint", method: "POST", path: "/v1/webhooks/00000000-0000-4000-8000-000000000000/rotate", auth: "key", status: nf, code: nfc},
		hostile{name: "tenant webhook attempts: no such endpoint", method: "GET", path: "/v1/webhooks/00000000-0000-4000-8000-000000000000/attempts", auth: "key", status: nf, code: nfc},
		hostile{name: "tenant webhook attempts: limit out of range", method: "GET", path: "/v1/webhooks/00000000-0000-4000-8000-000000000000/attempts?limit=0", auth: "key", status: 400, code: ir},
		hostile{name: "tenant webhook attempts: unknown parameter", method: "GET", path: "/v1/webhooks/00000000-0000-4000-8000-000000000000/attempts?tenant=globex", auth: "key", status: 400, code: ir},
		hostile{name: "webhook attempts: limit 0", method: "GET", path: "/v1/admin/webhooks/00000000-0000-4000-8000-000000000000/attempts?limit=0", auth: "admin", status: inv, code: ir},
		hostile{name: "webhook attempts: unknown query parameter", method: "GET", path: "/v1/admin/webhooks/00000000-0000-4000-8000-000000000000/attempts?cursor=1", auth: "admin", status: inv, code: ir},
		hostile{name: "webhook attempts: no such endpoint", method: "GET", path: "/v1/admin/webhooks/00000000-0000-4000-8000-000000000000/attempts", auth: "admin", status: nf, code: nfc},
		hostile{name: "update webhook: no such endpoint", method: "PATCH", path: "/v1/admin/webhooks/00000000-0000-4000-8000-000000000000", auth: "admin", body: `{"enabled":false}`, status: nf, code: nfc},
		hostile{name: "update webhook: enabled missing", method: "PATCH", path: "/v1/admin/webhooks/00000000-0000-4000-8000-000000000000", auth: "admin", body: `{}`, status: inv, code: ir},
		hostile{name: "update webhook: enabled not a boolean", method: "PATCH", path: "/v1/admin/webhooks/00000000-0000-4000-8000-000000000000", auth: "admin", body: `{"enabled":"yes"}`, status: inv, code: ir},
		hostile{name: "list audit: unknown query parameter", method: "GET", path: "/v1/admin/audit?colour=red", auth: "admin", status: inv, code: ir},
		hostile{name: "list audit: since not a time", method: "GET", path: "/v1/admin/audit?since=yesterday", auth: "admin", status: inv, code: ir},
		hostile{name: "list audit: unknown object kind", method: "GET", path: "/v1/admin/audit?object=planet:mars", auth: "admin", status: inv, code: ir},
		hostile{name: "list audit: limit above 1000", method: "GET", path: "/v1/admin/audit?limit=1001", auth: "admin", status: inv, code: ir},
		hostile{name: "list audit: not a cursor", method: "GET", path: "/v1/admin/audit?cursor=-1", auth: "admin", status: inv, code: ir},
		hostile{name: "audit head: tenant key", method: "GET", path: "/v1/admin/audit/head", auth: "key", status: un, code: ua},
		hostile{name: "audit row: not a number", method: "GET", path: "/v1/admin/audit/nope", auth: "admin", status: nf, code: nfc},
		hostile{name: "audit row: no such row", method: "GET", path: "/v1/admin/audit/9999999", auth: "admin", status: nf, code: nfc},
		hostile{name: "revert audit row: no such row", method: "POST", path: "/v1/admin/audit/9999999/revert", auth: "admin", status: nf, code: nfc},
		hostile{name: "revert audit row: a body", method: "POST", path: "/v1/admin/audit/1/revert", auth: "admin", body: `{"force":true}`, status: inv, code: ir},
		hostile{name: "put pool: upper-case name", method: "PUT", path: "/v1/admin/pools/LLM", auth: "admin", body: `{"tokens_per_minute":1000}`, status: inv, code: ir},
		hostile{name: "put pool: braces in the name", method: "PUT", path: "/v1/admin/pools/a%7Bx%7D", auth: "admin", body: `{"tokens_per_minute":1000}`, status: inv, code: ir},
		hostile{name: "put pool: NUL name", method: "PUT", path: "/v1/admin/pools/%00", auth: "admin", body: `{"tokens_per_minute":1000}`, status: inv, code: ir},
		hostile{name: "put pool: no rate", method: "PUT", path: "/v1/admin/pools/llm", auth: "admin", body: `{"burst_tokens":10}`, status: inv, code: ir},
		hostile{name: "put pool: rate beyond float64", method: "PUT", path: "/v1/admin/pools/llm", auth: "admin", body: `{"tokens_per_minute":1e400}`, status: inv, code: ir},
		hostile{name: "put pool: rate above 1e12", method: "PUT", path: "/v1/admin/pools/llm", auth: "admin", body: `{"tokens_per_minute":9223372036854775807}`, status: inv, code: ir},
		hostile{name: "put pool: burst above a minute's worth", method: "PUT", path: "/v1/admin/pools/llm", auth: "admin", body: `{"tokens_per_minute":100,"burst_tokens":101}`, status: inv, code: ir},
		hostile{name: "put pool: requests 0", method: "PUT", path: "/v1/admin/pools/llm", auth: "admin", body: `{"tokens_per_minute":100,"requests_per_minute":0}`, status: inv, code: ir},
		hostile{name: "put pool: NUL in an unknown field", method: "PUT", path: "/v1/admin/pools/llm", auth: "admin", body: `{"tokens_per_minute":100,"x` + nul + `":1}`, status: inv, code: ij},
		hostile{name: "put pool: invalid UTF-8 after the body", method: "PUT", path: "/v1/admin/pools/llm", auth: "admin", body: "{\"tokens_per_minute\":100}\xff", status: inv, code: ij},
		hostile{name: "put pool: tenant key", method: "PUT", path: "/v1/admin/pools/llm", auth: "key", body: `{"tokens_per_minute":100}`, status: un, code: ua},
		hostile{name: "list pools: control character in a query parameter", method: "GET", path: "/v1/admin/pools?x=%07", auth: "admin", status: inv, code: ir},
		hostile{name: "get pool: no such pool", method: "GET", path: "/v1/admin/pools/nope", auth: "admin", status: nf, code: nfc},
		hostile{name: "get pool: invalid UTF-8 name", method: "GET", path: "/v1/admin/pools/%FF", auth: "admin", status: inv, code: ir},
		hostile{name: "delete pool: no such pool", method: "DELETE", path: "/v1/admin/pools/nope", auth: "admin", status: nf, code: nfc},
		hostile{name: "bind agent: unknown agent", method: "PUT", path: "/v1/admin/agents/ghost/pool", auth: "admin", body: `{"pool":"llm","tokens_per_step":1}`, status: nf, code: nfc},
		hostile{name: "bind agent: unknown pool", method: "PUT", path: "/v1/admin/agents/echo/pool", auth: "admin", body: `{"pool":"nope","tokens_per_step":1}`, status: nf, code: nfc},
		hostile{name: "bind agent: NUL in pool", method: "PUT", path: "/v1/admin/agents/echo/pool", auth: "admin", body: `{"pool":"llm` + nul + `","tokens_per_step":1}`, status: inv, code: ij},
		hostile{name: "bind agent: tokens per step 0", method: "PUT", path: "/v1/admin/agents/echo/pool", auth: "admin", body: `{"pool":"llm","tokens_per_step":0}`, status: inv, code: ir},
		hostile{name: "bind agent: tokens per step as a string", method: "PUT", path: "/v1/admin/agents/sim/pool", auth: "admin", body: `{"pool":"llm","tokens_per_step":"1"}`, status: inv, code: ir},
		hostile{name: "bind agent: control character agent", method: "PUT", path: "/v1/admin/agents/echo%0A/pool", auth: "admin", body: `{"pool":"llm","tokens_per_step":1}`, status: inv, code: ir},
		hostile{name: "agent pool: not bound", method: "GET", path: "/v1/admin/agents/echo/pool", auth: "admin", status: nf, code: nfc},
		hostile{name: "unbind agent: not bound", method: "DELETE", path: "/v1/admin/agents/echo/pool", auth: "admin", status: nf, code: nfc},
		hostile{name: "unbind agent: NUL name", method: "DELETE", path: "/v1/admin/agents/%00/pool", auth: "admin", status: inv, code: ir},
		hostile{name: "put agent: step timeout beyond float64", method: "PUT", path: "/v1/admin/agents/evil", auth: "admin", body: `{"url":"http://127.0.0.1:1/","step_timeout_s":1e999}`, status: inv, code: ir},

		// The admin API: path parameters.
		hostile{name: "get tenant: NUL id", method: "GET", path: "/v1/admin/tenants/%00", auth: "admin", status: inv, code: ir},
		hostile{name: "get tenant: invalid UTF-8 id", method: "GET", path: "/v1/admin/tenants/%FF", auth: "admin", status: inv, code: ir},
		hostile{name: "get tenant: control character id", method: "GET", path: "/v1/admin/tenants/acme%0D%0A", auth: "admin", status: inv, code: ir},
		hostile{name: "get tenant: overlong id", method: "GET", path: "/v1/admin/tenants/" + huge, auth: "admin", status: inv, code: ir},
		hostile{name: "update tenant: NUL path id", method: "PATCH", path: "/v1/admin/tenants/%00", auth: "admin", body: `{"weight":2}`, status: inv, code: ir},
		hostile{name: "update tenant: invalid UTF-8 path id", method: "PATCH", path: "/v1/admin/tenants/a%E2%82", auth: "admin", body: `{"name":"x"}`, status: inv, code: ir},
		hostile{name: "create key: NUL tenant id", method: "POST", path: "/v1/admin/tenants/%00/keys", auth: "admin", body: `{}`, status: inv, code: ir},
		hostile{name: "create key: invalid UTF-8 tenant id", method: "POST", path: "/v1/admin/tenants/%FF/keys", auth: "admin", body: `{}`, status: inv, code: ir},
		hostile{name: "list keys: NUL tenant id", method: "GET", path: "/v1/admin/tenants/%00/keys", auth: "admin", status: inv, code: ir},
		hostile{name: "list keys: invalid UTF-8 tenant id", method: "GET", path: "/v1/admin/tenants/%80/keys", auth: "admin", status: inv, code: ir},
		hostile{name: "rotate key: NUL kid", method: "POST", path: "/v1/admin/keys/%00/rotate", auth: "admin", status: inv, code: ir},
		hostile{name: "rotate key: invalid UTF-8 kid", method: "POST", path: "/v1/admin/keys/" + kid + "%FF/rotate", auth: "admin", status: inv, code: ir},
		hostile{name: "rotate key: overlong kid", method: "POST", path: "/v1/admin/keys/" + huge + "/rotate", auth: "admin", status: inv, code: ir},
		hostile{name: "revoke key: NUL kid", method: "DELETE", path: "/v1/admin/keys/%00", auth: "admin", status: inv, code: ir},
		hostile{name: "revoke key: invalid UTF-8 kid", method: "DELETE", path: "/v1/admin/keys/%FF", auth: "admin", status: inv, code: ir},
		hostile{name: "revoke key: kid with a NUL after a live one", method: "DELETE", path: "/v1/admin/keys/" + kid + "%00", auth: "admin", status: inv, code: ir},
		hostile{name: "revoke key: overlong kid", method: "DELETE", path: "/v1/admin/keys/" + huge, auth: "admin", status: inv, code: ir},
		hostile{name: "put agent: NUL name", method: "PUT", path: "/v1/admin/agents/%00", auth: "admin", body: `{"url":"http://127.0.0.1:1/"}`, status: inv, code: ir},
		hostile{name: "put agent: invalid UTF-8 name", method: "PUT", path: "/v1/admin/agents/%FF", auth: "admin", body: `{"url":"http://127.0.0.1:1/"}`, status: inv, code: ir},
		hostile{name: "get agent: NUL name", method: "GET", path: "/v1/admin/agents/%00", auth: "admin", status: inv, code: ir},
		hostile{name: "get agent: invalid UTF-8 name", method: "GET", path: "/v1/admin/agents/%FF", auth: "admin", status: inv, code: ir},
		hostile{name: "get agent: control character name", method: "GET", path: "/v1/admin/agents/echo%09", auth: "admin", status: inv, code: ir},
		hostile{name: "delete agent: NUL name", method: "DELETE", path: "/v1/admin/agents/%00", auth: "admin", status: inv, code: ir},
		hostile{name: "delete agent: invalid UTF-8 name", method: "DELETE", path: "/v1/admin/agents/echo%FF", auth: "admin", status: inv, code: ir},
		hostile{name: "delete agent: overlong name", method: "DELETE", path: "/v1/admin/agents/" + huge, auth: "admin", status: inv, code: ir},
		hostile{name: "rotate agent secret: NUL name", method: "POST", path: "/v1/admin/agents/%00/rotate-secret", auth: "admin", status: inv, code: ir},
		hostile{name: "rotate agent secret: invalid UTF-8 name", method: "POST", path: "/v1/admin/agents/echo%FF/rotate-secret", auth: "admin", status: inv, code: ir},
		hostile{name: "rotate agent secret: control character name", method: "POST", path: "/v1/admin/agents/echo%07/rotate-secret", auth: "admin", status: inv, code: ir},
		hostile{name: "rotate agent secret: tenant key", method: "POST", path: "/v1/admin/agents/echo/rotate-secret", auth: "key", status: un, code: ua},

		// The operator view's routes: query values are checked before any handler.
		hostile{name: "operator view: NUL in the filter", method: "GET", path: "/panel/admin?tenant=%00", status: inv, code: ir},
		hostile{name: "operator view: overlong filter", method: "GET", path: "/panel/admin?tenant=" + long, status: inv, code: ir},
		hostile{name: "operator view: invalid UTF-8 sort", method: "GET", path: "/panel/admin?sort=share%FF", status: inv, code: ir},
		hostile{name: "operator login form: control character in the query", method: "GET", path: "/panel/admin/login?x=%07", status: inv, code: ir},
		hostile{name: "operator login: NUL in the query", method: "POST", path: "/panel/admin/login?%00=1", status: inv, code: ir},
		hostile{name: "operator logout: invalid UTF-8 in the query", method: "POST", path: "/panel/admin/logout?x=%FF", status: inv, code: ir},
		hostile{name: "operator tenant status: NUL in the id", method: "POST", path: "/panel/admin/tenants/%00/status", status: inv, code: ir},
		hostile{name: "list credentials: tenant key", method: "GET", path: "/v1/admin/credentials", auth: "key", status: un, code: ua},
		hostile{name: "create credential: upper-case name", method: "POST", path: "/v1/admin/credentials", auth: "admin", body: `{"name":"Deploy","role":"operator"}`, status: inv, code: ir},
		hostile{name: "create credential: unknown role", method: "POST", path: "/v1/admin/credentials", auth: "admin", body: `{"name":"deploy","role":"root"}`, status: inv, code: ir},
		hostile{name: "rotate credential: none by that name", method: "POST", path: "/v1/admin/credentials/nobody/rotate", auth: "admin", status: nf, code: nfc},
		hostile{name: "revoke credential: invalid UTF-8 name", method: "DELETE", path: "/v1/admin/credentials/%FF", auth: "admin", status: inv, code: ir},
		hostile{name: "operator stylesheet: NUL in the query", method: "GET", path: "/panel/admin/assets/operator.css?v=%00", status: inv, code: ir},
		hostile{name: "operator script: semicolon query", method: "GET", path: "/panel/admin/assets/operator.js?a=1;b=2", status: inv, code: ir},

		// The request line.
		hostile{name: "raw NUL in the path", method: "GET", path: "/v1/tasks/\x00", auth: "key", status: inv},
		hostile{name: "unknown route with NUL", method: "GET", path: "/v1/%00", auth: "key", status: nf, code: nfc},
		hostile{name: "unknown method", method: "TRACE", path: "/v1/tasks", auth: "key", status: 405, code: "METHOD_NOT_ALLOWED"},
		hostile{name: "method with a control character", method: "GE\x01T", path: "/v1/tasks", auth: "key", status: inv},
	)
	return cs
}

// snapshot is what a rejected request must leave as it was: every table of the
// test's Postgres schema (row count and a digest of the rows) and every Redis key
// under the test's prefix (a digest of its value), except what a request may spend.
type snapshot map[string]string

// volatileKey names Redis keys that change without any request: worker and API
// replica heartbeats, the pool's generation, and the pool's in-flight count, which the
// dispatcher's timer raises and lowers again when a tick finds nothing to dispatch.
// Work a request queued shows in the tenant's queue, the shard sets and Postgres.
func volatileKey(name string) bool {
	for _, s := range []string{":workers", ":wslots", ":generation", "apis", "{g}:inflight"} {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

func (h *harness) snapshot(ctx context.Context) snapshot {
	h.t.Helper()
	snap := snapshot{}
	rows, err := h.app.Store().Pool().Query(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'`)
	if err != nil {
		h.t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		h.t.Fatal(err)
	}
	if len(tables) < 5 {
		h.t.Fatalf("snapshot sees %d tables: %v", len(tables), tables)
	}
	for _, tb := range tables {
		var n int64
		var sum string
		q := fmt.Sprintf(`SELECT count(*), coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '') FROM %s t`, pgx.Identifier{tb}.Sanitize())
		if err := h.app.Store().Pool().QueryRow(ctx, q).Scan(&n, &sum); err != nil {
			h.t.Fatal(err)
		}
		snap["pg:"+tb] = fmt.Sprintf("%d rows, md5 %s", n, sum)
	}
	var cursor uint64
	for {
		keys, next, err := h.app.Redis().Scan(ctx, cursor, h.app.Keys().Prefix()+"*", 1000).Result()
		if err != nil {
			h.t.Fatal(err)
		}
		for _, k := range keys {
			if volatileKey(k) {
				continue
			}
			snap["redis:"+k] = h.redisDigest(ctx, k)
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	return snap
}

// redisDigest digests a key's value. In a tenant's admission state hash the fields of
// its key buckets ("k:<kid>") and the hash's expiry marker ("x") are left out: every
// authenticated request spends one token of its key's bucket (the contract counts
// rejected requests too), and nothing else.
func (h *harness) redisDigest(ctx context.Context, k string) string {
	typ, err := h.app.Redis().Type(ctx, k).Result()
	if err != nil {
		h.t.Fatal(err)
	}
	if typ == "hash" && strings.Contains(k, ":adm:") {
		m, err := h.app.Redis().HGetAll(ctx, k).Result()
		if err != nil {
			h.t.Fatal(err)
		}
		var fields []string
		for f, v := range m {
			if strings.HasPrefix(f, "k:") || f == "x" {
				continue
			}
			fields = append(fields, f+"="+v)
		}
		sort.Strings(fields)
		return "hash " + strings.Join(fields, ",")
	}
	d, err := h.app.Redis().Dump(ctx, k).Result()
	if err != nil {
		return typ + " gone"
	}
	sum := sha256.Sum256([]byte(d))
	return typ + " " + hex.EncodeToString(sum[:8])
}

func (s snapshot) diff(after snapshot) []string {
	var out []string
	for k, v := range s {
		if w, ok := after[k]; !ok {
			out = append(out, "removed "+k)
		} else if w != v {
			out = append(out, fmt.Sprintf("changed %s: %s -> %s", k, v, w))
		}
	}
	for k := range after {
		if _, ok := s[k]; !ok {
			out = append(out, "added "+k)
		}
	}
	sort.Strings(out)
	return out
}

// rawRequest writes one request byte for byte on a new connection and reads the answer.
func rawRequest(t *testing.T, addr, method, path string, header map[string]string, body string) (*http.Response, []byte) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", method, path, addr)
	names := make([]string, 0, len(header))
	for k := range header {
		names = append(names, k)
	}
	sort.Strings(names)
	chunked := header["Transfer-Encoding"] == "chunked"
	for _, k := range names {
		fmt.Fprintf(&b, "%s: %s\r\n", k, header[k])
	}
	if !chunked && (body != "" || method == "POST" || method == "PUT" || method == "PATCH") {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n")
	if chunked {
		for rest := body; rest != ""; {
			n := min(len(rest), 64<<10)
			fmt.Fprintf(&b, "%x\r\n%s\r\n", n, rest[:n])
			rest = rest[n:]
		}
		b.WriteString("0\r\n\r\n")
	} else {
		b.WriteString(body)
	}
	// The server may answer (413) and close before reading the whole body.
	go func() { _, _ = io.WriteString(conn, b.String()) }()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s %q: reading the answer: %v", method, path, err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, raw
}

// TestHostileRequestCorpus sends every request of the corpus to a whole agentq process
// on real Redis and Postgres. Each gets its documented status and error body, none a
// 5xx, and none changes anything in Postgres or Redis beyond the key-bucket token an
// authenticated tenant request spends.
func TestHostileRequestCorpus(t *testing.T) {
	t.Parallel()
	h := start(t)
	ctx := context.Background()
	tc, k := h.tenantClient("acme", "pro", nil)
	key := k.Key
	if st, _ := h.do("PUT", "/v1/admin/agents/echo", h.admin, `{"url":"http://127.0.0.1:1/run"}`, nil); st != 201 {
		t.Fatalf("register the echo agent: %d", st)
	}
	task, err := tc.SubmitTask(ctx, sim(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, tc, task.ID, "completed", 20*time.Second)
	// A finished task's state settles (lease release, pool bookkeeping) shortly after
	// the state turns; wait until two snapshots agree.
	before := h.snapshot(ctx)
	for i := 0; ; i++ {
		time.Sleep(300 * time.Millisecond)
		again := h.snapshot(ctx)
		if d := before.diff(again); len(d) == 0 {
			break
		} else if i == 30 {
			t.Fatalf("the idle process keeps changing state: %v", d)
		}
		before = again
	}

	cases := corpus(task.ID, k.Kid)
	if len(cases) < 100 {
		t.Fatalf("the corpus has %d cases, want at least 100", len(cases))
	}
	addr := strings.TrimPrefix(h.base, "http://")
	covered := map[string]bool{}
	for _, c := range cases {
		hdr := map[string]string{"Content-Type": "application/json"}
		switch c.auth {
		case "":
		case "key":
			hdr["Authorization"] = "Bearer " + key
		case "admin":
			hdr["Authorization"] = "Bearer " + h.admin
		default:
			hdr["Authorization"] = strings.NewReplacer("{key}", key, "{admin}", h.admin).Replace(c.auth)
		}
		for k, v := range c.header {
			hdr[k] = v
		}
		resp, raw := rawRequest(t, addr, c.method, c.path, hdr, c.body)
		if resp.StatusCode >= 500 {
			t.Errorf("%s: %d %s", c.name, resp.StatusCode, raw)
		} else if resp.StatusCode != c.status {
			t.Errorf("%s: status %d %s, want %d %s", c.name, resp.StatusCode, trim(raw), c.status, c.code)
		}
		if c.code != "" || resp.StatusCode != 400 {
			var eb errBody
			if err := json.Unmarshal(raw, &eb); err != nil || !utf8.Valid(raw) {
				t.Errorf("%s: the body %q is not the JSON error body", c.name, trim(raw))
			} else if eb.Error.Code != c.code || strings.TrimSpace(eb.Error.Message) == "" {
				t.Errorf("%s: %d code %q message %q, want code %s with a message", c.name, resp.StatusCode, eb.Error.Code, eb.Error.Message, c.code)
			}
		}
		if strings.Contains(string(raw), key[len(key)-20:]) || strings.Contains(string(raw), h.admin) {
			t.Errorf("%s: the answer contains a credential", c.name)
		}
		// A request gives its request slot back just after its answer: the state is
		// compared once that release had its moment.
		after := h.snapshot(ctx)
		for wait := time.Now().Add(2 * time.Second); len(before.diff(after)) > 0 && time.Now().Before(wait); {
			time.Sleep(5 * time.Millisecond)
			after = h.snapshot(ctx)
		}
		if d := before.diff(after); len(d) > 0 {
			t.Errorf("%s: the rejected request changed state: %v", c.name, d)
			before = after
		}
		if route := h.routeOf(c.method, c.path); route != "" {
			covered[route] = true
		}
	}
	for _, r := range h.app.API().Echo().Routes() {
		if !covered[r.Method+" "+r.Path] {
			t.Errorf("no hostile request for %s %s", r.Method, r.Path)
		}
	}
	t.Logf("%d hostile requests", len(cases))
}

// routeOf names the registered route a request path matches ("" when none).
func (h *harness) routeOf(method, path string) string {
	path, _, _ = strings.Cut(path, "?")
	segs := strings.Split(path, "/")
	best, params := "", len(segs)+1
	for _, r := range h.app.API().Echo().Routes() {
		if r.Method != method {
			continue
		}
		rs := strings.Split(r.Path, "/")
		if len(rs) != len(segs) {
			continue
		}
		ok, n := true, 0
		for i := range rs {
			if strings.HasPrefix(rs[i], ":") {
				n++
			} else if rs[i] != segs[i] {
				ok = false
				break
			}
		}
		// A static segment wins over a parameter, as in the router (/audit/head, not
		// /audit/:id).
		if ok && n < params {
			best, params = r.Method+" "+r.Path, n
		}
	}
	return best
}

func trim(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}
