package maintenance

import (
	"context"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/rivershared/startstop"
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"

	"github.com/agentq/agentq/internal/rkeys"
)

// ElectorConfig configures the leader elector. Zero fields take the defaults.
type ElectorConfig struct {
	// Interval is how often a standby tries to take the lock and the leader checks
	// that its lock connection still lives (1 s).
	Interval time.Duration
}

func (c ElectorConfig) withDefaults() ElectorConfig {
	c.Interval = orDefault(c.Interval, time.Second)
	return c
}

// ElectorTestSignals are signalled as leadership changes (initialised only in tests).
type ElectorTestSignals struct {
	Elected  testsignal.TestSignal[struct{}] // this elector took the lock
	Resigned testsignal.TestSignal[struct{}] // it gave the lock up, or lost it with its connection
}

// Init makes the signals waitable.
func (ts *ElectorTestSignals) Init(tb testutil.TestingTB) {
	ts.Elected.Init(tb)
	ts.Resigned.Init(tb)
}

// Elector elects the janitor's leader: the one replica holding a Postgres advisory
// lock. It is a session lock, held on a connection of its own, so it goes the moment
// the holder's connection dies (a crash, a Postgres restart) and a standby takes it at
// its next try. Stop unlocks.
type Elector struct {
	startstop.BaseStartStop

	TestSignals ElectorTestSignals

	pool *pgxpool.Pool
	keys rkeys.Keys
	log  *slog.Logger
	cfg  ElectorConfig

	mu      sync.Mutex
	conn    *pgxpool.Conn // holds the lock while this process leads
	lockID  int64
	since   time.Time     // when the lock was taken; zero while not leading
	changed chan struct{} // closed at the next change of leadership
}

// NewElector returns a stopped elector over d.Pool; the lock is named after the
// schema and the Redis prefix, so deployments sharing a Postgres elect apart.
func NewElector(d Deps, c ElectorConfig) *Elector {
	return &Elector{
		pool: d.Pool, keys: d.Keys, log: d.logger().With("component", "janitor"),
		cfg: c.withDefaults(), changed: make(chan struct{}),
	}
}

// Leader reports whether this process holds the lock.
func (e *Elector) Leader() bool {
	since, _ := e.Watch()
	return !since.IsZero()
}

// Watch returns when this process took the lead (zero while it does not lead) and a
// channel closed at the next change.
func (e *Elector) Watch() (since time.Time, changed <-chan struct{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.since, e.changed
}

// Start tries to take the lock now and then every Interval, and keeps it, until Stop.
func (e *Elector) Start(ctx context.Context) error {
	ctx, shouldStart, started, stopped := e.StartInit(ctx)
	if !shouldStart {
		return nil
	}
	go func() {
		started()
		defer stopped()
		defer e.resign()
		t := time.NewTicker(e.cfg.Interval)
		defer t.Stop()
		for {
			e.attempt(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return nil
}

// attempt keeps or takes the lock. If the lock's connection broke, leadership is gone
// with it (Postgres freed the lock) and is competed for again at once.
func (e *Elector) attempt(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if conn := e.holder(); conn != nil {
		if _, err := conn.Exec(cctx, `SELECT 1`); err == nil {
			return
		}
		if ctx.Err() != nil {
			return // stopping: resign unlocks
		}
		conn.Conn().Close(context.Background())
		conn.Release()
		e.set(nil)
		e.log.Warn("janitor lost its lock connection; leadership given up")
		e.TestSignals.Resigned.Signal(struct{}{})
	}
	key, err := e.lockKey(cctx)
	if err != nil {
		return // the next try asks again
	}
	conn, err := e.pool.Acquire(cctx)
	if err != nil {
		return
	}
	var ok bool
	if err := conn.QueryRow(cctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&ok); err != nil || !ok {
		conn.Release()
		return
	}
	e.set(conn)
	e.log.Info("janitor leadership taken")
	e.TestSignals.Elected.Signal(struct{}{})
}

// resign unlocks and hands the connection back.
func (e *Elector) resign() {
	conn := e.holder()
	if conn == nil {
		return
	}
	e.set(nil) // passes stop before the lock goes
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, e.lockID); err != nil {
		// The session keeps the lock: end it, which frees the lock too.
		conn.Conn().Close(context.Background())
	}
	conn.Release()
	e.TestSignals.Resigned.Signal(struct{}{})
}

func (e *Elector) holder() *pgxpool.Conn {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.conn
}

// set records a change of leadership: conn holds the lock, or nil when none does.
func (e *Elector) set(conn *pgxpool.Conn) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.conn = conn
	if conn != nil {
		e.since = time.Now()
	} else {
		e.since = time.Time{}
	}
	close(e.changed)
	e.changed = make(chan struct{})
}

func (e *Elector) lockKey(ctx context.Context) (int64, error) {
	e.mu.Lock()
	id := e.lockID
	e.mu.Unlock()
	if id != 0 {
		return id, nil
	}
	var schema string
	if err := e.pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return 0, err
	}
	h := fnv.New64a()
	h.Write([]byte("agentq-janitor:" + schema + ":" + e.keys.Prefix()))
	id = int64(h.Sum64() >> 1)
	e.mu.Lock()
	e.lockID = id
	e.mu.Unlock()
	return id, nil
}
