// Package rkeys builds every Redis key and channel name agentq uses, and the formats
// of the hash fields, set members and messages that combine several values. Nothing
// else in the code base spells one; Lua scripts get the keys they touch in KEYS and
// the field prefixes they combine in ARGV.
//
// Every key that belongs to a tenant carries its shard's hash tag, "{s<n>}", with
// n = fnv32a(tenant) mod shards, so each Lua script (admission, dispatch, completion)
// touches one slot on a single Redis and on Redis Cluster alike. Keys that belong to an
// API key are named by kid, never by anything derived from the secret.
package rkeys

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
)

// Keys builds key names under one prefix. The prefix isolates deployments (and tests)
// sharing a Redis; it sits outside the hash tag.
type Keys struct {
	prefix string
	shards int
}

// New returns a key builder. shards < 1 is treated as 1.
func New(prefix string, shards int) Keys {
	if shards < 1 {
		shards = 1
	}
	return Keys{prefix: prefix, shards: shards}
}

// Prefix is the deployment prefix every key starts with.
func (k Keys) Prefix() string { return k.prefix }

// Shards is the number of scheduler shards.
func (k Keys) Shards() int { return k.shards }

// Shard returns the shard a tenant lives on.
func (k Keys) Shard(tenant string) int {
	if k.shards == 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(tenant))
	return int(h.Sum32() % uint32(k.shards))
}

func (k Keys) tag(shard int) string { return k.prefix + "{s" + strconv.Itoa(shard) + "}" }

func (k Keys) tenantTag(tenant string) string { return k.tag(k.Shard(tenant)) }

// TenantQueue is the ZSET of a tenant's queued task ids, scored priority band first,
// then admission time (see scheduler.QueueScore).
func (k Keys) TenantQueue(tenant string) string { return k.tenantTag(tenant) + ":q:" + tenant }

// TenantConf is the HASH holding the tenant's scheduling parameters: weight (w),
// running cap (cap), estimated task cost in worker-ms (est) and the finish pass of its
// last dispatch (fp), kept with a TTL while the tenant is idle.
func (k Keys) TenantConf(tenant string) string { return k.tenantTag(tenant) + ":conf:" + tenant }

// TenantRunning is the SET of the tenant's task ids dispatched and not yet finished.
func (k Keys) TenantRunning(tenant string) string { return k.tenantTag(tenant) + ":run:" + tenant }

// TenantStarts is the ZSET of the tenant's recently dispatched task ids, scored by
// dispatch time (ms): its measured start rate, which a queued task's expected start
// is estimated from. It is trimmed to a window and a count at each dispatch, and
// expires once the tenant stops dispatching.
func (k Keys) TenantStarts(tenant string) string { return k.tenantTag(tenant) + ":starts:" + tenant }

// Ready is the shard's ZSET of backlogged tenants below their running cap, scored by pass.
func (k Keys) Ready(shard int) string { return k.tag(shard) + ":ready" }

// Capped is the shard's ZSET of backlogged tenants at their running cap, scored by pass.
func (k Keys) Capped(shard int) string { return k.tag(shard) + ":capped" }

// VirtualTime is the shard's STRING holding its virtual time: the largest pass
// dispatched, raised to the dispatchers' global virtual time after each round.
func (k Keys) VirtualTime(shard int) string { return k.tag(shard) + ":vt" }

// Inflight is the shard's ZSET of task ids handed to the workers and not finished,
// scored by dispatch time (ms).
func (k Keys) Inflight(shard int) string { return k.tag(shard) + ":inflight" }

// Dispatching is the shard's ZSET of DispatchingMember entries popped by dispatch and
// not yet confirmed in asynq, scored by pop time (ms).
func (k Keys) Dispatching(shard int) string { return k.tag(shard) + ":dispatching" }

// Parked is the shard's ZSET of tasks waiting for token capacity, ParkedMember
// entries scored by when the capacity is expected (ms): the dispatcher puts each back
// on its tenant's queue then.
func (k Keys) Parked(shard int) string { return k.tag(shard) + ":parked" }

// ParkedMember is a parked task's entry, "task:tenant" (task ids hold no ':').
func ParkedMember(tenant, task string) string { return task + ":" + tenant }

// ParseParkedMember splits a ParkedMember entry.
func ParseParkedMember(m string) (tenant, task string, err error) {
	task, tenant, ok := strings.Cut(m, ":")
	if !ok || task == "" || tenant == "" {
		return "", "", fmt.Errorf("rkeys: bad parked member %q", m)
	}
	return tenant, task, nil
}

// AsynqTaskID is the asynq message id of a task's dispatch: the task id, followed
// by ".<n>" once the task has been parked n times. asynq keeps a message's id until
// the message is done, and a parked task may be dispatched again before the delivery
// that parked it has returned: each dispatch after a park has an id of its own.
func AsynqTaskID(task string, gen int) string {
	if gen <= 0 {
		return task
	}
	return task + "." + strconv.Itoa(gen)
}

// ParseAsynqTaskID splits an AsynqTaskID.
func ParseAsynqTaskID(id string) (task string, gen int, err error) {
	task, g, ok := strings.Cut(id, ".")
	if !ok {
		return id, 0, nil
	}
	gen, err = strconv.Atoi(g)
	if err != nil || gen <= 0 {
		return "", 0, fmt.Errorf("rkeys: bad asynq task id %q", id)
	}
	return task, gen, nil
}

// DispatchingMember is a task's entry in its shard's dispatching set,
// "priority:estimate:tenant:task", task being the dispatch's AsynqTaskID: everything a
// re-send and a completion need (tenant ids hold no ':'). The dispatch script writes the same format when it pops a task
// (scheduler tests pin the two together).
func DispatchingMember(priority int, estimateMs int64, tenant, task string) string {
	return strconv.Itoa(priority) + ":" + strconv.FormatInt(estimateMs, 10) + ":" + tenant + ":" + task
}

// ParseDispatchingMember splits a DispatchingMember entry.
func ParseDispatchingMember(m string) (priority int, estimateMs int64, tenant, task string, err error) {
	parts := strings.SplitN(m, ":", 4)
	if len(parts) != 4 {
		return 0, 0, "", "", fmt.Errorf("rkeys: bad dispatching member %q", m)
	}
	p, err1 := strconv.Atoi(parts[0])
	est, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, "", "", fmt.Errorf("rkeys: bad dispatching member %q", m)
	}
	return p, est, parts[2], parts[3], nil
}

// TenantKeysPattern is a SCAN pattern matching the per-tenant keys of one shard whose
// tenant id matches the glob tenantGlob (benchmarks measure their memory).
func (k Keys) TenantKeysPattern(shard int, tenantGlob string) string {
	return k.tag(shard) + ":*:" + tenantGlob
}

// globalTag is the hash tag of the few keys shared by all shards: the worker slots'
// count. Scripts touch them apart from any shard's keys, so each stays single-slot.
func (k Keys) globalTag() string { return k.prefix + "{g}" }

// Workers is the ZSET of live worker ids scored by heartbeat expiry (ms).
func (k Keys) Workers() string { return k.globalTag() + ":workers" }

// WorkerSlots is the HASH of worker id → concurrency.
func (k Keys) WorkerSlots() string { return k.globalTag() + ":wslots" }

// Generation is the STRING marking this Redis's data generation: the janitor sets it
// and a Redis that lost its data (FLUSHDB, restart without persistence) no longer has
// it, which triggers an immediate reconciliation from Postgres.
func (k Keys) Generation() string { return k.globalTag() + ":generation" }

// ShardGeneration is the generation marker of one shard: on a Redis Cluster each
// shard's keys live on one node, and a node restarted without its data loses only its
// shards' markers, which Generation's (on another node) would not tell.
func (k Keys) ShardGeneration(shard int) string { return k.tag(shard) + ":generation" }

// SlotsInflight is the STRING counting tasks handed to the worker slots (dispatching or
// in asynq) and not finished, across shards: the backpressure gate.
func (k Keys) SlotsInflight() string { return k.globalTag() + ":inflight" }

// WakeChannel is the pub/sub channel that wakes dispatchers (admissions, completions).
func (k Keys) WakeChannel() string { return k.prefix + "wake" }

// CancelChannel is the pub/sub channel carrying ids of tasks to interrupt.
func (k Keys) CancelChannel() string { return k.prefix + "cancel" }

// TaskEvents is the pub/sub channel of one task's progress messages.
func (k Keys) TaskEvents(taskID string) string { return k.prefix + "ev:" + taskID }

// KeysChangedChannel is the pub/sub channel carrying KeyChanged, TenantChanged and
// CredentialChanged messages: whose cached API key, tenant or admin credential to drop.
func (k Keys) KeysChangedChannel() string { return k.prefix + "keys" }

// KeyChanged is the KeysChangedChannel message of an API key that changed.
func KeyChanged(kid string) string { return "k:" + kid }

// TenantChanged is the KeysChangedChannel message of a tenant that changed.
func TenantChanged(tenant string) string { return "t:" + tenant }

// CredentialChanged is the KeysChangedChannel message of an admin credential that
// changed (rotated or revoked).
func CredentialChanged(name string) string { return "c:" + name }

// ParseCredentialChanged reads a KeysChangedChannel message of an admin credential:
// its name, and whether the message is one.
func ParseCredentialChanged(msg string) (name string, ok bool) { return strings.CutPrefix(msg, "c:") }

// ParseChanged reads a KeysChangedChannel message: the kid or the tenant id it names
// (the other is ""); neither for a message of another kind.
func ParseChanged(msg string) (kid, tenant string) {
	if v, ok := strings.CutPrefix(msg, "k:"); ok {
		return v, ""
	}
	if v, ok := strings.CutPrefix(msg, "t:"); ok {
		return "", v
	}
	return "", ""
}

// AsynqQueue names an asynq queue of this deployment: the prefix followed by name.
func (k Keys) AsynqQueue(name string) string { return k.prefix + name }

// TaskQueue is the one asynq queue every dispatched task goes through, whatever the
// number of tenants or the tasks' priorities (see scheduler.LegacyQueues).
func (k Keys) TaskQueue() string { return k.AsynqQueue("default") }

// AsynqKeyPrefix starts every key asynq writes for this deployment's queues: asynq
// keeps queue q's keys under "asynq:{q}:", and every queue is AsynqQueue(name), the
// deployment prefix followed by the name. (asynq's own global keys, such as its set
// of queue names, are not under it.)
func (k Keys) AsynqKeyPrefix() string { return "asynq:{" + k.prefix }

// --- admission (quotas) ---------------------------------------------------------

// AdmissionState is the HASH holding all of a tenant's admission state, so one
// admission reads it with one HMGET and writes it with one HSET. Its fields:
//
//	t              tenant_rate bucket (GCRA theoretical arrival time, ms)
//	k:<kid>        key_rate bucket of an API key (KeyBucketField)
//	a:<kid>:<agt>  key_agent_rate bucket (KeyAgentField)
//	u:<user>       user_tasks_hourly bucket (UserField); UserOverflowField is the one
//	               users beyond the cap share; nu counts user buckets, uc is a cursor
//	tok:<period>   AI tokens in a billing period (TokensField); usd:<period>
//	               micro-dollars (USDField)
//	x, per         expiry and newest-period marks
//	lx             until when the lease sets (Sessions, LongRunning) live at least
//	sd             the period counters (these and StepsDaily) were rebuilt from the
//	               usage ledger since Redis last lost them (quotas/admission/seed.go)
//
// The single-name fields (t, nu, uc, x, per, sd, lx) are spelled by the scripts; every
// combined one is built here, or by a script from the prefix it is given.
func (k Keys) AdmissionState(tenant string) string { return k.tenantTag(tenant) + ":adm:" + tenant }

// Field prefixes of the admission state hash. Scripts that build a field from a value
// they read (the billing period) or match fields by kind get the prefix in ARGV.
const (
	KeyBucketPrefix = "k:"
	KeyAgentPrefix  = "a:"
	UserPrefix      = "u:"
	TokensPrefix    = "tok:"
	USDPrefix       = "usd:"
)

// KeyBucketField is the key_rate bucket of an API key, named by kid, never the secret.
func KeyBucketField(kid string) string { return KeyBucketPrefix + kid }

// KeyAgentField is the key_agent_rate bucket of (key, agent).
func KeyAgentField(kid, agent string) string { return KeyAgentPrefix + kid + ":" + agent }

// KeyAgentFieldsPattern is an HSCAN pattern matching every KeyAgentField of a key.
func KeyAgentFieldsPattern(kid string) string { return KeyAgentPrefix + kid + ":*" }

// UserField is the user_tasks_hourly bucket of an on-behalf-of user.
func UserField(user string) string { return UserPrefix + user }

// UserOverflowField is the bucket users beyond the tracked-users cap share; the NUL
// keeps it apart from every UserField a request can name.
const UserOverflowField = UserPrefix + "\x00overflow"

// TokensField holds the AI tokens used in the billing period starting on period.
func TokensField(period string) string { return TokensPrefix + period }

// USDField holds the micro-dollars used in the billing period starting on period.
func USDField(period string) string { return USDPrefix + period }

// StepsDaily is the HASH of the tenant's executed steps per hour (field = hours since
// the epoch); the last 24 fields make the sliding 24 h window.
func (k Keys) StepsDaily(tenant string) string { return k.tenantTag(tenant) + ":steps:" + tenant }

// Sessions is the ZSET of the session leases of the tenant's tasks that are not
// long-running (task id → expiry ms). concurrent_sessions counts it and LongRunning.
func (k Keys) Sessions(tenant string) string { return k.tenantTag(tenant) + ":sess:" + tenant }

// LongRunning is the ZSET of the leases of the tenant's long-running tasks; a lease is
// in this set or in Sessions, never in both.
func (k Keys) LongRunning(tenant string) string { return k.tenantTag(tenant) + ":long:" + tenant }

// InflightRequests is the ZSET of the tenant's open HTTP requests, event streams
// included (request id → lease expiry ms): the inflight_requests limit.
func (k Keys) InflightRequests(tenant string) string { return k.tenantTag(tenant) + ":req:" + tenant }

// PendingQueue is the ZSET of the tenant's tasks admitted and not yet pushed to their
// queue (task id → expiry ms), which queue_backlog counts with the queue.
func (k Keys) PendingQueue(tenant string) string { return k.tenantTag(tenant) + ":pend:" + tenant }

// Rejections is the HASH counting the tenant's refused admissions: field
// RejectionField(mask, minute, period) → how many admissions were refused in that
// minute by exactly the limits of the violated-scope bitmask (quotas' scope bits). The
// admission script builds the field from the mask, its clock and, when a monthly quota
// refused, the billing period the admission was decided in; RejectionField is the
// same format, pinned to the script by a test.
func (k Keys) Rejections(tenant string) string { return k.tenantTag(tenant) + ":rej:" + tenant }

// RejectingTenants is the shard's SET of tenants whose Rejections hash holds counts not
// yet pruned: what the flush of refusal counts to Postgres walks.
func (k Keys) RejectingTenants(shard int) string { return k.tag(shard) + ":rejecting" }

// RejectionField is a Rejections field: "<mask>:<minute>", minute counted since the
// Unix epoch, or "<mask>:<minute>:<period>" when period (a billing period's id, that
// of the decision's monthly counters) is set.
func RejectionField(mask, minute int64, period string) string {
	f := strconv.FormatInt(mask, 10) + ":" + strconv.FormatInt(minute, 10)
	if period != "" {
		f += ":" + period
	}
	return f
}

// ParseRejectionField splits a RejectionField.
func ParseRejectionField(f string) (mask, minute int64, period string, err error) {
	m, rest, ok := strings.Cut(f, ":")
	n, period, _ := strings.Cut(rest, ":")
	if ok {
		if mask, err = strconv.ParseInt(m, 10, 64); err == nil {
			minute, err = strconv.ParseInt(n, 10, 64)
		}
	}
	if !ok || err != nil || mask <= 0 || minute < 0 || strings.Contains(period, ":") {
		return 0, 0, "", fmt.Errorf("rkeys: %q is not a rejection field", f)
	}
	return mask, minute, period, nil
}

// APIReplicas is the ZSET of live API replicas (id → heartbeat expiry ms); the degraded
// mode divides rate limits by its size.
func (k Keys) APIReplicas() string { return k.prefix + "apis" }

// BaselineBucket is the single-key GCRA bucket `agentq bench admission` compares the
// admission script against.
func (k Keys) BaselineBucket(tenant string) string { return k.tenantTag(tenant) + ":gcra:" + tenant }

// --- request buckets (quotas.Bucket) --------------------------------------------

// AuthFailures is the STRING bucket (GCRA theoretical arrival time, ms) of the wrong
// admin tokens sent from one client address, on the admin API and the operator view's
// sign-in alike. An address belongs to no tenant, so the key is its own hash tag; it
// expires when the bucket is full again.
func (k Keys) AuthFailures(addr string) string { return k.prefix + "{af:" + addr + "}" }

// PanelLinkBucket is the STRING bucket (GCRA theoretical arrival time, ms) of one
// tenant panel link's requests. linkID is a digest of the link's token, never the
// token: the token is a credential. It expires when the bucket is full again.
func (k Keys) PanelLinkBucket(tenant, linkID string) string {
	return k.tenantTag(tenant) + ":plink:" + tenant + ":" + linkID
}

// --- token capacity (quotas/capacity) ---------------------------------------------

// TenantTokens is the HASH of a tenant's ai_tokens_per_minute bucket: its level in
// tokens (l; below zero while a step's excess is carried as debt) at a time in ms (t).
// It expires once the bucket would be full again.
func (k Keys) TenantTokens(tenant string) string { return k.tenantTag(tenant) + ":tpm:" + tenant }

// poolTag is a model pool's own hash tag. Every tenant draws on a pool, so its keys
// live in one slot of their own, apart from every tenant's shard; a step reserves
// from its tenant and from its pool in two calls.
func (k Keys) poolTag(pool string) string { return k.prefix + "{p:" + pool + "}" }

// PoolState is the HASH of a model pool's bucket: level in tokens (l), requests level
// (r), time in ms (t), effective rate in tokens a minute (e), time of the last
// decrease (d) and of the last throttled answer (x), virtual time (v), and the use of
// the last minute in 5-second slots (u0…u11, each "slot:tokens").
func (k Keys) PoolState(pool string) string { return k.poolTag(pool) + ":pool" }

// PoolPasses is the HASH of the tenants' fair-share positions in a pool: p:<tenant>
// is the tenant's pass (tokens granted ÷ weight, in the pool's virtual time) and
// w:<tenant> its weight. It expires with the pool's idleness.
func (k Keys) PoolPasses(pool string) string { return k.poolTag(pool) + ":passes" }

// PoolWaiters is the ZSET of the tenants waiting on a pool, scored by pass: the
// smallest is next in line.
func (k Keys) PoolWaiters(pool string) string { return k.poolTag(pool) + ":waiters" }

// PoolClaims is the ZSET of the same tenants scored by the time (ms) their place in
// line lapses: a tenant that does not come back by then (its tasks were cancelled)
// stops holding the others up.
func (k Keys) PoolClaims(pool string) string { return k.poolTag(pool) + ":claims" }
