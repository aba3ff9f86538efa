package e2e_test

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentq/agentq"
	"github.com/agentq/agentq/client"
)

// scrape reads GET /metrics as Prometheus parses it.
func (h *harness) scrape() map[string]*dto.MetricFamily {
	h.t.Helper()
	resp, err := http.Get(h.base + "/metrics")
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		h.t.Fatalf("GET /metrics: %d", resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		h.t.Fatalf("GET /metrics is not the Prometheus text format: %v", err)
	}
	return fams
}

// sample is the value of the series of fams[name] whose labels include want; ok is
// false when there is none.
func sample(fams map[string]*dto.MetricFamily, name string, want map[string]string) (v float64, ok bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
		return 0, true
	}
	return 0, false
}

func TestMetricsAfterTraffic(t *testing.T) {
	t.Parallel()
	h := start(t)
	// Before any traffic, the counters with known labels exist at 0.
	fams := h.scrape()
	for _, c := range []struct {
		name   string
		labels map[string]string
	}{
		{"agentq_admissions_total", map[string]string{"outcome": "refused", "limit_type": "tenant_rate"}},
		{"agentq_admissions_total", map[string]string{"outcome": "refused", "limit_type": "usd_monthly"}},
		{"agentq_admissions_total", map[string]string{"outcome": "admitted", "limit_type": "none"}},
		{"agentq_tasks_finished_total", map[string]string{"state": "completed"}},
		{"agentq_tasks_finished_total", map[string]string{"state": "abandoned"}},
		{"agentq_tasks_finished_total", map[string]string{"state": "expired"}},
		{"agentq_janitor_drift_total", map[string]string{"kind": "leases_released"}},
		{"agentq_webhook_deliveries_total", map[string]string{"outcome": "succeeded"}},
		{"agentq_webhook_deliveries_total", map[string]string{"outcome": "gone"}},
		{"agentq_dispatched_total", nil},
		{"agentq_quotas_counters_rebuilt_total", nil},
		{"agentq_quotas_recount_skipped_total", nil},
	} {
		if v, ok := sample(fams, c.name, c.labels); !ok || v != 0 {
			t.Errorf("before traffic: %s%v = %v (present %v), want 0", c.name, c.labels, v, ok)
		}
	}

	c, _ := h.tenantClient("obs", "pro", map[string]client.Limit{"tenant_rate": 2, "tenant_rate_burst": 2})
	ctx := context.Background()
	var admitted []string
	refused := 0
	for range 5 {
		task, err := c.SubmitTask(ctx, sim(1, 5))
		if st, _ := statusOf(err); st == 429 {
			refused++
			continue
		} else if err != nil {
			t.Fatal(err)
		}
		admitted = append(admitted, task.ID)
	}
	if len(admitted) != 2 || refused != 3 {
		t.Fatalf("admitted %d, refused %d; want 2 and 3 (tenant_rate burst 2)", len(admitted), refused)
	}
	for _, id := range admitted {
		waitState(t, c, id, "completed", 20*time.Second)
	}
	// A task is completed in Postgres a moment before its worker slot is free (the
	// slot is released after the end's commit): wait for the pool to be idle.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		fams = h.scrape()
		if v, ok := sample(fams, "agentq_worker_busy_ratio", nil); (ok && v == 0) || time.Now().After(deadline) {
			break
		}
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"agentq_admissions_total", map[string]string{"outcome": "admitted", "limit_type": "none"}, 2},
		{"agentq_admissions_total", map[string]string{"outcome": "refused", "limit_type": "tenant_rate"}, 3},
		{"agentq_admissions_total", map[string]string{"outcome": "refused", "limit_type": "key_rate"}, 0},
		{"agentq_dispatched_total", nil, 2},
		{"agentq_tasks_finished_total", map[string]string{"state": "completed"}, 2},
		{"agentq_tasks_finished_total", map[string]string{"state": "failed"}, 0},
		{"agentq_task_wait_seconds", nil, 2}, // the histogram's count
		{"agentq_fair_share_ratio", map[string]string{"tenant": "obs"}, 1},
		{"agentq_queue_depth", map[string]string{"tenant": "other"}, 0},
		{"agentq_worker_busy_ratio", nil, 0},
		// The new tenant's period counters were built from the (empty) ledger once.
		{"agentq_quotas_counters_rebuilt_total", nil, 1},
	} {
		if v, ok := sample(fams, c.name, c.labels); !ok || v != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, v, ok, c.want)
		}
	}
	if f := fams["agentq_task_wait_seconds"]; f == nil || f.GetType() != dto.MetricType_HISTOGRAM {
		t.Errorf("agentq_task_wait_seconds is not a histogram: %v", f)
	}
	// The Go runtime's and the HTTP server's metrics ride along.
	for _, name := range []string{"go_goroutine_count", "go_memory_used_bytes", "http_server_request_duration_seconds"} {
		if fams[name] == nil {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	// A pgx pool metric (the pool statistics of otelpgx).
	pgx := false
	for name := range fams {
		if strings.HasPrefix(name, "pgxpool_") {
			pgx = true
		}
	}
	if !pgx {
		t.Error("/metrics has no pgxpool_ metric")
	}
}

func TestReadyzNamesWhatIsChecked(t *testing.T) {
	t.Parallel()
	h := start(t)
	var out struct {
		Ready  bool              `json:"ready"`
		Checks map[string]string `json:"checks"`
	}
	if st, _ := h.do("GET", "/readyz", "", nil, &out); st != 200 || !out.Ready {
		t.Fatalf("GET /readyz: %d %+v", st, out)
	}
	for _, k := range []string{"postgres", "redis", "migrations"} {
		if out.Checks[k] != "ok" {
			t.Errorf("readyz check %s = %q, want ok", k, out.Checks[k])
		}
	}
}

// Every process serves health, readiness and metrics, whatever its roles; only one
// with the api role serves the API.
func TestEveryRoleServesHealthAndMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, roles := range [][]string{{"worker"}, {"scheduler", "janitor"}, {"relay"}} {
		h := e.start(t, func(o *agentq.Options) { o.Config.Roles = roles })
		if h.base == "" {
			t.Fatalf("roles %v: no HTTP address", roles)
		}
		for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
			if st, _ := h.do("GET", path, "", nil, nil); st != 200 {
				t.Errorf("roles %v: GET %s = %d, want 200", roles, path, st)
			}
		}
		for _, path := range []string{"/v1/tasks", "/v1/admin/tenants", "/openapi.json"} {
			if st, _ := h.do("GET", path, e.admin, nil, nil); st != 404 {
				t.Errorf("roles %v: GET %s = %d, want 404 (no api role)", roles, path, st)
			}
		}
	}
}

// One trace spans the submission's HTTP request, its admission, the dispatch, the
// worker's task and each of its steps.
func TestTraceSpansAPIToWorkerStep(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	h := start(t, func(o *agentq.Options) { o.TracerProvider = tp })
	c, _ := h.tenantClient("traced", "pro", nil)
	task, err := c.SubmitTask(context.Background(), sim(2, 5))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, c, task.ID, "completed", 20*time.Second)

	// The worker ends its task span right after the terminal state: wait for it.
	var spans tracetest.SpanStubs
	find := func(name string) []tracetest.SpanStub {
		var out []tracetest.SpanStub
		for _, s := range spans {
			if s.Name == name {
				out = append(out, s)
			}
		}
		return out
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		spans = exp.GetSpans()
		if len(find("agentq.task")) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	submit := find("POST /v1/tasks")
	if len(submit) != 1 {
		t.Fatalf("want one POST /v1/tasks span, got %d among %d spans", len(submit), len(spans))
	}
	tid := submit[0].SpanContext.TraceID()
	parentOf := func(name string, parent tracetest.SpanStub) tracetest.SpanStub {
		t.Helper()
		for _, s := range find(name) {
			if s.SpanContext.TraceID() == tid && s.Parent.SpanID() == parent.SpanContext.SpanID() {
				return s
			}
		}
		t.Fatalf("no %s span in trace %s under %s", name, tid, parent.Name)
		return tracetest.SpanStub{}
	}
	// A recorded span carries its attributes (they are set only on spans that record).
	hasAttrs := func(s tracetest.SpanStub, want ...attribute.KeyValue) {
		t.Helper()
		for _, w := range want {
			if !slices.Contains(s.Attributes, w) {
				t.Errorf("%s span attributes %v lack %v", s.Name, s.Attributes, w)
			}
		}
	}
	adm := parentOf("agentq.admission", submit[0])
	hasAttrs(adm, attribute.String("agentq.tenant_id", "traced"), attribute.String("agentq.task_id", task.ID),
		attribute.String("agentq.outcome", "admitted"))
	dispatch := parentOf("agentq.dispatch", submit[0])
	run := parentOf("agentq.task", dispatch)
	if run.SpanKind != trace.SpanKindConsumer {
		t.Errorf("task span kind %v, want consumer", run.SpanKind)
	}
	hasAttrs(run, attribute.String("agentq.task_id", task.ID), attribute.String("agentq.tenant_id", "traced"),
		attribute.String("agentq.start", "started"), attribute.Int("agentq.attempt", 1))
	steps := 0
	for _, s := range find("agentq.step") {
		if s.SpanContext.TraceID() == tid && s.Parent.SpanID() == run.SpanContext.SpanID() {
			steps++
			hasAttrs(s, attribute.String("agentq.task_id", task.ID), attribute.String("agentq.agent", "sim"))
			for _, k := range []attribute.Key{"agentq.step", "agentq.tokens", "agentq.done"} {
				if !slices.ContainsFunc(s.Attributes, func(a attribute.KeyValue) bool { return a.Key == k }) {
					t.Errorf("step span attributes %v lack %s", s.Attributes, k)
				}
			}
		}
	}
	if steps != 2 {
		t.Errorf("%d step spans under the task span, want 2", steps)
	}
	// The harness hands the App its own pool and Redis client, which the App does
	// not instrument: Postgres and Redis spans come only with connections it makes.
}

// No log line, at debug level, holds an API key or a webhook secret; request lines
// carry trace and span ids.
func TestLogsHoldNoSecret(t *testing.T) {
	t.Parallel()
	var buf syncBuffer
	h := start(t, func(o *agentq.Options) {
		o.Logger = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	_, key := h.tenantClient("logs", "pro", nil)
	ctx := context.Background()
	rot, err := h.adminClient().RotateKey(ctx, key.Kid)
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(h.base, rot.Key)
	hook, err := h.adminClient().CreateWebhook(ctx, client.CreateWebhookRequest{URL: "http://127.0.0.1:1/hook", Types: []string{client.EventLimitHit}})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 3 {
		task, err := c.SubmitTask(ctx, sim(1, 1))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, task.ID)
	}
	for _, id := range ids {
		waitState(t, c, id, "completed", 20*time.Second)
	}
	// A refused key and a wrong admin token are logged too, if at all, without them.
	bad := client.New(h.base, key.Key+"x")
	_, _ = bad.SubmitTask(ctx, sim(1, 1))
	h.do("GET", "/v1/admin/tenants", "wrong-admin-"+h.admin, nil, nil)

	logs := buf.String()
	if !strings.Contains(logs, `"trace_id":`) {
		t.Error("no log line carries a trace_id")
	}
	for what, secret := range map[string]string{
		"API key": key.Key, "rotated API key": rot.Key, "webhook secret": hook.Secret, "admin token": h.admin,
	} {
		if secret == "" {
			t.Fatalf("%s is empty", what)
		}
		if strings.Contains(logs, secret) {
			t.Errorf("the logs contain the %s", what)
		}
	}
	if strings.Contains(logs, "whsec_") {
		t.Error("the logs contain a whsec_ secret")
	}
	// Every key's plaintext starts aq_<kid>_: the secret part after the kid never
	// shows.
	for _, k := range []string{key.Key, rot.Key} {
		if i := strings.LastIndex(k, "_"); strings.Contains(logs, k[i+1:]) {
			t.Errorf("the logs contain the secret part of key %s", k[:i])
		}
	}
}
