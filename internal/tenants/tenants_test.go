package tenants_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/internal/tenants"
	"github.com/agentq/agentq/internal/testenv"
	"github.com/agentq/agentq/quotas"
)

func ptr[T any](v T) *T { return &v }

func catalogue(t *testing.T) *quotas.Catalogue {
	t.Helper()
	c, err := quotas.LoadCatalogue("")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// configured records the scheduler calls of the service.
type configured struct {
	mu    sync.Mutex
	calls []string
	err   error
}

func (c *configured) Configure(_ context.Context, id string, weight, cap int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, fmt.Sprintf("%s:%d:%d", id, weight, cap))
	return c.err
}

func TestPolicyOfBuiltInPlans(t *testing.T) {
	plans := catalogue(t)
	for _, tc := range []struct {
		plan       string
		weight     *int
		overrides  map[string]quotas.Limit
		wantWeight int
		wantCap    int
		wantSteps  int // the budget's default max_steps
		wantCeilS  float64
		check      func(t *testing.T, p tenants.Policy)
	}{
		{plan: "free", wantWeight: 1, wantCap: 1, wantSteps: 5, wantCeilS: 60},
		{plan: "pro", wantWeight: 2, wantCap: 3, wantSteps: 20, wantCeilS: 300},
		{plan: "enterprise", wantWeight: 4, wantCap: 20, wantSteps: 50, wantCeilS: 1800},
		{plan: "free", weight: ptr(7), wantWeight: 7, wantCap: 1, wantSteps: 5, wantCeilS: 60},
		{plan: "pro", weight: ptr(1000), wantWeight: 1000, wantCap: 3, wantSteps: 20, wantCeilS: 300},
		{plan: "pro", overrides: map[string]quotas.Limit{quotas.Running: 9, quotas.TenantRate: 7},
			wantWeight: 2, wantCap: 9, wantSteps: 20, wantCeilS: 300,
			check: func(t *testing.T, p tenants.Policy) {
				if p.Limits.TenantRate != 7 || p.Effective[quotas.TenantRate] != 7 {
					t.Errorf("tenant_rate override not applied: %v / %v", p.Limits.TenantRate, p.Effective[quotas.TenantRate])
				}
				if p.Effective[quotas.KeyRate] != 20 {
					t.Errorf("key_rate should stay the plan's 20, got %v", p.Effective[quotas.KeyRate])
				}
			}},
		{plan: "enterprise", weight: ptr(3), overrides: map[string]quotas.Limit{quotas.Running: quotas.Unlimited, quotas.USDMonthly: 5},
			wantWeight: 3, wantCap: 0, wantSteps: 50, wantCeilS: 1800,
			check: func(t *testing.T, p tenants.Policy) {
				if p.Limits.USDMonthlyMicro != 5_000_000 {
					t.Errorf("usd_monthly 5 should be 5e6 micro-dollars, got %d", p.Limits.USDMonthlyMicro)
				}
			}},
	} {
		tn := store.Tenant{ID: "t", Plan: tc.plan, Weight: tc.weight, Overrides: tc.overrides}
		p, err := tenants.PolicyOf(plans, tn)
		if err != nil {
			t.Fatalf("%s: %v", tc.plan, err)
		}
		plan, _ := plans.Plan(tc.plan)
		eff, _ := plans.Effective(tc.plan, tc.overrides)
		if p.Weight != tc.wantWeight || p.RunningCap != tc.wantCap || p.Budget.Default.MaxSteps != tc.wantSteps ||
			p.Budget.Ceiling.MaxWallclockS != tc.wantCeilS {
			t.Errorf("%s weight=%v overrides=%v: weight %d cap %d steps %d ceiling %gs, want %d %d %d %gs", tc.plan, tc.weight, tc.overrides,
				p.Weight, p.RunningCap, p.Budget.Default.MaxSteps, p.Budget.Ceiling.MaxWallclockS, tc.wantWeight, tc.wantCap, tc.wantSteps, tc.wantCeilS)
		}
		if !reflect.DeepEqual(p.Effective, eff) || p.Limits != quotas.LimitsOf(eff) || p.Budget != plan.Budget {
			t.Errorf("%s: policy limits/budget differ from the catalogue's", tc.plan)
		}
		if tc.check != nil {
			tc.check(t, p)
		}
	}

	// A plan the catalogue lacks: an error, and still a weight to show.
	p, err := tenants.PolicyOf(plans, store.Tenant{ID: "t", Plan: "gone"})
	if err == nil || p.Weight != 1 {
		t.Errorf("unknown plan: %+v, %v; want weight 1 and an error", p, err)
	}
	if p, _ := tenants.PolicyOf(plans, store.Tenant{ID: "t", Plan: "gone", Weight: ptr(5)}); p.Weight != 5 {
		t.Errorf("unknown plan with a weight of its own: weight %d, want 5", p.Weight)
	}
}

func TestPolicyOfSeesGlobals(t *testing.T) {
	plans := catalogue(t)
	rps := 3.0
	if err := plans.ApplyGlobals(quotas.Globals{TenantRPS: &rps}); err != nil {
		t.Fatal(err)
	}
	p, err := tenants.PolicyOf(plans, store.Tenant{Plan: "enterprise"})
	if err != nil || p.Limits.TenantRate != 3 {
		t.Fatalf("global tenant rate: %v %v, want 3", p.Limits.TenantRate, err)
	}
	p, _ = tenants.PolicyOf(plans, store.Tenant{Plan: "enterprise", Overrides: map[string]quotas.Limit{quotas.TenantRate: 9}})
	if p.Limits.TenantRate != 9 {
		t.Fatalf("an override wins over the global value: %v, want 9", p.Limits.TenantRate)
	}
}

func TestServiceValidation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := store.New(testenv.Postgres(t))
	sched := &configured{}
	svc := tenants.New(st, catalogue(t), tenants.Options{Scheduler: sched})
	if _, err := svc.Create(ctx, tenants.CreateParams{ID: "acme", Plan: ptr("pro")}); err != nil {
		t.Fatal(err)
	}
	keyMsg := "overrides: key_rate unlimited disables key limits while tenant_rate is on; set tenant_rate to unlimited too, or keep a key_rate."
	idMsg := "id is required: 1 to 63 letters, digits, '-' or '_', starting with a letter or digit."
	for _, tc := range []struct {
		name  string
		p     tenants.CreateParams
		field string
		msg   string
	}{
		{"no id", tenants.CreateParams{Plan: ptr("pro")}, "id", idMsg},
		{"bad id", tenants.CreateParams{ID: "bad id!", Plan: ptr("pro")}, "id", idMsg},
		{"id starting with -", tenants.CreateParams{ID: "-x", Plan: ptr("pro")}, "id", idMsg},
		{"id of 64 bytes", tenants.CreateParams{ID: strings.Repeat("a", 64), Plan: ptr("pro")}, "id", idMsg},
		{"no plan", tenants.CreateParams{ID: "a1"}, "plan", "plan is required."},
		{"status at creation", tenants.CreateParams{ID: "a1", Plan: ptr("pro"), Status: ptr("active")}, "status", "status is set with PATCH, not at creation."},
		{"blank name", tenants.CreateParams{ID: "a1", Plan: ptr("pro"), Name: ptr("  ")}, "name", "name must be 1 to 200 bytes of text without control characters."},
		{"control character in name", tenants.CreateParams{ID: "a1", Plan: ptr("pro"), Name: ptr("a\x08")}, "name", "name must be 1 to 200 bytes of text without control characters."},
		{"name of 201 bytes", tenants.CreateParams{ID: "a1", Plan: ptr("pro"), Name: ptr(strings.Repeat("n", 201))}, "name", "name must be 1 to 200 bytes of text without control characters."},
		{"unknown plan", tenants.CreateParams{ID: "a1", Plan: ptr("gold")}, "plan", `Unknown plan "gold" (plans: enterprise, free, pro).`},
		{"weight 0", tenants.CreateParams{ID: "a1", Plan: ptr("pro"), Weight: ptr(0)}, "weight", "weight must be between 1 and 1000."},
		{"negative weight", tenants.CreateParams{ID: "a1", Plan: ptr("pro"), Weight: ptr(-3)}, "weight", "weight must be between 1 and 1000."},
		{"weight 1001", tenants.CreateParams{ID: "a1", Plan: ptr("pro"), Weight: ptr(1001)}, "weight", "weight must be between 1 and 1000."},
		{"unknown override", tenants.CreateParams{ID: "a1", Plan: ptr("pro"), Overrides: map[string]quotas.Limit{"bogus": 1}}, "overrides", `overrides: unknown limit "bogus".`},
		{"negative override", tenants.CreateParams{ID: "a1", Plan: ptr("pro"), Overrides: map[string]quotas.Limit{"usd_monthly": -2}}, "overrides", `overrides: limit "usd_monthly" is negative.`},
		{"running 0", tenants.CreateParams{ID: "a1", Plan: ptr("pro"), Overrides: map[string]quotas.Limit{"running": 0}}, "overrides", "overrides: running must be at least 1, or unlimited."},
		{"key_rate unlimited, tenant_rate on", tenants.CreateParams{ID: "a1", Plan: ptr("pro"), Overrides: map[string]quotas.Limit{"key_rate": quotas.Unlimited}}, "overrides", keyMsg},
	} {
		_, err := svc.Create(ctx, tc.p)
		var inv *agentqtype.InvalidError
		if !errors.As(err, &inv) || inv.Field != tc.field || inv.Message != tc.msg {
			t.Errorf("create, %s: %v (%#v), want %s: %q", tc.name, err, inv, tc.field, tc.msg)
		}
	}
	if ts, _ := svc.List(ctx); len(ts) != 1 {
		t.Fatalf("refused creations wrote tenants: %+v", ts)
	}
	if _, err := svc.Create(ctx, tenants.CreateParams{ID: "acme", Plan: ptr("pro")}); !errors.Is(err, tenants.ErrExists) {
		t.Errorf("taken id: %v, want ErrExists", err)
	}
	// Both limits off together is allowed.
	both := map[string]quotas.Limit{"key_rate": quotas.Unlimited, "tenant_rate": quotas.Unlimited}
	if tn, err := svc.Create(ctx, tenants.CreateParams{ID: "both-off", Plan: ptr("pro"), Overrides: both}); err != nil || tn.Name != "both-off" {
		t.Errorf("both limits off: %+v %v; want it created with its id as name", tn, err)
	}

	for _, tc := range []struct {
		name  string
		p     tenants.UpdateParams
		field string
		msg   string
	}{
		{"bad status", tenants.UpdateParams{ID: "acme", Status: ptr("gone")}, "status", "status must be active or suspended."},
		{"weight 0", tenants.UpdateParams{ID: "acme", Weight: ptr(0)}, "weight", "weight must be between 1 and 1000."},
		{"unknown plan", tenants.UpdateParams{ID: "acme", Plan: ptr("gold")}, "plan", `Unknown plan "gold" (plans: enterprise, free, pro).`},
		{"key_rate unlimited against the stored tenant_rate", tenants.UpdateParams{ID: "acme", Overrides: map[string]quotas.Limit{"key_rate": quotas.Unlimited}}, "overrides", keyMsg},
		// both-off keeps tenant_rate unlimited only through its overrides; replacing them
		// turns the plan's tenant_rate back on while key_rate stays off.
		{"overrides that turn tenant_rate back on", tenants.UpdateParams{ID: "both-off", Overrides: map[string]quotas.Limit{"key_rate": quotas.Unlimited}}, "overrides", keyMsg},
	} {
		_, err := svc.Update(ctx, tc.p)
		var inv *agentqtype.InvalidError
		if !errors.As(err, &inv) || inv.Field != tc.field || inv.Message != tc.msg {
			t.Errorf("update, %s: %v, want %s: %q", tc.name, err, tc.field, tc.msg)
		}
	}
	if len(sched.calls) != 0 {
		t.Errorf("refused updates configured the scheduler: %v", sched.calls)
	}
	if _, err := svc.Update(ctx, tenants.UpdateParams{ID: "ghost", Plan: ptr("pro")}); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Errorf("update of a missing tenant (plan): %v, want agentqtype.ErrNotFound", err)
	}
	if _, err := svc.Update(ctx, tenants.UpdateParams{ID: "ghost", Name: ptr("x")}); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Errorf("update of a missing tenant (name): %v, want agentqtype.ErrNotFound", err)
	}

	// A valid update is written and handed to the scheduler with the new policy.
	tn, err := svc.Update(ctx, tenants.UpdateParams{ID: "acme", Weight: ptr(9), Overrides: map[string]quotas.Limit{"running": 5}, Status: ptr("suspended")})
	if err != nil || *tn.Weight != 9 || tn.Status != "suspended" || tn.Overrides["running"] != 5 {
		t.Fatalf("update: %+v %v", tn, err)
	}
	if got, _ := svc.Get(ctx, "acme"); got.Status != "suspended" {
		t.Errorf("stored status %q, want suspended", got.Status)
	}
	if !reflect.DeepEqual(sched.calls, []string{"acme:9:5"}) {
		t.Errorf("scheduler calls %v, want [acme:9:5]", sched.calls)
	}
	// A scheduler that fails does not undo the update.
	sched.err = errors.New("redis down")
	if tn, err := svc.Update(ctx, tenants.UpdateParams{ID: "acme", Plan: ptr("enterprise")}); err != nil || tn.Plan != "enterprise" {
		t.Errorf("update with a failing scheduler: %+v %v", tn, err)
	}
}

// inval records the tenants the service says changed.
type inval struct {
	mu  sync.Mutex
	ids []string
}

func (i *inval) InvalidateTenant(_ context.Context, id string) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.ids = append(i.ids, id)
	return nil
}

// Lookup reads tenants through the service's cache; the service's own Update drops
// the cached tenant and tells the Invalidator, Forget drops one another process
// changed.
func TestLookupAndItsCache(t *testing.T) {
	ctx := context.Background()
	st := store.New(testenv.Postgres(t))
	iv := &inval{}
	svc := tenants.New(st, catalogue(t), tenants.Options{Invalidator: iv, CacheTTL: time.Hour})
	if _, err := svc.Create(ctx, tenants.CreateParams{ID: "acme", Plan: ptr("pro")}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Lookup(ctx, "ghost"); !errors.Is(err, agentqtype.ErrNotFound) {
		t.Errorf("Lookup(ghost): %v", err)
	}
	if got, err := svc.Lookup(ctx, "acme"); err != nil || got.Plan != "pro" {
		t.Fatalf("Lookup: %+v %v", got, err)
	}
	if _, err := svc.Update(ctx, tenants.UpdateParams{ID: "acme", Plan: ptr("free")}); err != nil {
		t.Fatal(err)
	}
	if got, _ := svc.Lookup(ctx, "acme"); got.Plan != "free" {
		t.Errorf("Lookup after Update: plan %s", got.Plan)
	}
	if !reflect.DeepEqual(iv.ids, []string{"acme"}) {
		t.Errorf("invalidated %v", iv.ids)
	}
	other := tenants.New(st, catalogue(t), tenants.Options{})
	if _, err := other.Update(ctx, tenants.UpdateParams{ID: "acme", Status: ptr("suspended")}); err != nil {
		t.Fatal(err)
	}
	if got, _ := svc.Lookup(ctx, "acme"); got.Status != "active" {
		t.Errorf("cached tenant before Forget: %s", got.Status)
	}
	svc.Forget("acme")
	if got, _ := svc.Lookup(ctx, "acme"); got.Status != "suspended" {
		t.Errorf("Lookup after Forget: %s", got.Status)
	}
}

func TestPoliciesRemembersPerTenant(t *testing.T) {
	plans := catalogue(t)
	pols := tenants.NewPolicies(plans, 2)
	same := func(tn store.Tenant) {
		t.Helper()
		got, err := pols.Policy(tn)
		want, werr := tenants.PolicyOf(plans, tn)
		if !reflect.DeepEqual(got, want) || (err == nil) != (werr == nil) {
			t.Errorf("Policy(%+v) = %+v, %v; PolicyOf gives %+v, %v", tn, got, err, want, werr)
		}
	}
	overrides := map[string]quotas.Limit{quotas.TenantRate: 7}
	acme := store.Tenant{ID: "acme", Plan: "pro", Overrides: overrides}
	same(acme)
	first, _ := pols.Policy(acme)
	if again, _ := pols.Policy(acme); reflect.ValueOf(again.Effective).Pointer() != reflect.ValueOf(first.Effective).Pointer() {
		t.Error("the same tenant's policy was worked out again")
	}
	// Each input of the policy, changed, is seen at once.
	overrides[quotas.TenantRate] = 9 // the caller's map changed in place
	same(acme)
	same(store.Tenant{ID: "acme", Plan: "pro", Overrides: map[string]quotas.Limit{quotas.TenantRate: 9, quotas.KeyRate: 2}})
	same(store.Tenant{ID: "acme", Plan: "free"})
	same(store.Tenant{ID: "acme", Plan: "free", Weight: ptr(4)})
	same(store.Tenant{ID: "acme", Plan: "free", Weight: ptr(5)})
	same(store.Tenant{ID: "acme", Plan: "free"})
	same(store.Tenant{ID: "acme", Plan: "gone", Weight: ptr(3)}) // an error, remembered too
	same(store.Tenant{ID: "acme", Plan: "gone", Weight: ptr(3)})
	// Other tenants, and tenants without an id, do not share it.
	same(store.Tenant{ID: "other", Plan: "enterprise"})
	same(store.Tenant{Plan: "pro"})
	same(store.Tenant{Plan: "free"})
	// Beyond its size the least recently used tenant is forgotten, not confused.
	same(store.Tenant{ID: "third", Plan: "pro"})
	same(store.Tenant{ID: "acme", Plan: "pro"})
}

func TestPoliciesConcurrent(t *testing.T) {
	plans := catalogue(t)
	pols := tenants.NewPolicies(plans, 4)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				tn := store.Tenant{ID: fmt.Sprintf("t%d", (g+i)%6), Plan: []string{"free", "pro"}[i%2],
					Overrides: map[string]quotas.Limit{quotas.TenantRate: quotas.Limit(i % 3)}}
				got, err := pols.Policy(tn)
				if err != nil || got.Limits.TenantRate != float64(i%3) {
					t.Errorf("Policy(%+v): tenant rate %v, %v", tn, got.Limits.TenantRate, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func BenchmarkPolicy(b *testing.B) {
	plans, err := quotas.LoadCatalogue("")
	if err != nil {
		b.Fatal(err)
	}
	tn := store.Tenant{ID: "acme", Plan: "pro", Overrides: map[string]quotas.Limit{quotas.TenantRate: 50, quotas.KeyRate: 20}}
	b.Run("PolicyOf", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = tenants.PolicyOf(plans, tn)
		}
	})
	b.Run("Policies", func(b *testing.B) {
		pols := tenants.NewPolicies(plans, 16)
		b.ReportAllocs()
		for b.Loop() {
			_, _ = pols.Policy(tn)
		}
	})
}
