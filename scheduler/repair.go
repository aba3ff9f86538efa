package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/rkeys"
)

// Queued names a task Postgres holds as queued.
type Queued struct {
	TenantID string
	TaskID   uuid.UUID
}

// Missing returns the tasks of qs that Redis knows nothing of: in neither their
// tenant's queue, nor its dispatched set, nor the parked set. Those were lost (Redis restarted without
// persistence, or the push after the Postgres write failed) and must be pushed again.
func (s *Scheduler) Missing(ctx context.Context, qs []Queued) ([]Queued, error) {
	pipe := s.rdb.Pipeline()
	scores := make([]*redis.FloatCmd, len(qs))
	parked := make([]*redis.FloatCmd, len(qs))
	members := make([]*redis.BoolCmd, len(qs))
	for i, q := range qs {
		scores[i] = pipe.ZScore(ctx, s.keys.TenantQueue(q.TenantID), q.TaskID.String())
		parked[i] = pipe.ZScore(ctx, s.keys.Parked(s.keys.Shard(q.TenantID)), rkeys.ParkedMember(q.TenantID, q.TaskID.String()))
		members[i] = pipe.SIsMember(ctx, s.keys.TenantRunning(q.TenantID), q.TaskID.String())
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("scheduler: missing: %w", err)
	}
	var out []Queued
	for i, q := range qs {
		if errors.Is(scores[i].Err(), redis.Nil) && errors.Is(parked[i].Err(), redis.Nil) && !members[i].Val() {
			out = append(out, q)
		}
	}
	return out, nil
}

// generationTTL keeps the generation marker alive between janitor leaders' checks
// (every second), however long a Redis runs.
const generationTTL = 30 * 24 * time.Hour

// MarkGeneration sets this Redis's generation markers, the global one and each
// shard's, where they are missing, and renews their ttl. It reports whether any was
// missing: the Redis (or, on a cluster, a node) lost its data (FLUSHDB, a restart
// without persistence, a failover to a replica that lagged), or never had it.
func (s *Scheduler) MarkGeneration(ctx context.Context) (bool, error) {
	now := time.Now().UTC().Format(time.RFC3339)
	markers := make([]string, 0, 1+s.keys.Shards())
	markers = append(markers, s.keys.Generation())
	for shard := range s.keys.Shards() {
		markers = append(markers, s.keys.ShardGeneration(shard))
	}
	// One key per command, so on a cluster each goes to its own node.
	pipe := s.rdb.Pipeline()
	sets := make([]*redis.BoolCmd, len(markers))
	for i, m := range markers {
		sets[i] = pipe.SetNX(ctx, m, now, generationTTL)
		pipe.Expire(ctx, m, generationTTL)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return false, fmt.Errorf("scheduler: generation marker: %w", err)
	}
	missing := false
	for _, c := range sets {
		missing = missing || c.Val()
	}
	return missing, nil
}

// AddRunning re-adds a running task that Redis lost to its tenant's running set, so
// the tenant's cap counts it.
func (s *Scheduler) AddRunning(ctx context.Context, tenantID, taskID string) error {
	pipe := s.rdb.TxPipeline()
	pipe.SAdd(ctx, s.keys.TenantRunning(tenantID), taskID)
	pipe.Expire(ctx, s.keys.TenantRunning(tenantID), queueTTL)
	_, err := pipe.Exec(ctx)
	return err
}

// Stranded reports whether a dispatched task that has not started is lost to asynq:
// confirmed in flight for longer than minAge while asynq holds no live message for it,
// in the task queue or in the queue of its priority band that an earlier version sent
// it to (gone with a Redis data loss, or archived after its retries). A stranded task's
// leftover message is deleted, so the task can be sent again.
func (s *Scheduler) Stranded(ctx context.Context, insp *asynq.Inspector, tenantID, taskID string, priority int, minAge time.Duration) (bool, error) {
	score, err := s.rdb.ZScore(ctx, s.keys.Inflight(s.keys.Shard(tenantID)), taskID).Result()
	if errors.Is(err, redis.Nil) {
		return false, nil // not confirmed yet: the dispatcher re-sends it
	}
	if err != nil {
		return false, err
	}
	now, err := s.clockMs(ctx)
	if err != nil {
		return false, err
	}
	if now-int64(score) < minAge.Milliseconds() {
		return false, nil
	}
	gen, err := s.rdb.HGet(ctx, s.keys.TenantConf(tenantID), "g:"+taskID).Int()
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, err
	}
	id := rkeys.AsynqTaskID(taskID, gen)
	// The task queue, and the queue of its priority band an earlier version may have
	// sent it to.
	queues := []string{s.keys.TaskQueue()}
	if q := legacyQueue(s.keys, priority); q != queues[0] {
		queues = append(queues, q)
	}
	for _, queue := range queues {
		info, err := insp.GetTaskInfo(queue, id)
		switch {
		case errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound):
		case err != nil:
			return false, err
		case info.State == asynq.TaskStateArchived || info.State == asynq.TaskStateCompleted:
			if err := insp.DeleteTask(queue, id); err != nil {
				return false, err
			}
		default:
			return false, nil // live: a worker takes it
		}
	}
	return true, nil
}
