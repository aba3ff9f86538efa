package scheduler

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/wire"
)

// A dispatch round's tasks are written into asynq's queue in one round trip shared with
// the other calls of the moment (the Scheduler's Batch), instead of one round trip
// each through asynq's client, which has no pipeline. They are written as asynq's
// client writes them: the same message (asynqMessage) under the same keys, by the
// same script (asynqEnqueueScript), so asynq's servers and inspector read them as
// their own. The tests compare both writes byte for byte.

// The options every dispatched task goes to asynq with (NewAsynqTask gives asynq's
// client the same).
const (
	// asynqMaxRetry: retries are for infrastructure errors and for redeliveries after
	// a worker died (each counts as one); business outcomes end the task in Postgres.
	asynqMaxRetry = 10
	// asynqTimeout: agentq enforces each task's own wallclock budget; asynq's timeout
	// is a backstop.
	asynqTimeout = 2 * time.Hour
)

// asynqMessage encodes a task as asynq's TaskMessage (protocol buffers, asynq's
// internal/proto/asynq.proto): type (1), payload (2), id (3), queue (4), retry (5) and
// timeout in seconds (8), in field order as asynq's encoder writes them; every other
// field is left at its zero value, which the encoding omits (no deadline, no retention,
// no headers).
func asynqMessage(typ string, payload []byte, id, queue string, retry int, timeout time.Duration) []byte {
	b := make([]byte, 0, len(typ)+len(payload)+len(id)+len(queue)+24)
	str := func(field uint64, s []byte) {
		b = binary.AppendUvarint(b, field<<3|2) // length-delimited
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	num := func(field uint64, v uint64) {
		if v != 0 {
			b = binary.AppendUvarint(b, field<<3) // varint
			b = binary.AppendUvarint(b, v)
		}
	}
	str(1, []byte(typ))
	if len(payload) > 0 {
		str(2, payload)
	}
	str(3, []byte(id))
	str(4, []byte(queue))
	num(5, uint64(retry))
	num(8, uint64(timeout/time.Second))
	return b
}

// asynqEnqueueScript is asynq's own enqueue script (internal/rdb's enqueueCmd): it
// adds the task's message to the queue's pending list unless a task of that id exists.
// One addition: with ARGV[4] "1" the id goes to the list's head (asynq's workers pop
// from the right end) instead of its tail (Dispatched.Ahead).
//
// KEYS[1] asynq:{<queue>}:t:<id>   KEYS[2] asynq:{<queue>}:pending
// ARGV[1] message   ARGV[2] id   ARGV[3] now, unix ns   ARGV[4] "1" for the head
// Returns 1 if enqueued, 0 if a task of that id exists.
var asynqEnqueueScript = redisx.NewScript(`
if redis.call("EXISTS", KEYS[1]) == 1 then
	return 0
end
redis.call("HSET", KEYS[1],
           "msg", ARGV[1],
           "state", "pending",
           "pending_since", ARGV[3])
if ARGV[4] == "1" then
	redis.call("RPUSH", KEYS[2], ARGV[2])
else
	redis.call("LPUSH", KEYS[2], ARGV[2])
end
return 1
`)

// asynqAllQueues is asynq's set of queue names, which its tools list queues from.
const asynqAllQueues = "asynq:queues"

// errAsynqConflict says asynq holds a task of the same id.
var errAsynqConflict = fmt.Errorf("scheduler: %w", asynq.ErrTaskIDConflict)

// asynqWriter writes dispatched tasks into the task queue through the Batch.
type asynqWriter struct {
	s *Scheduler
	// listed is set once the task queue is in asynq's set of queue names.
	listed atomic.Bool
}

// enqueue writes jobs into the task queue in one round trip; errs[i] is job i's
// outcome (errAsynqConflict when asynq holds its id).
func (w *asynqWriter) enqueue(ctx context.Context, jobs []Dispatched) []error {
	queue := w.s.keys.TaskQueue()
	prefix := "asynq:{" + queue + "}:"
	now := time.Now().UnixNano()
	cmds := make([]*redis.Cmd, len(jobs))
	errs := make([]error, len(jobs))
	msgs := make([][]byte, len(jobs))
	for i, d := range jobs {
		body, err := json.Marshal(d.payload())
		if err != nil {
			errs[i] = err
			continue
		}
		msgs[i] = asynqMessage(wire.TaskType, body, d.asynqID(), queue, asynqMaxRetry, asynqTimeout)
	}
	listed := w.listed.Load()
	var sadd *redis.IntCmd
	err := w.s.batch.Do(ctx, func(pipe redis.Pipeliner) {
		if !listed {
			sadd = pipe.SAdd(ctx, asynqAllQueues, queue)
		}
		for i, d := range jobs {
			if msgs[i] != nil {
				id := d.asynqID()
				head := "0"
				if d.Ahead {
					head = "1"
				}
				cmds[i] = asynqEnqueueScript.Run(ctx, pipe, []string{prefix + "t:" + id, prefix + "pending"}, msgs[i], id, now, head)
			}
		}
	})
	if sadd != nil && sadd.Err() == nil {
		w.listed.Store(true)
	}
	for i, c := range cmds {
		if c == nil {
			continue
		}
		n, cerr := c.Int()
		switch {
		case cerr != nil:
			errs[i] = cmpErr(cerr, err)
		case n == 0:
			errs[i] = errAsynqConflict
		}
	}
	return errs
}

// cmpErr is err, or else fallback.
func cmpErr(err, fallback error) error {
	if err == nil {
		return fallback
	}
	return err
}

// isConflict says err is asynq's refusal of a duplicate task id, from its client or
// from asynqWriter.
func isConflict(err error) bool { return errors.Is(err, asynq.ErrTaskIDConflict) }
