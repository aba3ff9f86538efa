package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/internal/testenv"
	webapi "github.com/agentq/agentq/web/api"
)

// adminHarness is a server (API role) and the admin CLI on one database and Redis, the
// CLI with the server's plan catalogue.
type adminHarness struct {
	store *store.Store // the database both write to, to see what they left
	base  string
	token string // the admin token
	// api sends an admin request and returns the status and the error message, if any.
	api func(method, path, body string) (int, string)
	// cli runs `agentq admin args...` and returns what it printed and its error.
	cli func(args ...string) (string, error)
	// rdb and keys are the Redis both use, and its key names.
	rdb  redis.UniversalClient
	keys rkeys.Keys
}

func newAdminHarness(t *testing.T) adminHarness {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	rdb, keys := testenv.Redis(t, 1)

	cfg := agentq.DefaultConfig()
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.AdminToken = "admin-" + testenv.ID()
	cfg.AdminTokens = []agentq.AdminCredential{{Name: "ci", Role: agentqtype.RoleOperator, Token: "ci-" + testenv.ID()}}
	cfg.RedisPrefix = keys.Prefix()
	cfg.Roles = []string{agentq.RoleAPI}
	app, err := agentq.New(ctx, agentq.Options{Config: cfg, Redis: rdb, Pool: pool, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = app.Shutdown(sctx)
	})
	base := "http://" + app.Addr().String()
	api := func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+cfg.AdminToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var eb struct {
			Error struct{ Code, Message string }
		}
		raw, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(raw, &eb)
		return resp.StatusCode, eb.Error.Message
	}

	// The CLI on the same database and Redis, with the server's catalogue.
	plans, err := tenants.LoadCatalogue(cfg)
	if err != nil {
		t.Fatal(err)
	}
	open := func(ctx context.Context, withRedis bool) (adminEnv, func(), error) {
		var r redis.UniversalClient
		if withRedis {
			r = rdb
		}
		return adminServices(pool, plans, r, keys, nil, envAdmins{token: cfg.AdminToken, tokens: cfg.AdminTokens}), func() {}, nil
	}
	cli := func(args ...string) (string, error) {
		t.Helper()
		cmd := newAdminCmd(open)
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(io.Discard)
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		cmd.SetArgs(args)
		err := cmd.ExecuteContext(ctx)
		return out.String(), err
	}

	return adminHarness{store: store.New(pool), base: base, token: cfg.AdminToken, api: api, cli: cli, rdb: rdb, keys: keys}
}

// TestCLIRefusesWhatTheAPIRefuses feeds the same invalid tenants to the admin API and
// to `agentq admin tenant-create` / `tenant-update`, on one database, and wants the
// same refusal from both, and nothing written.
func TestCLIRefusesWhatTheAPIRefuses(t *testing.T) {
	ctx := context.Background()
	h := newAdminHarness(t)
	base, api, cli := h.base, h.api, h.cli

	if st, msg := api("POST", "/v1/admin/tenants", `{"id":"acme","plan":"pro"}`); st != 201 {
		t.Fatalf("create acme: %d %s", st, msg)
	}
	keyMsg := "overrides: key_rate unlimited disables key limits while tenant_rate is on; set tenant_rate to unlimited too, or keep a key_rate."
	for _, tc := range []struct {
		name   string
		method string
		path   string
		body   string
		args   []string
		msg    string
	}{
		{"bad id", "POST", "/v1/admin/tenants", `{"id":"bad id!","plan":"pro"}`,
			[]string{"tenant-create", "--id", "bad id!", "--plan", "pro"},
			"id is required: 1 to 63 letters, digits, '-' or '_', starting with a letter or digit."},
		{"empty id", "POST", "/v1/admin/tenants", `{"id":"","plan":"pro"}`,
			[]string{"tenant-create", "--id=", "--plan", "pro"},
			"id is required: 1 to 63 letters, digits, '-' or '_', starting with a letter or digit."},
		{"negative weight", "POST", "/v1/admin/tenants", `{"id":"w1","plan":"pro","weight":-1}`,
			[]string{"tenant-create", "--id", "w1", "--plan", "pro", "--weight", "-1"},
			"weight must be between 1 and 1000."},
		{"weight 0", "POST", "/v1/admin/tenants", `{"id":"w1","plan":"pro","weight":0}`,
			[]string{"tenant-create", "--id", "w1", "--plan", "pro", "--weight", "0"},
			"weight must be between 1 and 1000."},
		{"weight too large", "POST", "/v1/admin/tenants", `{"id":"w1","plan":"pro","weight":1001}`,
			[]string{"tenant-create", "--id", "w1", "--plan", "pro", "--weight", "1001"},
			"weight must be between 1 and 1000."},
		{"unknown plan", "POST", "/v1/admin/tenants", `{"id":"p1","plan":"gold"}`,
			[]string{"tenant-create", "--id", "p1", "--plan", "gold"},
			`Unknown plan "gold" (plans: enterprise, free, pro).`},
		{"unknown override", "POST", "/v1/admin/tenants", `{"id":"o1","plan":"pro","overrides":{"bogus":1}}`,
			[]string{"tenant-create", "--id", "o1", "--plan", "pro", "--overrides", `{"bogus":1}`},
			`overrides: unknown limit "bogus".`},
		{"key_rate unlimited with tenant_rate on", "POST", "/v1/admin/tenants", `{"id":"k1","plan":"pro","overrides":{"key_rate":"unlimited"}}`,
			[]string{"tenant-create", "--id", "k1", "--plan", "pro", "--overrides", `{"key_rate":"unlimited"}`},
			keyMsg},
		{"control character in name", "POST", "/v1/admin/tenants", `{"id":"n1","plan":"pro","name":"a\b"}`,
			[]string{"tenant-create", "--id", "n1", "--plan", "pro", "--name", "a\b"},
			"name must be 1 to 200 bytes of text without control characters."},
		{"update: weight too large", "PATCH", "/v1/admin/tenants/acme", `{"weight":5000}`,
			[]string{"tenant-update", "acme", "--weight", "5000"},
			"weight must be between 1 and 1000."},
		{"update: unknown plan", "PATCH", "/v1/admin/tenants/acme", `{"plan":"gold"}`,
			[]string{"tenant-update", "acme", "--plan", "gold"},
			`Unknown plan "gold" (plans: enterprise, free, pro).`},
		{"update: unknown override", "PATCH", "/v1/admin/tenants/acme", `{"overrides":{"bogus":1}}`,
			[]string{"tenant-update", "acme", "--overrides", `{"bogus":1}`},
			`overrides: unknown limit "bogus".`},
		{"update: key_rate unlimited with tenant_rate on", "PATCH", "/v1/admin/tenants/acme", `{"overrides":{"key_rate":"unlimited"}}`,
			[]string{"tenant-update", "acme", "--overrides", `{"key_rate":"unlimited"}`},
			keyMsg},
		{"unknown time zone", "POST", "/v1/admin/tenants", `{"id":"z1","plan":"pro","time_zone":"Mars/Olympus"}`,
			[]string{"tenant-create", "--id", "z1", "--plan", "pro", "--time-zone", "Mars/Olympus"},
			`time_zone "Mars/Olympus" is not an IANA time zone name (such as Europe/Paris or UTC).`},
		{"machine-local time zone", "POST", "/v1/admin/tenants", `{"id":"z1","plan":"pro","time_zone":"Local"}`,
			[]string{"tenant-create", "--id", "z1", "--plan", "pro", "--time-zone", "Local"},
			`time_zone "Local" is not an IANA time zone name (such as Europe/Paris or UTC).`},
		{"billing day 0", "POST", "/v1/admin/tenants", `{"id":"d1","plan":"pro","billing_day":0}`,
			[]string{"tenant-create", "--id", "d1", "--plan", "pro", "--billing-day", "0"},
			"billing_day must be between 1 and 31 (a month without that day starts its period on its last day)."},
		{"update: unknown time zone", "PATCH", "/v1/admin/tenants/acme", `{"time_zone":"../etc/passwd"}`,
			[]string{"tenant-update", "acme", "--time-zone", "../etc/passwd"},
			`time_zone "../etc/passwd" is not an IANA time zone name (such as Europe/Paris or UTC).`},
		{"update: billing day 32", "PATCH", "/v1/admin/tenants/acme", `{"billing_day":32}`,
			[]string{"tenant-update", "acme", "--billing-day", "32"},
			"billing_day must be between 1 and 31 (a month without that day starts its period on its last day)."},
		{"update: bad status", "PATCH", "/v1/admin/tenants/acme", `{"status":"gone"}`,
			[]string{"tenant-update", "acme", "--status", "gone"},
			"status must be active or suspended."},
	} {
		st, apiMsg := api(tc.method, tc.path, tc.body)
		if st != 400 || apiMsg != tc.msg {
			t.Errorf("%s: API %d %q, want 400 %q", tc.name, st, apiMsg, tc.msg)
		}
		out, err := cli(tc.args...)
		if err == nil || err.Error() != apiMsg {
			t.Errorf("%s: CLI %v (output %q), want the API's refusal %q", tc.name, err, out, apiMsg)
		}
	}

	// Nothing refused was written, by either path.
	ts, err := h.store.UnscopedListTenants(ctx)
	if err != nil || len(ts) != 1 || ts[0].ID != "acme" || ts[0].Plan != "pro" || ts[0].Weight != nil || len(ts[0].Overrides) != 0 || ts[0].Status != "active" {
		t.Fatalf("tenants after the refusals: %+v %v", ts, err)
	}

	// What the API accepts, the CLI accepts too.
	out, err := cli("tenant-create", "--id", "cli1", "--plan", "enterprise", "--weight", "7", "--overrides", `{"key_rate":"unlimited","tenant_rate":"unlimited"}`)
	if err != nil {
		t.Fatalf("CLI create: %v", err)
	}
	var created webapi.TenantJSON
	if err := json.Unmarshal([]byte(out), &created); err != nil || created.ID != "cli1" || created.Name != "cli1" || *created.Weight != 7 {
		t.Fatalf("CLI create printed %q (%v)", out, err)
	}
	out, err = cli("tenant-create", "--id", "cli2", "--plan", "pro", "--billing-day", "31", "--time-zone", "Europe/Paris")
	if err != nil || !strings.Contains(out, `"billing_day": 31`) || !strings.Contains(out, `"time_zone": "Europe/Paris"`) {
		t.Fatalf("CLI create with a billing anchor: %q %v", out, err)
	}
	if st, msg := api("PATCH", "/v1/admin/tenants/cli2", `{"time_zone":"America/New_York","billing_day":15}`); st != 200 {
		t.Fatalf("API anchor change: %d %s", st, msg)
	}
	if _, err := cli("tenant-update", "cli1", "--status", "suspended", "--weight", "3"); err != nil {
		t.Fatalf("CLI update: %v", err)
	}
	var tj struct {
		Status          string `json:"status"`
		EffectiveWeight int    `json:"effective_weight"`
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		req, _ := http.NewRequest("GET", base+"/v1/admin/tenants/cli1", nil)
		req.Header.Set("Authorization", "Bearer "+h.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = json.NewDecoder(resp.Body).Decode(&tj)
		resp.Body.Close()
		if tj.Status == "suspended" && tj.EffectiveWeight == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the API shows %+v after the CLI update, want suspended with weight 3", tj)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := cli("tenant-update", "ghost", "--weight", "2"); err == nil {
		t.Errorf("CLI update of a missing tenant succeeded")
	}
}

// TestCLIKeysRefuseWhatTheAPIRefuses feeds the same invalid key requests to the admin
// API and to `agentq admin key-*`, and wants the same refusal from both and nothing
// written; then it checks that keys the CLI creates, rotates and revokes are honoured
// and refused by the running server accordingly.
func TestCLIKeysRefuseWhatTheAPIRefuses(t *testing.T) {
	ctx := context.Background()
	h := newAdminHarness(t)
	if st, msg := h.api("POST", "/v1/admin/tenants", `{"id":"acme","plan":"pro"}`); st != 201 {
		t.Fatalf("create acme: %d %s", st, msg)
	}
	// A key to revoke, so that "revoked" is among the unknown kids.
	out, err := h.cli("key-create", "acme")
	if err != nil {
		t.Fatal(err)
	}
	var gone struct{ Kid, Key string }
	if err := json.Unmarshal([]byte(out), &gone); err != nil || gone.Kid == "" {
		t.Fatalf("key-create printed %q (%v)", out, err)
	}
	if st, msg := h.api("DELETE", "/v1/admin/keys/"+gone.Kid, ""); st != 204 {
		t.Fatalf("revoke %s: %d %s", gone.Kid, st, msg)
	}

	scopeMsg := "Scope entries must be 1 to 255 bytes without control characters."
	long := strings.Repeat("a", 256)
	for _, tc := range []struct {
		name   string
		method string
		path   string
		body   string
		args   []string
		status int
		msg    string
	}{
		{"control character in an agent", "POST", "/v1/admin/tenants/acme/keys", `{"scopes":{"agents":["si\u0001m"]}}`,
			[]string{"key-create", "acme", "--agents", "si\x01m"}, 400, scopeMsg},
		{"control character in a principal", "POST", "/v1/admin/tenants/acme/keys", `{"scopes":{"principals":["u1","u\u007f2"]}}`,
			[]string{"key-create", "acme", "--principals", "u1,u\x7f2"}, 400, scopeMsg},
		{"agent too long", "POST", "/v1/admin/tenants/acme/keys", `{"scopes":{"agents":["` + long + `"]}}`,
			[]string{"key-create", "acme", "--agents", long}, 400, scopeMsg},
		{"bad scope for an unknown tenant", "POST", "/v1/admin/tenants/ghost/keys", `{"scopes":{"agents":["` + long + `"]}}`,
			[]string{"key-create", "ghost", "--agents", long}, 400, scopeMsg},
		{"create for an unknown tenant", "POST", "/v1/admin/tenants/ghost/keys", `{}`,
			[]string{"key-create", "ghost"}, 404, `No tenant "ghost".`},
		{"list of an unknown tenant", "GET", "/v1/admin/tenants/ghost/keys", "",
			[]string{"key-list", "ghost"}, 404, `No tenant "ghost".`},
		{"rotate an unknown kid", "POST", "/v1/admin/keys/acme-00000000/rotate", "",
			[]string{"key-rotate", "acme-00000000"}, 404, `No live key "acme-00000000".`},
		{"rotate a malformed kid", "POST", "/v1/admin/keys/nonsense/rotate", "",
			[]string{"key-rotate", "nonsense"}, 404, `No live key "nonsense".`},
		{"rotate a revoked key", "POST", "/v1/admin/keys/" + gone.Kid + "/rotate", "",
			[]string{"key-rotate", gone.Kid}, 404, `No live key "` + gone.Kid + `".`},
		{"revoke an unknown kid", "DELETE", "/v1/admin/keys/acme-00000000", "",
			[]string{"key-revoke", "acme-00000000"}, 404, `No live key "acme-00000000".`},
		{"revoke a malformed kid", "DELETE", "/v1/admin/keys/nonsense", "",
			[]string{"key-revoke", "nonsense"}, 404, `No live key "nonsense".`},
		{"revoke a revoked key", "DELETE", "/v1/admin/keys/" + gone.Kid, "",
			[]string{"key-revoke", gone.Kid}, 404, `No live key "` + gone.Kid + `".`},
	} {
		st, apiMsg := h.api(tc.method, tc.path, tc.body)
		if st != tc.status || apiMsg != tc.msg {
			t.Errorf("%s: API %d %q, want %d %q", tc.name, st, apiMsg, tc.status, tc.msg)
		}
		out, err := h.cli(tc.args...)
		if err == nil || err.Error() != apiMsg {
			t.Errorf("%s: CLI %v (output %q), want the API's refusal %q", tc.name, err, out, apiMsg)
		}
	}
	if ks, err := h.store.ListKeys(ctx, store.ListKeysParams{TenantID: "acme"}); err != nil || len(ks) != 1 || ks[0].Kid != gone.Kid {
		t.Fatalf("keys after the refusals: %+v %v, want only %s", ks, err, gone.Kid)
	}
	if ks, err := h.store.ListKeys(ctx, store.ListKeysParams{TenantID: "ghost"}); err != nil || len(ks) != 0 {
		t.Fatalf("keys of ghost: %+v %v", ks, err)
	}

	// What the API accepts, the CLI accepts too, and the server honours it.
	status := func(key string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", h.base+"/v1/tasks", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// Rotation and revocation reach the server through Redis (and in any case within
	// its caches' one-second life).
	eventually := func(what, key string, want int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for st := status(key); st != want; st = status(key) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the API answers %d, want %d", what, st, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	out, err = h.cli("key-create", "acme", "--agents", "sim, echo", "--principals", "u1")
	if err != nil {
		t.Fatalf("CLI key-create: %v", err)
	}
	var k struct{ Kid, Key string }
	if err := json.Unmarshal([]byte(out), &k); err != nil || k.Kid == "" || k.Key == "" {
		t.Fatalf("key-create printed %q (%v)", out, err)
	}
	eventually("a key the CLI created", k.Key, 200)

	out, err = h.cli("key-list", "acme")
	if err != nil {
		t.Fatalf("CLI key-list: %v", err)
	}
	var listed []webapi.KeyJSON
	if err := json.Unmarshal([]byte(out), &listed); err != nil || len(listed) != 2 || listed[1].Kid != k.Kid ||
		strings.Join(listed[1].Scopes.Agents, ",") != "sim,echo" || strings.Join(listed[1].Scopes.Principals, ",") != "u1" {
		t.Fatalf("key-list printed %q (%v)", out, err)
	}
	if strings.Contains(out, "secret") {
		t.Errorf("key-list shows secrets: %s", out)
	}

	out, err = h.cli("key-rotate", k.Kid)
	if err != nil {
		t.Fatalf("CLI key-rotate: %v", err)
	}
	var r struct{ Kid, Key string }
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Kid != k.Kid || r.Key == k.Key {
		t.Fatalf("key-rotate printed %q (%v)", out, err)
	}
	eventually("the old secret after a CLI rotation", k.Key, 401)
	eventually("the new secret after a CLI rotation", r.Key, 200)

	out, err = h.cli("key-revoke", k.Kid)
	if err != nil || strings.TrimSpace(out) != "revoked "+k.Kid {
		t.Fatalf("CLI key-revoke: %q %v", out, err)
	}
	eventually("a key the CLI revoked", r.Key, 401)
	if _, err := h.cli("key-revoke", k.Kid); err == nil || err.Error() != `No live key "`+k.Kid+`".` {
		t.Errorf("revoking twice through the CLI: %v", err)
	}
}

// The webhook commands go through the service the API uses: the same refusals, the
// same endpoints, a secret printed only by create and rotate.
func TestCLIWebhooksMatchTheAPI(t *testing.T) {
	h := newAdminHarness(t)
	if st, msg := h.api("POST", "/v1/admin/tenants", `{"id":"acme","plan":"pro"}`); st != 201 {
		t.Fatalf("create acme: %d %s", st, msg)
	}
	for _, tc := range []struct {
		name, body string
		args       []string
	}{
		{"relative url", `{"url":"/x","types":["usage.limit_hit"]}`, []string{"webhook-create", "--url", "/x", "--types", "usage.limit_hit"}},
		{"unknown type", `{"url":"http://x/","types":["usage.other"]}`, []string{"webhook-create", "--url", "http://x/", "--types", "usage.other"}},
		{"unknown tenant", `{"url":"http://x/","types":["usage.limit_hit"],"tenant":"nope"}`, []string{"webhook-create", "--url", "http://x/", "--tenant", "nope"}},
	} {
		st, apiMsg := h.api("POST", "/v1/admin/webhooks", tc.body)
		if st != 400 || apiMsg == "" {
			t.Errorf("%s: API %d %q, want 400", tc.name, st, apiMsg)
		}
		if out, err := h.cli(tc.args...); err == nil || err.Error() != apiMsg {
			t.Errorf("%s: CLI %v (output %q), want the API's refusal %q", tc.name, err, out, apiMsg)
		}
	}
	out, err := h.cli("webhook-create", "--url", "https://hooks.example/in", "--tenant", "acme")
	if err != nil {
		t.Fatal(err)
	}
	var created webapi.WebhookWithSecret
	if err := json.Unmarshal([]byte(out), &created); err != nil || !strings.HasPrefix(created.Secret, "whsec_") ||
		len(created.Types) != 2 || created.Tenant == nil || *created.Tenant != "acme" {
		t.Fatalf("CLI create printed %q (%v)", out, err)
	}
	if st, msg := h.api("GET", "/v1/admin/webhooks/"+created.ID, ""); st != 200 {
		t.Fatalf("API get of the CLI's endpoint: %d %s", st, msg)
	}
	out, err = h.cli("webhook-list")
	if err != nil || !strings.Contains(out, created.ID) || strings.Contains(out, "whsec_") || strings.Contains(out, `"secret"`) {
		t.Fatalf("CLI list %q %v: want the endpoint, no secret", out, err)
	}
	out, err = h.cli("webhook-rotate", created.ID)
	var rotated webapi.WebhookWithSecret
	if err != nil || json.Unmarshal([]byte(out), &rotated) != nil || rotated.Secret == created.Secret || rotated.PreviousSecretExpiresAt == nil {
		t.Fatalf("CLI rotate %q %v", out, err)
	}
	if _, err := h.cli("webhook-delete", created.ID); err != nil {
		t.Fatal(err)
	}
	if st, _ := h.api("GET", "/v1/admin/webhooks/"+created.ID, ""); st != 404 {
		t.Errorf("API get after the CLI's delete: %d, want 404", st)
	}
	if _, err := h.cli("webhook-delete", created.ID); err == nil || !strings.Contains(err.Error(), "No webhook endpoint") {
		t.Errorf("CLI second delete: %v", err)
	}
}

// The tenant-webhook commands manage a tenant's own endpoints through the service the
// tenant API uses: the same limit, the same scoping.
func TestCLITenantWebhooks(t *testing.T) {
	h := newAdminHarness(t)
	for _, id := range []string{"acme", "globex"} {
		if st, msg := h.api("POST", "/v1/admin/tenants", `{"id":"`+id+`","plan":"pro"}`); st != 201 {
			t.Fatalf("create %s: %d %s", id, st, msg)
		}
	}
	var ids []string
	for _, u := range []string{"https://acme.example/a", "https://acme.example/b"} {
		out, err := h.cli("tenant-webhook-create", "--tenant", "acme", "--url", u)
		var created webapi.WebhookWithSecret
		if err != nil || json.Unmarshal([]byte(out), &created) != nil || !strings.HasPrefix(created.Secret, "whsec_") || created.Owner != "tenant" {
			t.Fatalf("CLI create %q %v", out, err)
		}
		ids = append(ids, created.ID)
	}
	if _, err := h.cli("tenant-webhook-create", "--tenant", "acme", "--url", "https://acme.example/c"); err == nil ||
		!strings.Contains(err.Error(), "limit of 2") {
		t.Errorf("a third for a pro tenant: %v, want the limit", err)
	}
	if _, err := h.cli("tenant-webhook-create", "--tenant", "acme", "--url", "http://169.254.169.254/"); err == nil ||
		!strings.Contains(err.Error(), "refused") {
		t.Errorf("a link-local address: %v", err)
	}
	out, err := h.cli("tenant-webhook-list", "--tenant", "globex")
	if err != nil || strings.Contains(out, ids[0]) {
		t.Errorf("globex's list %q %v shows acme's", out, err)
	}
	if _, err := h.cli("tenant-webhook-rotate", "--tenant", "globex", ids[0]); err == nil || !strings.Contains(err.Error(), "No webhook endpoint") {
		t.Errorf("globex rotates acme's: %v", err)
	}
	if _, err := h.cli("tenant-webhook-delete", "--tenant", "globex", ids[0]); err == nil {
		t.Error("globex deleted acme's endpoint")
	}
	if out, err := h.cli("tenant-webhook-rotate", "--tenant", "acme", ids[0]); err != nil || !strings.Contains(out, "whsec_") {
		t.Errorf("acme rotates its own: %q %v", out, err)
	}
	if _, err := h.cli("tenant-webhook-delete", "--tenant", "acme", ids[0]); err != nil {
		t.Fatal(err)
	}
	if out, err := h.cli("tenant-webhook-list", "--tenant", "acme"); err != nil || strings.Contains(out, ids[0]) || !strings.Contains(out, ids[1]) {
		t.Errorf("acme's list after a delete: %q %v", out, err)
	}
}

// `agentq admin panel-links-revoke` revokes a tenant's panel links as the admin API
// does: it tells the running server's cache the tenant changed, and a link issued
// before is refused from then on.
func TestCLIRevokesPanelLinks(t *testing.T) {
	t.Parallel()
	h := newAdminHarness(t)
	if st, msg := h.api("POST", "/v1/admin/tenants", `{"id":"plink","plan":"pro"}`); st != 201 {
		t.Fatalf("create tenant: %d %s", st, msg)
	}
	req, _ := http.NewRequest("POST", h.base+"/v1/admin/tenants/plink/panel-links", nil)
	req.Header.Set("Authorization", "Bearer "+h.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var link webapi.PanelLink
	err = json.NewDecoder(resp.Body).Decode(&link)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("panel link: %d %v", resp.StatusCode, err)
	}
	usage := strings.Replace(link.URL, "/panel/t?", "/panel/t/usage?", 1)
	status := func() int {
		t.Helper()
		r, err := http.Get(usage)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		return r.StatusCode
	}
	if st := status(); st != 200 {
		t.Fatalf("the link before revocation: %d", st)
	}
	changes := h.rdb.Subscribe(context.Background(), h.keys.KeysChangedChannel())
	defer changes.Close()
	if _, err := changes.Receive(context.Background()); err != nil {
		t.Fatal(err)
	}
	out, err := h.cli("panel-links-revoke", "plink")
	var got webapi.PanelLinksRevoked
	if err != nil || json.Unmarshal([]byte(out), &got) != nil || got.TenantID != "plink" || got.LinksValidAfter.IsZero() {
		t.Fatalf("panel-links-revoke: %q %v", out, err)
	}
	select {
	case m := <-changes.Channel():
		if m.Payload != rkeys.TenantChanged("plink") {
			t.Fatalf("the CLI's change message: %q, want the tenant's", m.Payload)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the CLI told the running server's cache nothing")
	}
	// The server drops its cached tenant when its cache listener reads that message,
	// on a goroutine of its own: the link is refused from then on.
	for deadline := time.Now().Add(10 * time.Second); ; {
		st := status()
		if st == 403 {
			break
		}
		if st != 200 || time.Now().After(deadline) {
			t.Fatalf("the link after the CLI revoked it: %d, want 403", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := h.cli("panel-links-revoke", "nobody"); err == nil {
		t.Fatal("revoking an unknown tenant's links succeeded")
	}
}
