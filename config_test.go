package agentq_test

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/internal/testenv"
)

func TestDefaultConfigIsValid(t *testing.T) {
	if err := agentq.DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig().Validate() = %v", err)
	}
}

// Each refused value is refused with an error that names its field, and New refuses
// it before connecting to anything.
func TestConfigValidateNamesTheBadField(t *testing.T) {
	neg, nan := -1.0, math.NaN()
	for _, tc := range []struct {
		field string
		bad   func(*agentq.Config)
	}{
		{"Roles", func(c *agentq.Config) { c.Roles = nil }},
		{"Roles", func(c *agentq.Config) { c.Roles = []string{"api", "cook"} }},
		{"Roles", func(c *agentq.Config) { c.Roles = []string{"api", "api"} }},
		{"HTTPAddr", func(c *agentq.Config) { c.HTTPAddr = "" }},
		{"RedisURL", func(c *agentq.Config) { c.RedisURL = "" }},
		{"RedisURL", func(c *agentq.Config) { c.RedisURL = "http://127.0.0.1:6379" }},
		{"DatabaseURL", func(c *agentq.Config) { c.DatabaseURL = "" }},
		{"DatabaseURL", func(c *agentq.Config) { c.DatabaseURL = "postgres://u:hunter2@h:notaport/db" }},
		{"RedisPrefix", func(c *agentq.Config) { c.RedisPrefix = "" }},
		{"Shards", func(c *agentq.Config) { c.Shards = 0 }},
		{"WorkerConcurrency", func(c *agentq.Config) { c.WorkerConcurrency = 0 }},
		{"Prefetch", func(c *agentq.Config) { c.Prefetch = -1 }},
		{"WorkerFetchers", func(c *agentq.Config) { c.WorkerFetchers = 0 }},
		{"ShutdownTimeout", func(c *agentq.Config) { c.ShutdownTimeout = 0 }},
		{"RedisTimeout", func(c *agentq.Config) { c.RedisTimeout = -time.Second }},
		{"JanitorInterval", func(c *agentq.Config) { c.JanitorInterval = 0 }},
		{"WebhookRetention", func(c *agentq.Config) { c.WebhookRetention = 0 }},
		{"RateKeyRPS", func(c *agentq.Config) { c.RateKeyRPS = &neg }},
		{"TenantMaxInflight", func(c *agentq.Config) { c.TenantMaxInflight = &nan }},
	} {
		cfg := agentq.DefaultConfig()
		tc.bad(&cfg)
		err := cfg.Validate()
		var ce *agentq.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: Validate() = %v, want a *ConfigError naming %s", tc.field, err, tc.field)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: the error shows the password: %v", tc.field, err)
		}
		// Nothing listens on port 1: had New tried to connect, it would fail otherwise.
		if tc.field != "RedisURL" {
			cfg.RedisURL = "redis://127.0.0.1:1/0"
		}
		if tc.field != "DatabaseURL" {
			cfg.DatabaseURL = "postgres://postgres@127.0.0.1:1/none"
		}
		if _, err := agentq.New(context.Background(), agentq.Options{Config: cfg}); !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("%s: New = %v, want the *ConfigError", tc.field, err)
		}
	}
	// A Redis or a pool given to New stands for its URL.
	cfg := agentq.DefaultConfig()
	cfg.RedisURL, cfg.DatabaseURL = "", ""
	rdb, _ := testenv.Redis(t, 1)
	if _, err := agentq.New(context.Background(), agentq.Options{Config: cfg, Redis: rdb}); !strings.Contains(err.Error(), "DatabaseURL") {
		t.Errorf("New with a Redis and no DatabaseURL = %v, want DatabaseURL refused", err)
	}
}

// A process that pauses tasks (the worker role) without the API in it signs approval
// links another process checks: it refuses a configuration without a secret shared
// with the API, and says so (where the links point is settled at Start, from
// PublicURL or the API's advertised address). One process with every role, as
// `agentq serve` and `agentq dev` run, needs no shared secret.
func TestSplitWorkerNeedsASharedSecret(t *testing.T) {
	worker := func(mod func(*agentq.Config)) error {
		cfg := agentq.DefaultConfig()
		cfg.Roles = []string{agentq.RoleWorker}
		mod(&cfg)
		return cfg.Validate()
	}
	for _, tc := range []struct {
		name, field string
		mod         func(*agentq.Config)
	}{
		{"no secret", "PanelSecret", func(c *agentq.Config) { c.PublicURL = "https://agentq.example.com" }},
	} {
		err := worker(tc.mod)
		var ce *agentq.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(err.Error(), "approval links") {
			t.Errorf("%s: Validate() = %v, want a *ConfigError naming %s and the approval links", tc.name, err, tc.field)
		}
	}
	for _, mod := range []func(*agentq.Config){
		func(c *agentq.Config) { c.PublicURL, c.PanelSecret = "https://agentq.example.com", "s" },
		func(c *agentq.Config) { c.PanelSecret = "s" },
		func(c *agentq.Config) { c.PublicURL, c.AdminToken = "https://agentq.example.com", "t" },
		func(c *agentq.Config) { c.Roles = append(c.Roles, agentq.RoleAPI) },
		func(c *agentq.Config) { c.Roles = []string{agentq.RoleScheduler, agentq.RoleJanitor} },
	} {
		if err := worker(mod); err != nil {
			t.Errorf("Validate() = %v, want nil", err)
		}
	}
}

// Every field of Config documents its default, and the default it documents is
// DefaultConfig's.
func TestConfigDocumentsEveryDefault(t *testing.T) {
	docs := configFieldDocs(t)
	def := reflect.ValueOf(agentq.DefaultConfig())
	typ := def.Type()
	for i := range typ.NumField() {
		f := typ.Field(i)
		doc, ok := docs[f.Name]
		if !ok {
			t.Errorf("Config.%s has no doc comment", f.Name)
			continue
		}
		var want string
		switch v := def.Field(i).Interface().(type) {
		case string:
			want = strconv.Quote(v)
		case int:
			want = strconv.Itoa(v)
		case time.Duration:
			want = v.String()
			if strings.HasSuffix(want, "m0s") { // "5m", as people write it
				want = strings.TrimSuffix(want, "0s")
			}
			if strings.HasSuffix(want, "h0m") { // "720h"
				want = strings.TrimSuffix(want, "0m")
			}
		case []string:
			want = "all five"
			if len(v) == 0 {
				want = "none"
			} else if len(v) != 5 {
				t.Errorf("Config.%s: default %v, the doc says all five roles", f.Name, v)
			}
		case []netip.Prefix:
			want = "none"
			if len(v) != 0 {
				t.Errorf("Config.%s: default %v, the doc says none", f.Name, v)
			}
		case []agentq.AdminCredential:
			want = "none"
			if len(v) != 0 {
				t.Errorf("Config.%s: default %v, the doc says none", f.Name, v)
			}
		case *float64:
			want = "nil"
			if v != nil {
				want = strconv.FormatFloat(*v, 'g', -1, 64)
			}
		default:
			t.Fatalf("Config.%s: no rule for a field of type %T", f.Name, v)
		}
		if !strings.Contains(doc, "default "+want) {
			t.Errorf("Config.%s: its doc %q does not say \"default %s\"", f.Name, doc, want)
		}
	}
}

// configFieldDocs reads the doc comments of Config's fields from
// internal/config/config.go, where the type is defined, with whitespace collapsed.
func configFieldDocs(t *testing.T) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "internal/config/config.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != "Config" {
			return true
		}
		for _, fld := range ts.Type.(*ast.StructType).Fields.List {
			for _, name := range fld.Names {
				docs[name.Name] = strings.Join(strings.Fields(fld.Doc.Text()), " ")
			}
		}
		return false
	})
	if len(docs) == 0 {
		t.Fatal("config.go: no Config struct found")
	}
	return docs
}

// AGENTQ_WEBHOOK_ALLOW_NETS is read as comma-separated CIDRs (a bare address is its
// own network); anything else is refused, naming the variable.
func TestConfigFromEnvReadsWebhookAllowNets(t *testing.T) {
	t.Setenv("AGENTQ_WEBHOOK_ALLOW_NETS", "127.0.0.0/8, fd00::/8,10.1.2.3")
	cfg, err := agentq.ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("fd00::/8"), netip.MustParsePrefix("10.1.2.3/32")}
	if !reflect.DeepEqual(cfg.WebhookAllowNets, want) {
		t.Errorf("WebhookAllowNets %v, want %v", cfg.WebhookAllowNets, want)
	}
	t.Setenv("AGENTQ_WEBHOOK_ALLOW_NETS", "10.0.0.0/8,intranet")
	if _, err := agentq.ConfigFromEnv(); err == nil || !strings.Contains(err.Error(), "AGENTQ_WEBHOOK_ALLOW_NETS") {
		t.Errorf("a bad list: %v", err)
	}
}
