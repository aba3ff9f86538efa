package admission

import (
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/quotas/internal/script"
)

// Store is the limit store in Redis as one process uses it: its parts, each with one
// job, share one connection, one clock and one usage source (the ledger lost
// counters are rebuilt from). A caller that needs several parts (the worker, the
// janitor's lease pass) holds the Store, whose parts' methods it has; one that needs
// one job holds that part.
type Store struct {
	*Admitter        // checks and takes a request's limits (Admit)
	*Steps           // reserves and settles a step's period quotas
	*TaskLeases      // the tasks' concurrent_sessions and long_running_inflight leases
	*RequestLeases   // the requests' inflight_requests leases
	*Seeder          // rebuilds lost period counters from the ledger
	*Recounter       // corrects the period counters against the ledger
	*RejectionCounts // the refusals admission counted, for the flush to Postgres

	conn
}

// conn is what every part of the Store runs on: the Redis, its keys and the clock its
// scripts decide by.
type conn struct {
	rdb   redis.UniversalClient
	keys  rkeys.Keys
	clock script.Clock
}

func (c *conn) nowArg() string { return c.clock.Arg() }

// now is the clock the scripts use, read in Go: the test clock, or this host's.
func (c *conn) now() time.Time { return c.clock.Now() }

// Options configure how a Store shares its calls to Redis with other callers. The
// zero value sends every call alone.
type Options struct {
	// Coalesce sends the admissions of one shard that arrive while a script call of
	// that shard is out together in the next one (batcher.go), each call bounded by
	// CoalesceTimeout (0: 5 s) rather than by its callers' deadlines. The App sets it
	// where the API runs, whose admissions come in concurrently.
	Coalesce        bool
	CoalesceTimeout time.Duration
	// Batch carries step reservations (ReserveStep) in shared pipelines. The App gives
	// the Batch the worker and the scheduler use, so that a task's "running" message,
	// attached with redisx.Along, goes in the round trip of its first reservation.
	Batch *redisx.Batch
}

// New returns a Store on rdb. nowMs, when not nil, replaces Redis TIME (tests). At
// most one Options may be given.
func New(rdb redis.UniversalClient, keys rkeys.Keys, nowMs func() int64, opts ...Options) *Store {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	c := conn{rdb: rdb, keys: keys, clock: script.Clock{NowMs: nowMs}}
	seeder := &Seeder{conn: c}
	return &Store{
		Admitter:        newAdmitter(c, seeder, o),
		Steps:           &Steps{conn: c, seeder: seeder, batch: o.Batch},
		TaskLeases:      &TaskLeases{conn: c},
		RequestLeases:   &RequestLeases{conn: c},
		Seeder:          seeder,
		Recounter:       &Recounter{conn: c},
		RejectionCounts: &RejectionCounts{conn: c},
		conn:            c,
	}
}

// Keys returns the key builder.
func (s *Store) Keys() rkeys.Keys { return s.keys }

// PendingTTL bounds how long an admitted task counts against queue_backlog before it
// is in its queue: the scheduler's enqueue clears its mark; a process that dies
// in between frees the count within PendingTTL.
const PendingTTL = time.Minute

// stateTTL bounds the life of an idle tenant's admission state: past a billing period,
// so monthly counters survive until the period ends.
const stateTTL = 35 * 24 * time.Hour

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func str(v any) string { s, _ := v.(string); return s }
