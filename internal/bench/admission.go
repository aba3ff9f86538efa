package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/benchutil"
	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/quotas"
	"github.com/agentq/agentq/quotas/admission"
)

// gcraScript is the single-key limiter the admission benchmark compares against: the
// GCRA of go-redis/redis_rate (allowN), transcribed so both run through the same client
// in the same process.
//
// KEYS[1] bucket   ARGV[1] burst   ARGV[2] rate   ARGV[3] period (s)   ARGV[4] cost
var gcraScript = redis.NewScript(`
local rate_limit_key = KEYS[1]
local burst = ARGV[1]
local rate = ARGV[2]
local period = ARGV[3]
local cost = tonumber(ARGV[4])
local emission_interval = period / rate
local increment = emission_interval * cost
local burst_offset = emission_interval * burst
local jan_1_2017 = 1483228800
local now = redis.call("TIME")
now = (now[1] - jan_1_2017) + (now[2] / 1000000)
local tat = redis.call("GET", rate_limit_key)
if not tat then tat = now else tat = tonumber(tat) end
tat = math.max(tat, now)
local new_tat = tat + increment
local allow_at = new_tat - burst_offset
local diff = now - allow_at
local remaining = diff / emission_interval
if remaining < 0 then
  local reset_after = tat - now
  local retry_after = diff * -1
  return {0, 0, tostring(retry_after), tostring(reset_after)}
end
local reset_after = new_tat - now
if reset_after > 0 then
  redis.call("SET", rate_limit_key, new_tat, "EX", math.ceil(reset_after))
end
local retry_after = -1
return {cost, remaining, tostring(retry_after), tostring(reset_after)}
`)

var emptyScript = redis.NewScript(`return 1`)

// Admission is the result of `agentq bench admission`.
type Admission struct {
	AdmissionsPerS     float64 `json:"admissions_per_s"`
	SingleBucketPerS   float64 `json:"single_bucket_per_s"`
	RawEvalshaPerS     float64 `json:"raw_evalsha_per_s"`
	Ratio              float64 `json:"ratio_vs_single_bucket"`
	P50us              float64 `json:"p50_us"`
	P99us              float64 `json:"p99_us"`
	UncoalescedPerS    float64 `json:"admissions_uncoalesced_per_s"`
	UncoalescedP50us   float64 `json:"uncoalesced_p50_us"`
	UncoalescedP99us   float64 `json:"uncoalesced_p99_us"`
	SingleBucketP50us  float64 `json:"single_bucket_p50_us"`
	SingleBucketP99us  float64 `json:"single_bucket_p99_us"`
	Concurrency        int     `json:"concurrency"`
	DurationS          float64 `json:"duration_s"`
	Tenants            int     `json:"tenants"`
	ScopesPerAdmission int     `json:"scopes_per_admission"`
	// RefusingPerS is the full admission with every limit refusing (a tenant at all its
	// limits), coalesced like AdmissionsPerS; RefusingRatio is it over AdmissionsPerS.
	// A refusal writes no Postgres row and costs one Redis command more than reading:
	// its count.
	RefusingPerS  float64 `json:"refusing_admissions_per_s"`
	RefusingRatio float64 `json:"refusing_ratio_vs_passing"`
	RefusingP99us float64 `json:"refusing_p99_us"`
	// Redis main-thread CPU per operation in the coalesced admission phase and in the
	// single-bucket phase: what bounds each once Redis is the bottleneck.
	RedisCPUPerAdmissionUs    float64 `json:"redis_cpu_us_per_admission"`
	RedisCPUPerSingleBucketUs float64 `json:"redis_cpu_us_per_single_bucket"`
	Errors                    int64   `json:"errors"`
	RedisBytesPerTenant       float64 `json:"redis_bytes_per_active_tenant"`
	RedisBytesPerTenantKs     int     `json:"redis_bytes_measured_over_tenants"`
}

// AdmissionOptions configure the admission benchmark.
type AdmissionOptions struct {
	Concurrency int
	Duration    time.Duration // per phase
	Tenants     int
	Progress    io.Writer
}

// RunAdmission measures, in one run with one client and the same concurrency:
// raw EVALSHA of an empty script, the single-key GCRA limiter, and the full admission
// script with every scope on (all passing, so every call also writes). It then
// measures the Redis memory an active tenant's admission state takes.
func RunAdmission(ctx context.Context, rdb redis.UniversalClient, o AdmissionOptions) (Admission, error) {
	if o.Concurrency <= 0 {
		o.Concurrency = 32
	}
	if o.Duration <= 0 {
		o.Duration = 5 * time.Second
	}
	if o.Tenants <= 0 {
		o.Tenants = 100
	}
	progress := func(format string, a ...any) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, format+"\n", a...)
		}
	}
	prefix := fmt.Sprintf("bench%d:", time.Now().UnixNano())
	keys := rkeys.New(prefix, 1)
	q := admission.New(rdb, keys, nil)
	// The same state, with admissions coalesced as the API runs them.
	cq := admission.New(rdb, keys, nil, admission.Options{Coalesce: true, CoalesceTimeout: 2 * time.Second})
	defer redisx.DeletePrefix(context.WithoutCancel(ctx), rdb, prefix)
	for _, s := range []*redis.Script{gcraScript, emptyScript} {
		if err := s.Load(ctx, rdb).Err(); err != nil {
			return Admission{}, err
		}
	}
	lim := quotas.Limits{
		KeyRate: 1e6, KeyBurst: 1e6, TenantRate: 1e6, TenantBurst: 1e6, KeyAgentRate: 1e6, KeyAgentBurst: 1e6,
		UserHourly: 1e9, UserBurst: 1e9, Sessions: 1e9, LongRunning: 1e9, Backlog: 1e9,
		StepsDaily: 1e9, TokensMonthly: 1e12, USDMonthlyMicro: 1e12,
	}
	period := quotas.PeriodAt(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Now())
	for t := range o.Tenants { // some usage so the period scopes read real counters
		_ = q.ReserveStep(ctx, quotas.StepParams{TenantID: fmt.Sprintf("t%d", t), Tokens: 10, CostMicro: 10, Period: period, Limits: lim})
	}
	// One admission of the key's bucket alone, of a tenant the phases do not use: it
	// loads the admission script into Redis, so no measured call pays for that.
	if _, err := q.Admit(ctx, quotas.AdmitParams{
		Mode: quotas.ModeKey, TenantID: "warm-up", Kid: "warm-up-k", Limits: lim, Period: period,
	}); err != nil {
		return Admission{}, err
	}
	out := Admission{Concurrency: o.Concurrency, DurationS: o.Duration.Seconds(), Tenants: o.Tenants, ScopesPerAdmission: 10}

	progress("raw EVALSHA of an empty script, %d clients, %v…", o.Concurrency, o.Duration)
	raw := benchutil.Run(ctx, o.Concurrency, o.Duration, func(ctx context.Context, _ int, _ int64) error {
		return emptyScript.EvalSha(ctx, rdb, nil).Err()
	})
	singleBucket := func(ctx context.Context, w int, seq int64) error {
		key := keys.BaselineBucket(fmt.Sprintf("t%d", (int64(w)*7919+seq)%int64(o.Tenants)))
		return gcraScript.EvalSha(ctx, rdb, []string{key}, 1e6, 1e6, 1, 1).Err()
	}
	admitVia := func(q *admission.Store) func(ctx context.Context, w int, seq int64) error {
		return func(ctx context.Context, w int, seq int64) error {
			n := int64(w)*7919 + seq
			tenant := fmt.Sprintf("t%d", n%int64(o.Tenants))
			_, err := q.Admit(ctx, quotas.AdmitParams{
				Mode: quotas.ModeAdmit, TenantID: tenant, Kid: tenant + "-k" + fmt.Sprint(n%3), Agent: "sim",
				User: fmt.Sprintf("u%d", n%50), TaskID: fmt.Sprintf("%d-%d", w, seq), InScope: true, LongRunning: true,
				Limits: lim, Period: period,
			})
			return err
		}
	}
	progress("full admission, every scope on, one script call per admission…")
	alone := benchutil.Run(ctx, o.Concurrency, o.Duration, admitVia(q))
	// The ratio is the figure: the baseline and the full admission take turns in
	// slices of a second, so that a machine whose speed drifts slows both alike.
	progress("single-key GCRA (redis_rate's algorithm) and the full admission with every scope on, coalesced, in turns…")
	both, err := benchutil.RunInterleaved(ctx, rdb, o.Concurrency, o.Duration, admissionRounds(o.Duration), singleBucket, admitVia(cq))
	if err != nil {
		return out, err
	}
	single, full := both[0], both[1]
	progress("full admission, every limit refusing, coalesced…")
	// Every limit at its value refusing the tenants' use: rates of 0, counts of 0, and
	// monthly quotas of 1 below the 10 tokens and micro-dollars each tenant used. Only
	// the key bucket passes, so each admission checks every other scope.
	refusing := quotas.Limits{
		KeyRate: 1e6, KeyBurst: 1e6, TenantRate: 0, TenantBurst: 1, KeyAgentRate: 0, KeyAgentBurst: 1,
		UserHourly: 0, UserBurst: 1, Sessions: 0, LongRunning: 0, Backlog: 0,
		StepsDaily: 0, TokensMonthly: 1, USDMonthlyMicro: 1,
	}
	var notRefused atomic.Int64
	refused := benchutil.Run(ctx, o.Concurrency, o.Duration, func(ctx context.Context, w int, seq int64) error {
		n := int64(w)*7919 + seq
		tenant := fmt.Sprintf("t%d", n%int64(o.Tenants))
		d, err := cq.Admit(ctx, quotas.AdmitParams{
			Mode: quotas.ModeAdmit, TenantID: tenant, Kid: tenant + "-k" + fmt.Sprint(n%3), Agent: "sim",
			User: fmt.Sprintf("u%d", n%50), TaskID: fmt.Sprintf("r%d-%d", w, seq), InScope: true, LongRunning: true,
			Limits: refusing, Period: period,
		})
		if err == nil && (d.Allowed || len(d.Violated) != out.ScopesPerAdmission-1) {
			notRefused.Add(1)
		}
		return err
	})
	if n := notRefused.Load(); n > 0 {
		return out, fmt.Errorf("bench: admission: %d admissions of the refusing phase were not refused by every limit but the key's", n)
	}
	out.RefusingPerS = round1(refused.PerSec)
	out.RefusingRatio = math.Round(refused.PerSec/full.PerSec*1000) / 1000
	out.RefusingP99us = us(refused.P99)
	out.UncoalescedPerS = round1(alone.PerSec)
	out.UncoalescedP50us, out.UncoalescedP99us = us(alone.P50), us(alone.P99)
	out.RawEvalshaPerS = round1(raw.PerSec)
	out.SingleBucketPerS = round1(single.PerSec)
	out.AdmissionsPerS = round1(full.PerSec)
	out.Ratio = math.Round(full.PerSec/single.PerSec*1000) / 1000
	out.P50us, out.P99us = us(full.P50), us(full.P99)
	out.SingleBucketP50us, out.SingleBucketP99us = us(single.P50), us(single.P99)
	out.RedisCPUPerAdmissionUs, out.RedisCPUPerSingleBucketUs = us(full.RedisCPUPerOp), us(single.RedisCPUPerOp)
	out.Errors = raw.Errors + single.Errors + full.Errors + alone.Errors + refused.Errors

	// Memory per active tenant: admission state of fresh tenants, each with a key, two
	// agents' buckets, a few users, a lease and a day's and a period's counters.
	progress("Redis memory per active tenant…")
	const memTenants = 200
	for t := range memTenants {
		tenant := fmt.Sprintf("m%d", t)
		for i := range 3 {
			if _, err := q.Admit(ctx, quotas.AdmitParams{
				Mode: quotas.ModeAdmit, TenantID: tenant, Kid: tenant + "-k", Agent: fmt.Sprintf("a%d", i%2),
				User: fmt.Sprintf("u%d", i), TaskID: fmt.Sprintf("%s-%d", tenant, i), InScope: true,
				Limits: lim, Period: period,
			}); err != nil {
				return out, err
			}
		}
		_ = q.ReserveStep(ctx, quotas.StepParams{TenantID: tenant, Tokens: 10, CostMicro: 10, Period: period, Limits: lim})
	}
	var total int64
	iter := rdb.Scan(ctx, 0, keys.TenantKeysPattern(0, "m*"), 1000).Iterator()
	for iter.Next(ctx) {
		n, err := rdb.MemoryUsage(ctx, iter.Val()).Result()
		if err == nil {
			total += n
		}
	}
	out.RedisBytesPerTenant = round1(float64(total) / memTenants)
	out.RedisBytesPerTenantKs = memTenants
	return out, nil
}

// admissionRounds is how many turns the baseline and the admission take: slices of
// about a second, at least one.
func admissionRounds(d time.Duration) int { return max(1, int(d/time.Second)) }

func us(d time.Duration) float64 { return round1(float64(d.Nanoseconds()) / 1e3) }
